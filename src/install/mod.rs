//! Registering gpupin with container engines: `gpupin install docker`.
//!
//! The JSON edits are pure functions (docker.rs); reading, backing up and rewriting the
//! file (file.rs) and asking dockerd to reload (reload.rs) are kept apart so the CLI
//! can show a dry run without touching anything.

pub mod docker;
pub mod file;
pub mod reload;
