//! The injector: gives a container that runc has already created its GPUs from outside,
//! on the prestart path (plain runc, CRI-O): nodes in its mount namespace, access in its
//! device cgroup, and the env written into its bundle's config.json for the hooks that
//! run after gpupin (NVIDIA's reads NVIDIA_VISIBLE_DEVICES from there).

use super::{ApplyError, ContainerEdits};
use crate::admission::foreign;
use crate::admission::spec;
use crate::host::container_devices;
use serde_json::Value;
use std::path::Path;

/// The created container the edits go into.
pub(crate) struct Target<'a> {
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
/// edited before create, and the prestart entry point refuses such a request first. A
/// GPU node of another GPU in the spec is refused ([`crate::admission::foreign::strip_created`]).
pub(crate) fn apply(edits: &ContainerEdits, target: Target<'_>) -> Result<(), ApplyError> {
    if edits.cpuset.is_some() {
        return Err(ApplyError::NeedsCreate("a cpuset"));
    }
    // Before anything is made: a GPU the container got around gpupin cannot be unmade.
    foreign::strip_created(target.spec, &edits.withheld)?;
    container_devices::create_nodes_in_container(target.pid, target.rootfs, &edits.nodes)?;
    container_devices::allow_in_device_cgroup(target.pid, &edits.nodes)?;
    for (key, value) in &edits.env {
        spec::set_env(target.spec, key, value)?;
    }
    spec::write_atomic(target.spec_path, target.spec)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gpu::DeviceNode;
    use serde_json::json;

    #[test]
    fn a_gpu_the_container_got_around_gpupin_is_refused_before_anything_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        let spec_path = tmp.path().join("config.json");
        let mut spec = json!({"linux": {"devices": [
            {"path": "/dev/nvidia5", "type": "c", "major": 195, "minor": 5}
        ]}});
        let node = |minor: u32| DeviceNode {
            path: crate::model::nvidia::gpu_node(minor),
            major: 195,
            minor,
        };
        let edits = ContainerEdits {
            nodes: vec![node(2)],
            withheld: vec![node(5)],
            ..ContainerEdits::default()
        };
        let target = Target {
            // No such process: the refusal comes before gpupin looks at it.
            pid: i32::MAX,
            rootfs: tmp.path(),
            spec: &mut spec,
            spec_path: &spec_path,
        };
        let err = apply(&edits, target).unwrap_err();
        assert!(matches!(err, ApplyError::Foreign(_)), "{err}");
        assert!(!spec_path.exists());
    }
}
