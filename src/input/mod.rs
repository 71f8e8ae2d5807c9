//! What operators and requesters say: the configuration, and requests from every source.

pub mod config;
pub mod request;
