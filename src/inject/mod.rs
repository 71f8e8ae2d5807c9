//! The prestart-only path: give a running-but-not-started container its GPUs from the
//! outside, by creating device nodes inside its mount namespace and granting access in its
//! device cgroup. Used by `gpupin hook prestart|createRuntime` under plain runc, where the
//! spec can no longer be edited.

use crate::inventory::DeviceNode;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("todo")]
    Todo,
}

/// Creates `nodes` under the container's /dev, inside the mount namespace of `pid`, with
/// `rootfs` the host path of the container's root (before pivot_root). Never follows a
/// symlink: a /dev or node path that is a symlink is an error.
pub fn create_nodes_in_container(
    _pid: i32,
    _rootfs: &Path,
    _nodes: &[DeviceNode],
) -> Result<(), InjectError> {
    todo!()
}

/// Grants read/write/mknod access to `nodes` in the device cgroup of `pid`
/// (cgroup v1; on a v2-only host this fails closed).
pub fn allow_in_device_cgroup(_pid: i32, _nodes: &[DeviceNode]) -> Result<(), InjectError> {
    todo!()
}

#[allow(dead_code)]
fn _unused(_: PathBuf) {}
