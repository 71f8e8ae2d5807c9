//! Real containers for `gpupin demo`, the tests and the benches: a busybox root
//! filesystem, a runc bundle whose hooks call gpupin, and runc driven with a private
//! `--root` so that concurrent users (parallel tests, a demo next to real containers)
//! never see each other's containers. With the `harness` feature, `harness` holds what
//! the test suites share (requirement checks, status queries, ledger snapshots, fake
//! containers).
//!
//! Not part of gpupin's library, and never shipped in it: the demo takes it behind the
//! gpupin package's `demo` feature, tests and benches as a dev-dependency. It knows
//! gpupin only as a binary to run. Outside `harness` it never prints; callers decide
//! what to show.

mod bundle;
pub mod driver;
pub mod engines;
#[cfg(feature = "harness")]
pub mod harness;
mod requirements;
mod rootfs;
mod runc;

pub use bundle::{BundleSpec, HookCommand, write_bundle};
pub use requirements::{Requirements, find_on_path, is_root};
pub use rootfs::{APPLETS, build_busybox_rootfs, find_static_busybox, is_static_elf};
pub use runc::{Container, ContainerState, Runc, hook_message};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// runc said no; `stderr` holds its message, which for a failed hook includes the
    /// hook's own stderr.
    #[error("runc {command} failed ({status}): {stderr}")]
    Runc {
        command: String,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("unexpected output from runc {command}: {reason}")]
    RuncOutput { command: String, reason: String },
}

impl SandboxError {
    fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| SandboxError::Io {
            action,
            path,
            source,
        }
    }
}
