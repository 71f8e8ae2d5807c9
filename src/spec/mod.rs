//! Edits on an OCI runtime spec (config.json) held as `serde_json::Value`, so that no key
//! the runtime or Docker put there is ever lost; typed reads go through small views.

use serde_json::Value;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("todo")]
    Todo,
}

impl SpecError {
    pub fn from_io(_path: &Path, _e: std::io::Error) -> SpecError {
        todo!()
    }
}

/// Parses config.json bytes already read; `path` names the file in errors.
pub fn parse(_bytes: &[u8], _path: &Path) -> Result<Value, SpecError> {
    todo!()
}

/// Reads a bundle's config.json.
pub fn read(_path: &Path) -> Result<Value, SpecError> {
    todo!()
}

/// Writes `spec` to `path` atomically (temp file in the same dir, fsync, rename).
pub fn write_atomic(_path: &Path, _spec: &Value) -> Result<(), SpecError> {
    todo!()
}

/// `process.env` as a list of `KEY=VALUE` strings (empty when absent).
pub fn process_env(_spec: &Value) -> Vec<String> {
    todo!()
}

/// Sets `key=value` in `process.env`, replacing every earlier occurrence in place (the
/// last occurrence wins for the NVIDIA hook, so a duplicate must never be appended).
pub fn set_env(_spec: &mut Value, _key: &str, _value: &str) -> Result<(), SpecError> {
    todo!()
}

/// The host path of the container's root filesystem: `root.path`, relative to `bundle`
/// when not absolute.
pub fn rootfs_path(_spec: &Value, _bundle: &Path) -> Result<PathBuf, SpecError> {
    todo!()
}
