//! The inventory a config names: where it comes from (the `inventory` key), and the one
//! function that turns a source into the machine's GPUs by calling `host/inventory`'s
//! backends, so that the source, the state dir (the cache) and where NVML runs travel
//! together.

use super::Config;
use crate::host::inventory::{self, InventoryError, NvmlAccess, sim};
use crate::model::gpu::Inventory;
use std::path::{Path, PathBuf};

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

/// What a config's inventory is loaded with (`inventory`, `state_dir`, `nvml`), for
/// whoever keeps no whole `Config`: the ledger's observers.
#[derive(Debug, Clone)]
pub struct InventorySettings {
    pub source: InventorySource,
    /// Where the inventory cache is.
    pub state_dir: PathBuf,
    pub nvml: NvmlAccess,
}

impl InventorySettings {
    /// The machine's GPUs, as `Config::load_inventory` loads them.
    pub fn load(&self) -> Result<Inventory, InventoryError> {
        load(&self.source, &self.state_dir, &self.nvml)
    }
}

impl Config {
    /// The machine's GPUs from the configured `inventory` source, through the cache in
    /// `state_dir` where the source is probed, with NVML run as `nvml` says.
    pub fn load_inventory(&self) -> Result<Inventory, InventoryError> {
        load(&self.inventory, &self.state_dir, &self.nvml)
    }

    /// What `load_inventory` loads with, for one that keeps no `Config`.
    pub fn inventory_settings(&self) -> InventorySettings {
        InventorySettings {
            source: self.inventory.clone(),
            state_dir: self.state_dir.clone(),
            nvml: self.nvml.clone(),
        }
    }

    /// The hardware probed again and the cache rewritten (`gpupin inventory --refresh`).
    pub fn refresh_inventory(&self) -> Result<Inventory, InventoryError> {
        refresh(&self.inventory, &self.state_dir, &self.nvml)
    }
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
        InventorySource::File(path) => inventory::from_file(path),
        InventorySource::Auto | InventorySource::Nvml | InventorySource::Procfs => {
            inventory::cached(&source.to_string(), state_dir, || probe(source, nvml))
        }
    }
}

/// Probes the hardware again and rewrites the cache (`gpupin inventory --refresh`).
pub(crate) fn refresh(
    source: &InventorySource,
    state_dir: &Path,
    nvml: &NvmlAccess,
) -> Result<Inventory, InventoryError> {
    match source {
        InventorySource::Sim(_) | InventorySource::File(_) => load(source, state_dir, nvml),
        _ => inventory::probe_and_cache(&source.to_string(), state_dir, || probe(source, nvml)),
    }
}

/// The backend `source` names, asked afresh.
fn probe(source: &InventorySource, nvml: &NvmlAccess) -> Result<Inventory, InventoryError> {
    match source {
        InventorySource::Auto => inventory::probe_auto(nvml),
        InventorySource::Nvml => inventory::probe_nvml(nvml),
        InventorySource::Procfs => inventory::probe_procfs(),
        // Never routed here by `load`, but cheap to answer.
        InventorySource::Sim(name) => sim::machine(name),
        InventorySource::File(path) => inventory::from_file(path),
    }
}
