//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! Data flows one way, through `admit` for every entry point: a request is found
//! (`request::find`), the inventory says which GPUs exist, the ledger allocates under its
//! lock with a policy, `edits` describes what the container must get and one consumer
//! gives it (the spec writer before create, the injector at prestart).
//! docs/ARCHITECTURE.md draws the whole path. Nothing in this library prints or exits;
//! the binaries do.

pub mod admission;
pub mod base;
pub mod doctor;
pub mod engines;
pub mod host;
pub mod input;
pub mod jobs;
pub mod model;
pub mod policy;
pub mod report;
pub mod state;
