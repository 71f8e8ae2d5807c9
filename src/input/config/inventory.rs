//! The inventory a config names: one call for every caller that has a `Config`, so that
//! the source, the state dir (the cache) and where NVML runs travel together.

use super::Config;
use crate::host::inventory::{self, InventoryError, InventorySource, NvmlAccess};
use crate::model::gpu::Inventory;
use std::path::PathBuf;

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
        inventory::load(&self.source, &self.state_dir, &self.nvml)
    }
}

impl Config {
    /// The machine's GPUs from the configured `inventory` source, through the cache in
    /// `state_dir` where the source is probed, with NVML run as `nvml` says.
    pub fn load_inventory(&self) -> Result<Inventory, InventoryError> {
        inventory::load(&self.inventory, &self.state_dir, &self.nvml)
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
        inventory::refresh(&self.inventory, &self.state_dir, &self.nvml)
    }
}
