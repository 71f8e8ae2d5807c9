//! The inventory cache in the state dir.
use super::{Inventory, InventoryError, InventorySource};
use std::path::Path;

pub fn load_or_probe(
    _source: &InventorySource,
    _state_dir: &Path,
) -> Result<Inventory, InventoryError> {
    todo!()
}
pub fn probe_and_store(
    _source: &InventorySource,
    _state_dir: &Path,
) -> Result<Inventory, InventoryError> {
    todo!()
}
