//! A container's request to what it is given: the runtime spec, GPUs it brought, the driver's files, the edits and their consumers, the pipeline.

pub mod admit;
pub mod before_create;
pub mod driver;
pub mod edits;
pub mod entry;
pub mod foreign;
pub mod grant;
pub mod spec;
pub mod trusted_user;
