//! Built-in simulated machines.
use super::{Inventory, InventoryError};

pub fn names() -> &'static [&'static str] {
    &["nvswitch8", "pcie8"]
}
pub fn machine(_name: &str) -> Result<Inventory, InventoryError> {
    todo!()
}
