//! Edits on an OCI runtime spec (config.json) held as `serde_json::Value`, so that no key
//! the runtime or Docker put there is ever lost; typed reads go through small views.

mod edit;
mod env;
mod io;
mod mount;
mod view;

pub(crate) use edit::{
    add_additional_gids, add_devices, add_hook, add_hook_entry, remove_hooks, set_annotation,
    set_cpuset_unless_set,
};
pub use env::process_env;
pub(crate) use env::set_env;
pub use io::parse;
pub(crate) use io::{read, write_atomic};
pub(crate) use mount::add_mounts;
pub(crate) use view::{annotations, rootfs_path};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("reading spec {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing spec {path}")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("serializing spec for {path}")]
    Serialize {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("writing spec {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A spec field exists but holds the wrong JSON type; editing it would lose data.
    #[error("spec field {field} is {found}, expected {expected}")]
    WrongType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("spec has no {field}")]
    Missing { field: &'static str },
    #[error("invalid environment variable name {key:?}")]
    InvalidEnvKey { key: String },
}

/// The JSON type name of `value`, for error messages.
fn type_name(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
