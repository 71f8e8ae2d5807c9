//! What a container must get for the GPUs it holds, as data: device nodes (and with them
//! device-cgroup rules), env, annotations, hooks, a cpuset, and the driver's mounts and
//! groups. The admission pipeline builds it once from the ledger's record (and the
//! driver's CDI spec); one consumer per path applies it: `spec`
//! edits a runtime spec before create (the Docker shim, podman's precreate), `inject`
//! gives a container that runc has already created its GPUs from outside (prestart).

mod cpuset;
mod hook_command;
pub(crate) mod inject;
pub(crate) mod spec;

pub use hook_command::HookCommand;

use crate::input::request::{ASSIGNED_ANNOTATION, CLAIM_ANNOTATION, CpuBinding, WRITTEN_BY_GPUPIN};
use crate::model::gpu::{DeviceNode, Inventory};
use crate::model::nvidia::VISIBLE_DEVICES;
use crate::state::ledger::{ClaimToken, Record};
use std::collections::HashMap;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EditsError {
    #[error("annotation {0} is written by gpupin, not by users; remove it from the container")]
    ReservedAnnotation(&'static str),
    #[error(
        "gpupin.cpus=numa: the inventory knows no local CPUs for GPU {index} ({uuid}); use an inventory that has them (nvml, procfs, or local_cpus in the file)"
    )]
    NoLocalCpus { index: u32, uuid: String },
}

