//! Turning a request into a concrete set of GPUs, given what is held. Pure: the ledger
//! calls it under its lock and writes the outcome.

use super::{HolderId, LedgerError, Record};
use crate::inventory::{Gpu, Inventory};
use crate::policy::{PolicyInput, PolicyName};
use crate::request::{GpuRequest, Selection};

/// The outcome of an allocation: the holder's record as written.
#[derive(Debug, Clone)]
pub struct Allocation {
    pub record: Record,
}

impl Allocation {
    /// The allocated GPUs, in the order of the record, as the inventory describes them.
    pub fn gpus<'a>(&self, inventory: &'a Inventory) -> Vec<&'a Gpu> {
        self.record
            .gpus
            .iter()
            .filter_map(|u| inventory.gpus.iter().find(|g| &g.uuid == u))
            .collect()
    }
}

pub(super) struct Plan {
    pub uuids: Vec<String>,
    pub next_cursor: usize,
}

pub(super) fn plan(
    holder: &HolderId,
    request: &GpuRequest,
    inventory: &Inventory,
    default_policy: PolicyName,
    live: &[Record],
    cursor: usize,
) -> Result<Plan, LedgerError> {
    let total = inventory.gpus.len();
    if total == 0 {
        return Err(LedgerError::NoGpus);
    }
    let holder_of = |uuid: &str| live.iter().find(|r| r.gpus.iter().any(|g| g == uuid));
    let free: Vec<bool> = inventory
        .gpus
        .iter()
        .map(|g| holder_of(&g.uuid).is_none())
        .collect();
    let held = free.iter().filter(|f| !**f).count();
    let not_enough = |wanted: usize| LedgerError::NotEnoughFree {
        id: holder.to_string(),
        wanted,
        held,
        total,
    };
    let positions = match &request.selection {
        Selection::Devices(keys) => {
            let positions = resolve_devices(keys, inventory)?;
            for &p in &positions {
                if let Some(other) = holder_of(&inventory.gpus[p].uuid) {
                    return Err(LedgerError::DeviceHeld {
                        id: holder.to_string(),
                        index: inventory.gpus[p].index,
                        uuid: inventory.gpus[p].uuid.clone(),
                        holder: other.id.clone(),
                    });
                }
            }
            positions
        }
        Selection::All => {
            if held > 0 {
                return Err(not_enough(total));
            }
            (0..total).collect()
        }
        Selection::Count(count) => {
            let count = *count as usize;
            if count > total {
                return Err(LedgerError::CountTooLarge {
                    count: count as u32,
                    total,
                });
            }
            let policy = request.policy.unwrap_or(default_policy).policy();
            let input = PolicyInput {
                inventory,
                free: &free,
                count,
                cursor,
            };
            policy.choose(&input).ok_or_else(|| not_enough(count))?
        }
    };
    let next_cursor = positions.last().map_or(cursor, |p| (p + 1) % total);
    let mut sorted = positions;
    sorted.sort_unstable();
    Ok(Plan {
        uuids: sorted
            .into_iter()
            .map(|p| inventory.gpus[p].uuid.clone())
            .collect(),
        next_cursor,
    })
}

/// Positions in `inventory.gpus` of GPUs named by index, UUID or PCI bus id.
pub fn resolve_devices(keys: &[String], inventory: &Inventory) -> Result<Vec<usize>, LedgerError> {
    let mut positions: Vec<usize> = Vec::with_capacity(keys.len());
    for key in keys {
        let gpu = inventory.find(key).ok_or_else(|| LedgerError::UnknownGpu {
            key: key.clone(),
            known: known_range(inventory),
        })?;
        let p = inventory.position_of(&gpu.uuid).expect("found above");
        // `0,GPU-<uuid of 0>` names one GPU twice: one GPU, not an error.
        if !positions.contains(&p) {
            positions.push(p);
        }
    }
    Ok(positions)
}

fn known_range(inventory: &Inventory) -> String {
    let indices: Vec<String> = inventory.gpus.iter().map(|g| g.index.to_string()).collect();
    format!("{} (by index, UUID or PCI bus id)", indices.join(","))
}
