//! Selection policies: pure functions from (inventory, what is free, how many) to a choice.
//! Adding a policy is a new file with one `Policy` impl and one line in the setting that
//! names it (`input::config::PolicyName`).
//!
//! `topology` (the default) is described in [`topology`](crate::policy::topology); [`reference`](crate::policy::reference) is the brute-force
//! search that tests and benchmarks hold it to.

mod include;
pub(crate) mod load;
pub(crate) mod pack;
pub(crate) mod reference;
pub(crate) mod spread;
pub(crate) mod topology;

pub(crate) use include::choose_including;

use crate::model::gpu::Inventory;
use crate::model::live::Live;

/// What a policy sees: the machine, which GPUs (by position in `inventory.gpus`) are
/// free for this request, and the rotation cursor that `spread` keeps in the ledger.
pub struct PolicyInput<'a> {
    pub inventory: &'a Inventory,
    pub free: &'a [bool],
    pub count: usize,
    /// Position after the last GPU handed out by any allocation.
    pub cursor: usize,
    /// Live figures per position, when the policy needs them (`PolicyName::needs_live`)
    /// and a source is configured.
    pub live: Option<&'a [Live]>,
}

impl PolicyInput<'_> {
    /// Free positions in ascending order.
    pub fn free_positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.free
            .iter()
            .enumerate()
            .filter(|(_, f)| **f)
            .map(|(i, _)| i)
    }
}

pub trait Policy {
    /// Positions of `input.count` free GPUs, or `None` when too few are free.
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>>;

    /// Whether the policy ranks whole sets rather than GPUs one by one, so that GPUs a
    /// choice must contain take part in its ranking (`choose_including`).
    fn ranks_whole_sets(&self) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::host::inventory::NvmlAccess;
    use crate::input::config::InventorySource;
    use crate::model::gpu::{Gpu, Inventory};

    /// A built-in simulated machine (`sim:NAME`), links and all.
    pub(crate) fn sim(name: &str) -> Inventory {
        crate::input::config::inventory::load(
            &InventorySource::Sim(name.into()),
            std::path::Path::new("/nonexistent"),
            &NvmlAccess::InProcess,
        )
        .unwrap()
    }

    /// What a policy is asked: `count` of the GPUs marked in `free`, no cursor, no live
    /// figures.
    pub(crate) fn input<'a>(
        inventory: &'a Inventory,
        free: &'a [bool],
        count: usize,
    ) -> super::PolicyInput<'a> {
        super::PolicyInput {
            inventory,
            free,
            count,
            cursor: 0,
            live: None,
        }
    }

    /// A linkless machine of `n` GPUs, enough for policies that ignore topology.
    pub(crate) fn machine(n: u32) -> Inventory {
        Inventory {
            source: "test".into(),
            gpu_major: 195,
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    uuid: format!("GPU-test-{i}"),
                    name: "Test GPU".into(),
                    memory_bytes: 80 << 30,
                    pci_bus_id: format!("00000000:{:02x}:00.0", i + 1),
                    minor: i,
                    numa_node: None,
                    local_cpus: None,
                    mig: None,
                })
                .collect(),
            control_nodes: vec![],
            links: None,
            caps_major: None,
        }
    }
}
