//! A container's request to what it is given: the runtime spec, GPUs it brought, the driver's files, the edits and their consumers, the pipeline.

pub mod admit;
pub(crate) mod before_create;
pub mod driver;
pub mod edits;
pub mod entry;
pub(crate) mod foreign;
pub mod grant;
pub mod spec;
pub(crate) mod trusted_user;
