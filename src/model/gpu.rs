//! The GPU model: the machine's GPUs, how they are wired and the device nodes a unit
//! needs, as plain data with its pure questions (`find`, `nodes_for`). The inventory's
//! backends in `host/inventory` fill it; policies, the ledger and the edits read it.

use crate::model::link::Link;
use crate::model::mig::MigInstance;

/// One GPU as the inventory knows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Gpu {
    /// NVML / nvidia-smi index. Not stable across reboots: records key GPUs by `uuid`.
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// Total memory in bytes.
    pub memory_bytes: u64,
    /// PCI bus id in NVML's form, e.g. `00000000:17:00.0`.
    pub pci_bus_id: String,
    /// Device minor: the node is `/dev/nvidia<minor>`, which need not equal `index`.
    pub minor: u32,
    pub numa_node: Option<u32>,
    /// Host CPUs local to the GPU, as a cpulist (`0-15,32-47`).
    pub local_cpus: Option<String>,
    /// `None`: not in MIG mode, the GPU is a unit. `Some`: in MIG mode, never handed out
    /// whole; its instances (sorted by their index, maybe none) are the units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Vec<MigInstance>>,
}

impl Gpu {
    pub fn in_mig_mode(&self) -> bool {
        self.mig.is_some()
    }

    /// The GPU's MIG instances; none when it is not in MIG mode.
    pub fn mig_instances(&self) -> &[MigInstance] {
        self.mig.as_deref().unwrap_or(&[])
    }

    /// Its UUID, then its MIG instances': every unit of it the ledger may key.
    pub fn uuids(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.uuid.as_str())
            .chain(self.mig_instances().iter().map(|m| m.uuid.as_str()))
    }
}

/// A character device node a container needs, with its path inside the container.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DeviceNode {
    /// Absolute path inside the container, always under `/dev`.
    pub path: String,
    pub major: u32,
    pub minor: u32,
}

/// Everything gpupin knows about the machine's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Where this came from, for humans: `sim:nvswitch8`, `nvml`, a file path.
    pub source: String,
    /// Major number of `/dev/nvidia<minor>` (from /proc/devices `nvidia`, 195 on every driver seen).
    pub gpu_major: u32,
    /// Sorted by index; `gpus[i].index == i` is not assumed.
    pub gpus: Vec<Gpu>,
    /// nvidiactl, nvidia-uvm, nvidia-uvm-tools, and nvidia-modeset where present.
    pub control_nodes: Vec<DeviceNode>,
    /// Pairwise links, `links[a][b]` for positions a, b in `gpus`; `None` when unknown.
    pub links: Option<Vec<Vec<Link>>>,
    /// Major of the MIG capability nodes `/dev/nvidia-caps/nvidia-cap<N>` (`nvidia-caps`
    /// in /proc/devices, assigned dynamically); `None` where the driver has none, and
    /// then no MIG instance can be given.
    pub caps_major: Option<u32>,
}

impl Inventory {
    /// The device node of one GPU.
    pub fn gpu_node(&self, gpu: &Gpu) -> DeviceNode {
        DeviceNode {
            path: crate::model::nvidia::gpu_node(gpu.minor),
            major: self.gpu_major,
            minor: gpu.minor,
        }
    }

    /// Finds a GPU by index (`3`), UUID (`GPU-...`, case-insensitive) or PCI bus id
    /// (`00000000:17:00.0` or the short `17:00.0`).
    pub fn find(&self, key: &str) -> Option<&Gpu> {
        let key = key.trim();
        if let Ok(index) = key.parse::<u32>() {
            return self.gpus.iter().find(|g| g.index == index);
        }
        self.gpus.iter().find(|g| {
            g.uuid.eq_ignore_ascii_case(key)
                || g.pci_bus_id.eq_ignore_ascii_case(key)
                || bus_id_suffix_matches(&g.pci_bus_id, key)
        })
    }

    /// The nodes a container holding `uuids` needs: its GPUs' nodes (for a MIG instance,
    /// its GPU's node once and the instance's two capability nodes), then the control
    /// nodes every CUDA process opens.
    pub fn nodes_for(&self, uuids: &[String]) -> Vec<DeviceNode> {
        let mut nodes: Vec<DeviceNode> = Vec::new();
        for uuid in uuids {
            let unit = match self.gpus.iter().find(|g| &g.uuid == uuid) {
                Some(g) => vec![self.gpu_node(g)],
                None => match self.mig_instances().find(|m| &m.uuid == uuid) {
                    Some(m) => self.mig_nodes(m),
                    None => continue,
                },
            };
            for node in unit {
                if !nodes.contains(&node) {
                    nodes.push(node);
                }
            }
        }
        nodes.extend(self.control_nodes.iter().cloned());
        nodes
    }

    /// The nodes of one MIG instance: its GPU's, then its GPU instance's and its compute
    /// instance's capability nodes (none where their minors or major are unknown).
    pub fn mig_nodes(&self, instance: &MigInstance) -> Vec<DeviceNode> {
        let parent = DeviceNode {
            path: crate::model::nvidia::gpu_node(instance.parent_minor),
            major: self.gpu_major,
            minor: instance.parent_minor,
        };
        let caps = self.mig_cap_nodes(instance);
        std::iter::once(parent).chain(caps).collect()
    }

    /// An instance's two capability nodes; none where their minors or major are unknown.
    pub fn mig_cap_nodes(&self, instance: &MigInstance) -> Vec<DeviceNode> {
        match (instance.access, self.caps_major) {
            (Some(a), Some(major)) => [a.gi_minor, a.ci_minor]
                .into_iter()
                .map(|minor| DeviceNode {
                    path: crate::model::mig::cap_path(minor),
                    major,
                    minor,
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether gpupin can give `instance`: it knows its capability nodes.
    pub fn can_give(&self, instance: &MigInstance) -> bool {
        instance.access.is_some() && self.caps_major.is_some()
    }

    /// Every MIG instance, parents in index order.
    pub fn mig_instances(&self) -> impl Iterator<Item = &MigInstance> {
        self.gpus.iter().flat_map(|g| g.mig_instances())
    }

    /// Finds a MIG instance by address (`0:1`, GPU index and MIG index) or UUID
    /// (`MIG-...`, case-insensitive).
    pub fn find_mig(&self, key: &str) -> Option<&MigInstance> {
        let key = key.trim();
        if let Some((gpu, mig)) = crate::model::mig::parse_address(key) {
            return self
                .mig_instances()
                .find(|m| m.parent_index == gpu && m.index == mig);
        }
        self.mig_instances()
            .find(|m| m.uuid.eq_ignore_ascii_case(key))
    }

    /// Whether any GPU is in MIG mode.
    pub fn has_mig(&self) -> bool {
        self.gpus.iter().any(Gpu::in_mig_mode)
    }

    /// Position of a GPU in `gpus` by UUID.
    pub fn position_of(&self, uuid: &str) -> Option<usize> {
        self.gpus.iter().position(|g| g.uuid == uuid)
    }

    /// The link between GPUs at positions `a` and `b`, where known.
    pub fn link(&self, a: usize, b: usize) -> Option<Link> {
        self.links.as_ref().map(|m| m[a][b])
    }
}

/// `17:00.0` matches `00000000:17:00.0`: users copy bus ids from lspci, which drops the domain.
fn bus_id_suffix_matches(full: &str, short: &str) -> bool {
    short.len() >= 7
        && full.len() > short.len()
        && full[full.len() - short.len()..].eq_ignore_ascii_case(short)
        && full.as_bytes()[full.len() - short.len() - 1] == b':'
}
