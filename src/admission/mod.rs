//! A container's request to what it is given: the runtime spec, GPUs it brought, the driver's files, the edits and their consumers, the pipeline.

pub(crate) mod admit;
pub(crate) mod before_create;
pub(crate) mod driver;
pub(crate) mod edits;
pub(crate) mod entry;
pub(crate) mod foreign;
pub(crate) mod grant;
pub(crate) mod memory_limit;
pub(crate) mod spec;
pub(crate) mod trusted_user;
