//! `gpupin.cpus=numa`: the CPUs and memory nodes local to a container's GPUs.

use super::{Cpuset, EditsError};
use crate::host::inventory::cpulist;
use crate::model::gpu::Inventory;
use std::path::Path;

pub(super) const NODE_ROOT: &str = "/sys/devices/system/node";

/// The CPUs local to the GPUs, and their NUMA nodes among those this host has: a
/// simulated machine may name node 1 on a one-node host, and a cpuset with a memory node
/// that does not exist would fail the container's start.
pub(super) fn numa(
    inventory: &Inventory,
    uuids: &[String],
    node_root: &Path,
) -> Result<Cpuset, EditsError> {
    let mut cpus = Vec::new();
    let mut nodes = Vec::new();
    for gpu in uuids
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
    {
        let no_cpus = || EditsError::NoLocalCpus {
            index: gpu.index,
            uuid: gpu.uuid.clone(),
        };
        let local = gpu
            .local_cpus
            .as_deref()
            .and_then(cpulist::parse)
            .ok_or_else(no_cpus)?;
        if local.is_empty() {
            return Err(no_cpus());
        }
        cpus.extend(local);
        if let Some(node) = gpu.numa_node
            && node_root.join(format!("node{node}")).is_dir()
        {
            nodes.push(node);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    nodes.sort_unstable();
    nodes.dedup();
    let mems = (!nodes.is_empty()).then(|| cpulist::format(&nodes));
    Ok(Cpuset {
        cpus: cpulist::format(&cpus),
        mems,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    #[test]
    fn numa_cpuset_joins_local_cpus_and_keeps_only_host_nodes() {
        let mut inv = machine(3);
        for (i, gpu) in inv.gpus.iter_mut().enumerate() {
            gpu.numa_node = Some(i as u32);
            gpu.local_cpus = Some(["0-3", "4-7", "8"][i].to_string());
        }
        let nodes = tempfile::tempdir().unwrap();
        std::fs::create_dir(nodes.path().join("node0")).unwrap();
        let uuids = vec!["GPU-test-0".to_string(), "GPU-test-1".to_string()];
        let set = numa(&inv, &uuids, nodes.path()).unwrap();
        assert_eq!((set.cpus.as_str(), set.mems.as_deref()), ("0-7", Some("0")));
        let none = numa(&inv, &["GPU-test-2".to_string()], nodes.path()).unwrap();
        assert_eq!((none.cpus.as_str(), none.mems), ("8", None));
    }

    #[test]
    fn numa_cpuset_needs_local_cpus() {
        let inv = machine(1);
        let err = numa(&inv, &["GPU-test-0".into()], Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no local CPUs for GPU 0"), "{err}");
    }
}
