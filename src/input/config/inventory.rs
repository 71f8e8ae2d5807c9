//! The inventory a config names: one call for every caller that has a `Config`, so that
//! the source, the state dir (the cache) and where NVML runs travel together.

use super::Config;
use crate::host::inventory::{self, InventoryError};
use crate::model::gpu::Inventory;

impl Config {
    /// The machine's GPUs from the configured `inventory` source, through the cache in
    /// `state_dir` where the source is probed, with NVML run as `nvml` says.
    pub fn load_inventory(&self) -> Result<Inventory, InventoryError> {
        inventory::load(&self.inventory, &self.state_dir, &self.nvml)
    }

    /// The hardware probed again and the cache rewritten (`gpupin inventory --refresh`).
    pub fn refresh_inventory(&self) -> Result<Inventory, InventoryError> {
        inventory::refresh(&self.inventory, &self.state_dir, &self.nvml)
    }
}
