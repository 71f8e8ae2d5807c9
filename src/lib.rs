//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! Data flows one way: a request (annotations, env) is read from the container, the
//! inventory says which GPUs exist, the ledger allocates under its lock with a policy,
//! and the spec / inject modules give the container exactly the chosen GPUs.
//! Nothing in this library prints or exits; the binaries do.

pub mod admit;
pub mod atomic;
pub mod config;
pub mod docker;
pub mod edits;
pub mod grant;
pub mod hook;
pub mod inject;
pub mod install;
pub mod inventory;
pub mod ledger;
pub mod message;
pub mod policy;
pub mod procinfo;
pub mod regular;
pub mod report;
pub mod request;
pub mod runtime;
pub mod spec;
pub mod units;
