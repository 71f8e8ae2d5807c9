//! The static description of a machine's GPUs: what exists, how it is wired, which
//! device nodes it needs. Backends fill it from NVML, procfs, a JSON file or a built-in
//! simulated machine; `cache` keeps a copy in the state dir so a hook never pays NVML's
//! start-up cost.

mod cache;
pub(crate) mod cpulist;
mod file;
pub mod import;
pub(crate) mod live;
mod live_cache;
mod mig_file;
mod nvml;
/// The `source` of an inventory NVML gave (`Inventory::source`).
pub(crate) const NVML_SOURCE: &str = "nvml";

/// Whether `inventory` came from NVML: a machine with a driver to ask (live figures, its
/// health, per-cgroup memory limits), not a simulated or file one.
pub(crate) fn from_nvml(inventory: &Inventory) -> bool {
    inventory.source == NVML_SOURCE
}

/// The NVML library every in-process use loads (the inventory, live figures, health,
/// memory limits).
const NVML_LIBRARY: &str = "libnvidia-ml.so.1";

pub(crate) mod nvml_health;
pub(crate) mod nvml_helper;
pub(crate) mod nvml_limits;
mod procfs;
pub(crate) mod sim;

pub(crate) use cache::{load_or_probe as cached, probe_and_store as probe_and_cache};
pub(crate) use file::load as from_file;
pub use file::{from_json, to_json};
pub use nvml::{live_all_here as nvml_live_here, probe_here as nvml_probe_here};
pub(crate) use procfs::char_majors;

use crate::model::gpu::Inventory;
use crate::model::live::Live;
use std::path::{Path, PathBuf};

/// NVIDIA's control nodes, which a CUDA process needs beside its GPUs' own nodes. Each
/// path is written once, here: the inventory sources make them, the cache and doctor
/// look for the UVM pair.
pub(crate) const CTL_NODE: &str = "/dev/nvidiactl";
pub(crate) const MODESET_NODE: &str = "/dev/nvidia-modeset";
pub(crate) const UVM_NODE: &str = "/dev/nvidia-uvm";
/// `/dev/nvidia-uvm-tools`; `starts_with(UVM_NODE)` matches both UVM nodes.
pub(crate) const UVM_TOOLS_NODE: &str = "/dev/nvidia-uvm-tools";

/// Where NVML is called: in this process (the `gpupin` CLI), or in the `gpupin` binary
/// beside a statically linked one (`nvml_helper` says why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum NvmlAccess {
    #[default]
    InProcess,
    /// `gpupin nvml inventory|live` through this binary.
    Helper(PathBuf),
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
    #[error(transparent)]
    MemoryLimit(Box<nvml_limits::LimitError>),
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

/// The `auto` backend: NVML first (it knows memory and NVLink), procfs when NVML cannot
/// answer. `nvml` says where NVML runs.
pub(crate) fn probe_auto(nvml: &NvmlAccess) -> Result<Inventory, InventoryError> {
    cache::probe_auto(|| nvml::probe(nvml), procfs::probe)
}

/// The `nvml` backend, probed afresh; `nvml` says where NVML runs.
pub(crate) fn probe_nvml(nvml: &NvmlAccess) -> Result<Inventory, InventoryError> {
    nvml::probe(nvml)
}

/// The `procfs` backend, probed afresh.
pub(crate) fn probe_procfs() -> Result<Inventory, InventoryError> {
    procfs::probe()
}

/// The procfs backend's answer with /proc, /sys and /dev at other roots (`gpupin doctor`
/// on fixtures or a mounted system), probed afresh and never cached.
pub(crate) fn probe_procfs_at(
    proc: &Path,
    sys: &Path,
    dev: &Path,
) -> Result<Inventory, InventoryError> {
    procfs::probe_at(&procfs::Roots {
        proc: proc.to_path_buf(),
        sys: sys.to_path_buf(),
        dev: dev.to_path_buf(),
    })
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
    if from_nvml(inventory) {
        let ask = || nvml::live(inventory, nvml);
        return match cache {
            Some(cache) => live_cache::read_or_ask(cache, inventory, ask).map(Some),
            None => ask().map(Some),
        };
    }
    Ok(None)
}
