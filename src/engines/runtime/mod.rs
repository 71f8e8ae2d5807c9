//! `gpupin-runtime`: a drop-in for runc that Docker and compose can name as a runtime.
//! On `create` it edits the bundle's spec (devices, cgroup rules, env, hooks) and then
//! runs the real runtime; every other command passes through unchanged.

pub(crate) mod argv;
pub(crate) mod create;
mod shim;

pub use shim::{Handover, run, run_without_config};

use crate::admission::entry::EntryError;
use crate::admission::spec::SpecError;
use crate::engines::docker::DockerError;
use crate::input::config::Config;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error(transparent)]
    Argv(#[from] argv::ArgvError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// A step every entry point takes (the config, the request, the ledger, ...).
    #[error(transparent)]
    Entry(#[from] EntryError),
    #[error(transparent)]
    Docker(#[from] DockerError),
    #[error("running the runtime {path}")]
    RunRuntime {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A create failed, and so did releasing its GPUs again: both are kept.
    #[error(
        "{}; releasing its GPUs again failed too: {}",
        crate::base::message::one_line(.error.as_ref()),
        crate::base::message::one_line(.undo.as_ref())
    )]
    Undo {
        error: Box<ShimError>,
        undo: Box<ShimError>,
    },
    #[error("runtime {0:?} not found on PATH; set `runtime` in the gpupin config")]
    RuntimeNotFound(PathBuf),
    #[error("runtime {0} is gpupin-runtime itself; set `runtime` to the real runtime (runc)")]
    RuntimeIsSelf(PathBuf),
}

crate::admission::entry::wrap_entry_errors!(ShimError);

/// The real runtime's path: `runtime` from the config, searched on PATH when it is a
/// bare name, and never this binary (which would recurse).
pub(crate) fn real_runtime(config: &Config, own_exe: &Path) -> Result<PathBuf, ShimError> {
    let name = &config.runtime;
    let path = if name.components().count() > 1 {
        name.clone()
    } else {
        search_path(name).ok_or_else(|| ShimError::RuntimeNotFound(name.clone()))?
    };
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same(&path, own_exe) {
        return Err(ShimError::RuntimeIsSelf(path));
    }
    Ok(path)
}

fn search_path(name: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Loads gpupin's config for the shim: `--gpupin-config`, else the usual discovery.
pub fn load_config(flag: Option<&Path>) -> Result<Config, ShimError> {
    Ok(Config::discover(flag)?)
}