/// Why a consumer could not apply edits.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyError {
    #[error(transparent)]
    Spec(#[from] crate::admission::spec::SpecError),
    #[error(transparent)]
    Inject(#[from] crate::host::container_devices::InjectError),
    #[error("{0} can only be given by editing the spec before create")]
    NeedsCreate(&'static str),
    #[error(transparent)]
    Foreign(#[from] crate::admission::foreign::ForeignError),
}

/// One OCI hook entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hook {
    /// `prestart`, `createRuntime`, `createContainer`, `startContainer`, `poststart` or
    /// `poststop`.
    pub stage: &'static str,
    pub path: String,
    pub args: Vec<String>,
    /// `KEY=VALUE` entries; empty for gpupin's own hooks.
    pub env: Vec<String>,
    /// Seconds; `None` for no limit.
    pub timeout: Option<u32>,
}

/// One bind mount from the host into the container (a CDI spec's driver files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Absolute path in the container.
    pub destination: String,
    /// The host path.
    pub source: String,
    /// The OCI mount type; `None` leaves it out (a bind mount says so in its options).
    pub kind: Option<String>,
    pub options: Vec<String>,
}

/// The CPUs (and memory nodes) a container is pinned to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cpuset {
    pub cpus: String,
    pub mems: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerEdits {
    /// GPU nodes, then the control nodes every GPU container needs.
    pub nodes: Vec<DeviceNode>,
    pub env: Vec<(String, String)>,
    pub annotations: Vec<(String, String)>,
    pub hooks: Vec<Hook>,
    pub cpuset: Option<Cpuset>,
    /// Bind mounts (the driver's files, from a CDI spec).
    pub mounts: Vec<Mount>,
    /// Groups the container's process joins (a CDI spec's, for nodes such as
    /// /dev/dri/renderD* that only their group may open).
    pub additional_gids: Vec<u32>,
    /// The nodes of the machine's other GPUs: the spec writer takes them, and NVIDIA's
    /// requests for them, out of a spec that came with them (`admission::foreign::strip`).
    pub withheld: Vec<DeviceNode>,
    /// The driver comes from a CDI spec: NVIDIA's legacy prestart hook (added by Docker's
    /// `--gpus` or a hooks.d file) would inject the GPUs a second time, so the spec
    /// writer takes it out, as NVIDIA's runtime does in its cdi mode.
    pub driver_from_cdi: bool,
    /// The GPUs' CDI device names (`nvidia.com/gpu=...`), for a runtime that applies the
    /// driver's CDI spec itself (`admit::Claim::driver_by_name`: NRI on containerd 2.x);
    /// the spec writer and the injector have no use for them.
    pub cdi_devices: Vec<String>,
}

impl ContainerEdits {
    /// The GPUs of `record`: their nodes, `NVIDIA_VISIBLE_DEVICES` with their UUIDs, and
    /// the CPUs local to them when the request asked for `gpupin.cpus=numa`.
    pub fn for_record(inventory: &Inventory, record: &Record) -> Result<Self, EditsError> {
        let cpuset = match record.request.cpus {
            Some(CpuBinding::Numa) => Some(cpuset::numa(
                inventory,
                &record.gpus,
                Path::new(cpuset::NODE_ROOT),
            )?),
            None => None,
        };
        Ok(ContainerEdits {
            cpuset,
            ..ContainerEdits::gpus_of(inventory, record)
        })
    }

    /// The GPUs of `record` alone: their nodes and the control nodes, the other GPUs'
    /// nodes withheld, `NVIDIA_VISIBLE_DEVICES` with their UUIDs. Every holder's way to
    /// its GPUs is read from here (a container's edits, a pod's `Allocate` answer, a
    /// job's device rules), so that they cannot differ.
    pub fn gpus_of(inventory: &Inventory, record: &Record) -> Self {
        let nodes = inventory.nodes_for(&record.gpus);
        // Every other GPU's node, and every other MIG instance's capability nodes: the
        // node of a GPU whose instance the record holds is given, not withheld.
        let withheld = inventory
            .gpus
            .iter()
            .map(|g| inventory.gpu_node(g))
            .chain(
                inventory
                    .mig_instances()
                    .filter(|m| !record.gpus.contains(&m.uuid))
                    .flat_map(|m| inventory.mig_cap_nodes(m)),
            )
            .filter(|n| !nodes.contains(n))
            .collect();
        ContainerEdits {
            nodes,
            withheld,
            env: vec![(VISIBLE_DEVICES.to_string(), record.gpus.join(","))],
            ..ContainerEdits::default()
        }
    }

    /// What a spec edited before create needs besides the GPUs: `gpupin.assigned` and the
    /// claim token the record was made with, a prestart hook that binds the holder to the
    /// container's pid and a poststop hook that releases it.
    pub fn with_claim(mut self, record: &Record, token: &ClaimToken, hook: &HookCommand) -> Self {
        self.annotations = vec![
            (ASSIGNED_ANNOTATION.to_string(), record.gpus.join(",")),
            (CLAIM_ANNOTATION.to_string(), token.annotation()),
        ];
        let path = hook.exe.display().to_string();
        self.hooks = ["prestart", "poststop"]
            .into_iter()
            .map(|stage| Hook {
                stage,
                path: path.clone(),
                args: hook.args(stage),
                env: Vec::new(),
                timeout: None,
            })
            .collect();
        self
    }
}

/// Refuses a container that arrives carrying an annotation gpupin writes: whoever set it
/// is not gpupin, and the annotation would be trusted later. Keys are checked in a fixed
/// order, so the same container is always refused with the same message.
pub fn refuse_reserved(annotations: &HashMap<String, String>) -> Result<(), EditsError> {
    match WRITTEN_BY_GPUPIN
        .iter()
        .find(|key| annotations.contains_key(**key))
    {
        Some(key) => Err(EditsError::ReservedAnnotation(key)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::HolderId;
    use crate::policy::testing::machine;

    fn record(gpus: &[&str]) -> Record {
        Record {
            source: "test".into(),
            pid: None,
            start_time: None,
            created_at: 0,
            ..crate::state::ledger::testing::record("c1", gpus)
        }
    }

    #[test]
    fn a_mig_instance_gives_its_gpus_node_and_its_two_capability_nodes() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let instance = inv.find_mig("0:2").unwrap();
        let edits = ContainerEdits::gpus_of(&inv, &record(&[instance.uuid.as_str()]));
        let paths = |nodes: &[DeviceNode]| -> Vec<String> {
            nodes.iter().map(|n| n.path.clone()).collect()
        };
        assert_eq!(
            paths(&edits.nodes)[..3],
            [
                "/dev/nvidia0",
                "/dev/nvidia-caps/nvidia-cap84",
                "/dev/nvidia-caps/nvidia-cap85"
            ]
        );
        assert_eq!(edits.nodes[1].major, 511);
        assert_eq!(
            edits.env,
            [(VISIBLE_DEVICES.to_string(), instance.uuid.clone())]
        );
        // The other GPUs and the other instances' capability nodes are withheld; the
        // instance's own GPU is not.
        let withheld = paths(&edits.withheld);
        assert!(!withheld.contains(&"/dev/nvidia0".to_string()));
        assert!(withheld.contains(&"/dev/nvidia1".to_string()));
        for other in ["21", "22", "30", "31", "93", "94"] {
            assert!(
                withheld.contains(&format!("/dev/nvidia-caps/nvidia-cap{other}")),
                "{withheld:?}"
            );
        }
        assert!(
            !withheld
                .iter()
                .any(|p| p.ends_with("cap84") || p.ends_with("cap85"))
        );
    }

    #[test]
    fn a_record_gives_its_nodes_control_nodes_and_visible_devices() {
        let inv = machine(4);
        let edits = ContainerEdits::for_record(&inv, &record(&["GPU-test-2"])).unwrap();
        assert_eq!(edits.nodes, inv.nodes_for(&["GPU-test-2".to_string()]));
        assert_eq!(edits.nodes[0].path, "/dev/nvidia2");
        assert_eq!(
            edits.env,
            [(VISIBLE_DEVICES.to_string(), "GPU-test-2".to_string())]
        );
        assert!(edits.annotations.is_empty() && edits.hooks.is_empty());
        assert_eq!(edits.cpuset, None);
        let withheld: Vec<&str> = edits.withheld.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(withheld, ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia3"]);
    }

    #[test]
    fn a_claim_adds_the_token_and_the_bind_and_release_hooks() {
        let inv = machine(4);
        let rec = record(&["GPU-test-0", "GPU-test-1"]);
        let token = ClaimToken::new(HolderId::new("c1").unwrap()).unwrap();
        let hook = HookCommand::beside(Path::new("/usr/bin/gpupin"), None);
        let edits = ContainerEdits::for_record(&inv, &rec)
            .unwrap()
            .with_claim(&rec, &token, &hook);
        assert_eq!(
            edits.annotations,
            [
                (
                    "gpupin.assigned".to_string(),
                    "GPU-test-0,GPU-test-1".to_string()
                ),
                ("gpupin.claim".to_string(), token.annotation()),
            ]
        );
        let stages: Vec<&str> = edits.hooks.iter().map(|h| h.stage).collect();
        assert_eq!(stages, ["prestart", "poststop"]);
        assert_eq!(edits.hooks[1].path, "/usr/bin/gpupin-hook");
        assert_eq!(edits.hooks[1].args, ["gpupin-hook", "poststop"]);
    }

    #[test]
    fn reserved_annotations_are_refused_in_a_fixed_order() {
        let all: HashMap<String, String> = WRITTEN_BY_GPUPIN
            .iter()
            .map(|k| (k.to_string(), "x".to_string()))
            .collect();
        for _ in 0..20 {
            let err = refuse_reserved(&all.clone()).unwrap_err().to_string();
            assert!(err.starts_with("annotation gpupin.assigned "), "{err}");
        }
        assert!(refuse_reserved(&HashMap::from([("gpupin.count".into(), "1".into())])).is_ok());
    }
}
