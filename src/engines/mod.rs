//! The container engines' ways in: the OCI hook, the runc shim, Docker's folder, which engine started a container, install files.

pub(crate) mod docker;
pub(crate) mod engine;
pub(crate) mod hook;
pub(crate) mod install;
pub(crate) mod nri;
pub(crate) mod podman;
pub(crate) mod runtime;
