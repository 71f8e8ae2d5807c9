//! gpupin: pins NVIDIA GPUs to containers on one shared machine.
//!
//! Data flows one way, through `admit` for every entry point: a request is found
//! (`request::find`), the inventory says which GPUs exist, the ledger allocates under its
//! lock with a policy, `edits` describes what the container must get and one consumer
//! gives it (the spec writer before create, the injector at prestart).
//! docs/ARCHITECTURE.md draws the whole path. Nothing in this library prints or exits;
//! the binaries do.

pub mod admit;
pub mod atomic;
pub mod audit;
pub mod binaries;
pub mod config;
pub mod confine;
pub mod docker;
pub mod doctor;
pub mod driver;
pub mod edits;
pub mod engine;
pub mod exec;
pub mod grant;
pub mod hold;
pub mod hook;
pub mod inject;
pub mod install;
pub mod inventory;
pub mod kube;
pub mod ledger;
pub mod limits;
pub mod log;
pub mod message;
pub mod metrics;
pub mod pod;
pub mod policy;
pub mod procinfo;
pub mod regular;
pub mod report;
pub mod request;
pub mod runtime;
pub mod serve;
pub mod slurm;
pub mod spec;
pub mod units;
pub mod users;
pub mod whose;
