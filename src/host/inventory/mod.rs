//! The static description of a machine's GPUs: what exists, how it is wired, which
//! device nodes it needs. Backends fill it from NVML, procfs, a JSON file or a built-in
//! simulated machine; `cache` keeps a copy in the state dir so a hook never pays NVML's
//! start-up cost.

mod cache;
pub(crate) mod cpulist;
mod file;
pub mod import;
mod link;
pub mod live;
mod live_cache;
mod mig_file;
mod nvml;
pub mod nvml_helper;
mod procfs;
pub(crate) mod sim;

pub use crate::model::mig::{MigAccess, MigInstance};
pub use file::{from_json, to_json};
pub use link::Link;
pub use live::{GpuProcess, Live};
pub use nvml::{live_all_here as nvml_live_here, probe_here as nvml_probe_here};
pub(crate) use procfs::char_majors;

use std::path::{Path, PathBuf};

/// NVIDIA's control nodes, which a CUDA process needs beside its GPUs' own nodes. Each
/// path is written once, here: the inventory sources make them, the cache and doctor
/// look for the UVM pair.
pub const CTL_NODE: &str = "/dev/nvidiactl";
pub const MODESET_NODE: &str = "/dev/nvidia-modeset";
pub const UVM_NODE: &str = "/dev/nvidia-uvm";
/// `/dev/nvidia-uvm-tools`; `starts_with(UVM_NODE)` matches both UVM nodes.
pub const UVM_TOOLS_NODE: &str = "/dev/nvidia-uvm-tools";

/// Where NVML is called: in this process (the `gpupin` CLI), or in the `gpupin` binary
/// beside a statically linked one (`nvml_helper` says why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NvmlAccess {
    #[default]
    InProcess,
    /// `gpupin nvml inventory|live` through this binary.
    Helper(PathBuf),
}

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

/// Where the inventory comes from: the `inventory` config key.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InventorySource {
    /// NVML, then procfs, then an error that says how to choose a simulated machine.
    Auto,
    Nvml,
    Procfs,
    /// A built-in simulated machine, by name (`sim::names`: nvswitch8, pcie8, ...).
    Sim(String),
    /// A JSON inventory file (format in docs/reference.md).
    File(PathBuf),
}

impl std::str::FromStr for InventorySource {
    type Err = InventoryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "nvml" => Ok(Self::Nvml),
            "procfs" => Ok(Self::Procfs),
            _ => {
                if let Some(name) = s.strip_prefix("sim:") {
                    if sim::names().contains(&name) {
                        return Ok(Self::Sim(name.to_string()));
                    }
                    return Err(InventoryError::UnknownSim {
                        name: name.to_string(),
                    });
                }
                if s.starts_with('/') || s.starts_with('.') || s.ends_with(".json") {
                    return Ok(Self::File(PathBuf::from(s)));
                }
                Err(InventoryError::BadSource {
                    value: s.to_string(),
                })
            }
        }
    }
}

impl std::fmt::Display for InventorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Nvml => f.write_str("nvml"),
            Self::Procfs => f.write_str("procfs"),
            Self::Sim(n) => write!(f, "sim:{n}"),
            Self::File(p) => write!(f, "{}", p.display()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InventoryError {
    #[error(
        "unknown simulated machine sim:{name}: expected one of {}",
        sim::names().iter().map(|n| format!("sim:{n}")).collect::<Vec<_>>().join(", ")
    )]
    UnknownSim { name: String },
    #[error(
        "invalid inventory {value:?}: expected auto, nvml, procfs, sim:NAME or a path to an inventory JSON file"
    )]
    BadSource { value: String },
    #[error("reading inventory file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid inventory file {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("reading live file {path}")]
    LiveRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid live file {path}: {reason}")]
    LiveInvalid { path: PathBuf, reason: String },
    #[error("NVML is not available (is the NVIDIA driver installed?)")]
    NvmlUnavailable {
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("NVML through {exe}: {reason}")]
    NvmlHelper { exe: PathBuf, reason: String },
    #[error("starting {exe} for NVML")]
    NvmlHelperStart {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "GPU {gpu} ({uuid}) is in MIG mode but its instances cannot be read, so nothing of it is handed out"
    )]
    MigUnreadable {
        gpu: u32,
        uuid: String,
        #[source]
        source: Box<InventoryError>,
    },
    #[error("NVML through {exe}: {reason}")]
    NvmlHelperMigUnreadable { exe: PathBuf, reason: String },
    #[error("NVML reports no GPUs")]
    NoGpusInNvml,
    #[error("NVML query failed: {what}")]
    Nvml {
        what: String,
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    #[error("reading {path}")]
    Procfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing inventory cache {path}")]
    CacheWrite {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("unexpected content in {path}: {reason}")]
    ProcfsFormat { path: PathBuf, reason: String },
    #[error("no NVIDIA GPU found under {root}")]
    NoGpusInProcfs { root: PathBuf },
    #[error(
        "no NVIDIA GPU found (NVML: {nvml}; procfs: {procfs}); to try gpupin without GPUs set inventory = \"sim:nvswitch8\" (or sim:pcie8, or a JSON file) in the config"
    )]
    NothingFound { nvml: String, procfs: String },
}

/// Loads the inventory for `source`. `Auto`, `Nvml` and `Procfs` go through the cache in
/// `state_dir`; `Sim` and `File` are cheap to build and are never cached.
/// `nvml` says where NVML runs when the cache misses.
pub fn load(
    source: &InventorySource,
    state_dir: &Path,
    nvml: &NvmlAccess,
) -> Result<Inventory, InventoryError> {
    match source {
        InventorySource::Sim(name) => sim::machine(name),
        InventorySource::File(path) => file::load(path),
        InventorySource::Auto | InventorySource::Nvml | InventorySource::Procfs => {
            cache::load_or_probe(source, state_dir, nvml)
        }
    }
}

/// The procfs backend's answer with /proc, /sys and /dev at other roots (`gpupin doctor`
/// on fixtures or a mounted system), probed afresh and never cached.
pub fn probe_procfs_at(proc: &Path, sys: &Path, dev: &Path) -> Result<Inventory, InventoryError> {
    procfs::probe_at(&procfs::Roots {
        proc: proc.to_path_buf(),
        sys: sys.to_path_buf(),
        dev: dev.to_path_buf(),
    })
}

/// Probes the hardware again and rewrites the cache (`gpupin inventory --refresh`).
pub fn refresh(
    source: &InventorySource,
    state_dir: &Path,
    nvml: &NvmlAccess,
) -> Result<Inventory, InventoryError> {
    match source {
        InventorySource::Sim(_) | InventorySource::File(_) => load(source, state_dir, nvml),
        _ => cache::probe_and_store(source, state_dir, nvml),
    }
}

/// Live figures per position in `inventory.gpus`: from `live_file` when configured, else
/// NVML when the inventory came from it, else `None` (policies then fall back).
/// `nvml` says where NVML runs; with `cache`, an NVML snapshot younger than its
/// `max_age` is taken from the state dir instead of asking NVML again.
pub fn read_live(
    live_file: Option<&Path>,
    inventory: &Inventory,
    nvml: &NvmlAccess,
    cache: Option<live::Cache>,
) -> Result<Option<Vec<Live>>, InventoryError> {
    if let Some(path) = live_file {
        return live::from_file(path, inventory).map(Some);
    }
    if inventory.source == "nvml" {
        let ask = || nvml::live(inventory, nvml);
        return match cache {
            Some(cache) => live_cache::read_or_ask(cache, inventory, ask).map(Some),
            None => ask().map(Some),
        };
    }
    Ok(None)
}
