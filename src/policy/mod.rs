//! Selection policies: pure functions from (inventory, what is free, how many) to a choice.
//! Adding a policy is a new file with one `Policy` impl and one line in `PolicyName`.

mod pack;
mod spread;

use crate::inventory::Inventory;

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

/// What a GPU is doing now: NVML on a real machine, the `live_file` for simulated ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Live {
    /// GPU utilization, percent.
    pub utilization: u32,
    /// Free memory in bytes.
    pub memory_free: u64,
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
}

/// The policies a request or the config can name.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// Lowest-numbered free GPUs first, keeping the high ones free for big jobs.
    #[default]
    Pack,
    /// Rotate through the GPUs, starting after the last one handed out, so wear and heat spread.
    Spread,
}

impl PolicyName {
    pub const EXPECTED: &'static str = "expected one of pack, spread";

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Pack => "pack",
            PolicyName::Spread => "spread",
        }
    }

    /// Whether the policy reads live figures (utilization, free memory).
    pub fn needs_live(self) -> bool {
        false
    }

    pub fn policy(self) -> &'static dyn Policy {
        match self {
            PolicyName::Pack => &pack::Pack,
            PolicyName::Spread => &spread::Spread,
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
#[error("unknown policy {0:?}: {expected}", expected = PolicyName::EXPECTED)]
pub struct UnknownPolicy(pub String);

impl std::str::FromStr for PolicyName {
    type Err = UnknownPolicy;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "pack" => Ok(PolicyName::Pack),
            "spread" => Ok(PolicyName::Spread),
            _ => Err(UnknownPolicy(s.to_string())),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::inventory::{Gpu, Inventory};

    /// A linkless machine of `n` GPUs, enough for policies that ignore topology.
    pub fn machine(n: u32) -> Inventory {
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
                })
                .collect(),
            control_nodes: vec![],
            links: None,
        }
    }
}
