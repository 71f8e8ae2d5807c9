//! The injector: gives a container that runc has already created its GPUs from outside,
//! on the prestart path (plain runc, CRI-O): nodes in its mount namespace, access in its
//! device cgroup, and the env written into its bundle's config.json for the hooks that
//! run after gpupin (NVIDIA's reads NVIDIA_VISIBLE_DEVICES from there).

use super::{ApplyError, ContainerEdits};
use crate::inject;
use crate::spec;
use serde_json::Value;
use std::path::Path;

/// The created container the edits go into.
pub struct Target<'a> {
    /// Its init process, not yet started: its mount namespace and device cgroup.
    pub pid: i32,
    /// Its root on the host, before pivot_root.
    pub rootfs: &'a Path,
    /// Its bundle's config.json, parsed, and where it lives.
    pub spec: &'a mut Value,
    pub spec_path: &'a Path,
}

/// Applies what can still be applied to a created container. Annotations and hooks are
/// for a spec the runtime has not read yet, and have none here; a cpuset needs the spec
/// edited before create, and the prestart entry point refuses such a request first.
pub fn apply(edits: &ContainerEdits, target: Target<'_>) -> Result<(), ApplyError> {
    if edits.cpuset.is_some() {
        return Err(ApplyError::NeedsCreate("a cpuset"));
    }
    inject::create_nodes_in_container(target.pid, target.rootfs, &edits.nodes)?;
    inject::allow_in_device_cgroup(target.pid, &edits.nodes)?;
    for (key, value) in &edits.env {
        spec::set_env(target.spec, key, value)?;
    }
    spec::write_atomic(target.spec_path, target.spec)?;
    Ok(())
}
