//! The container engines' ways in: the OCI hook, the runc shim, Docker's folder, which engine started a container, install files.

pub(crate) mod docker;
pub(crate) mod engine;
pub mod hook;
pub mod install;
pub(crate) mod podman;
pub mod runtime;
