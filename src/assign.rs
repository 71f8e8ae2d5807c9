//! Writing an assignment into a spec before the runtime reads it: the path shared by the
//! Docker shim and podman's precreate stage. The runtime then creates the nodes and grants
//! them in the device cgroup itself, and gpupin's own hooks bind and release the holder.

use crate::hook::VISIBLE_DEVICES;
use crate::inventory::{Inventory, cpulist};
use crate::ledger::{ClaimToken, Record};
use crate::request::{ASSIGNED_ANNOTATION, CLAIM_ANNOTATION, CpuBinding, WRITTEN_BY_GPUPIN};
use crate::spec::{self, SpecError};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum AssignError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("annotation {0} is written by gpupin, not by users; remove it from the container")]
    ReservedAnnotation(&'static str),
    #[error(
        "gpupin.cpus=numa: the inventory knows no local CPUs for GPU {index} ({uuid}); use an inventory that has them (nvml, procfs, or local_cpus in the file)"
    )]
    NoLocalCpus { index: u32, uuid: String },
}

/// Refuses a spec that arrives carrying an annotation gpupin writes: whoever set it is
/// not gpupin, and the annotation would be trusted later. Keys are checked in a fixed
/// order, so the same spec is always refused with the same message.
pub fn refuse_reserved(annotations: &HashMap<String, String>) -> Result<(), AssignError> {
    match WRITTEN_BY_GPUPIN
        .iter()
        .find(|key| annotations.contains_key(**key))
    {
        Some(key) => Err(AssignError::ReservedAnnotation(key)),
        None => Ok(()),
    }
}

/// How a runtime calls gpupin back as a hook.
#[derive(Debug, Clone)]
pub struct HookCommand {
    /// Absolute path of the `gpupin` binary.
    pub exe: PathBuf,
    /// The config gpupin was started with; hooks run with an empty environment, so it is
    /// passed on the command line.
    pub config: Option<PathBuf>,
}

impl HookCommand {
    pub fn args(&self, stage: &str) -> Vec<String> {
        let mut args = vec!["gpupin".to_string()];
        if let Some(config) = &self.config {
            args.push("--config".into());
            args.push(config.display().to_string());
        }
        args.extend(["hook".to_string(), stage.to_string()]);
        args
    }

    /// A prestart hook that refuses the container with `reason`, whatever its state says.
    pub fn refusal_args(&self, reason: &str) -> Vec<String> {
        let mut args = self.args("prestart");
        args.extend(["--refuse".to_string(), reason.to_string()]);
        args
    }
}

/// Puts the holder's GPUs into `spec`: devices and their cgroup rules, the env later
/// hooks read, the `gpupin.assigned` annotation with the claim `token` the record was
/// made with, a prestart hook that binds the holder to the container's pid and a poststop
/// hook that releases it. Idempotent.
pub fn edit_spec(
    spec: &mut Value,
    inventory: &Inventory,
    record: &Record,
    token: &ClaimToken,
    hook: &HookCommand,
) -> Result<(), AssignError> {
    let uuids = record.gpus.join(",");
    spec::add_devices(spec, &inventory.nodes_for(&record.gpus))?;
    spec::set_env(spec, VISIBLE_DEVICES, &uuids)?;
    spec::set_annotation(spec, ASSIGNED_ANNOTATION, &uuids)?;
    spec::set_annotation(spec, CLAIM_ANNOTATION, &token.annotation())?;
    let exe = hook.exe.display().to_string();
    spec::add_hook(spec, "prestart", &exe, &hook.args("prestart"))?;
    spec::add_hook(spec, "poststop", &exe, &hook.args("poststop"))?;
    if record.request.cpus == Some(CpuBinding::Numa) {
        let (cpus, mems) = numa_cpuset(inventory, &record.gpus, Path::new(NODE_ROOT))?;
        spec::set_cpuset_unless_set(spec, &cpus, mems.as_deref())?;
    }
    Ok(())
}

const NODE_ROOT: &str = "/sys/devices/system/node";

/// The CPUs local to the GPUs, and their NUMA nodes among those this host has: a
/// simulated machine may name node 1 on a one-node host, and a cpuset with a memory node
/// that does not exist would fail the container's start.
fn numa_cpuset(
    inventory: &Inventory,
    uuids: &[String],
    node_root: &Path,
) -> Result<(String, Option<String>), AssignError> {
    let mut cpus = Vec::new();
    let mut nodes = Vec::new();
    for gpu in uuids
        .iter()
        .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
    {
        let no_cpus = || AssignError::NoLocalCpus {
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
    Ok((cpulist::format(&cpus), mems))
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
        let (cpus, mems) = numa_cpuset(&inv, &uuids, nodes.path()).unwrap();
        assert_eq!(cpus, "0-7");
        assert_eq!(mems.as_deref(), Some("0"));
        let none = numa_cpuset(&inv, &["GPU-test-2".to_string()], nodes.path()).unwrap();
        assert_eq!(none, ("8".to_string(), None));
    }

    #[test]
    fn numa_cpuset_needs_local_cpus() {
        let inv = machine(1);
        let err = numa_cpuset(&inv, &["GPU-test-0".into()], Path::new("/nonexistent"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no local CPUs for GPU 0"), "{err}");
    }
}
