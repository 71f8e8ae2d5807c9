//! What operators and requesters say: the configuration, and requests from every source.

pub(crate) mod config;
pub(crate) mod request;
