//! The three binaries gpupin installs side by side, and how each finds the others: by
//! file name in the directory of the one running (`cargo install`, a package and the
//! build tree all put them together).
//!
//! - `gpupin`: the CLI, and the one that loads NVML (dynamically linked);
//! - `gpupin-hook`: the OCI hook that runtimes start for every container, kept lean so
//!   that a container without a request pays little more than an exec (release builds
//!   link it statically: `scripts/build-release`);
//! - `gpupin-runtime`: the Docker shim in front of runc, as lean, for the same reason.

use std::path::{Path, PathBuf};

pub const CLI: &str = "gpupin";
pub const HOOK: &str = "gpupin-hook";
pub(crate) const RUNTIME: &str = "gpupin-runtime";

/// `name` in the directory of `exe`.
pub fn beside(exe: &Path, name: &str) -> PathBuf {
    exe.with_file_name(name)
}
