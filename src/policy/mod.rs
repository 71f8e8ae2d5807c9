//! Selection policies: pure functions from (inventory, what is free, how many) to a choice.
//! Adding a policy is a new file with one `Policy` impl and one line in `PolicyName`.
//!
//! `topology` (the default) is described in [`topology`](crate::policy::topology); [`reference`](crate::policy::reference) is the brute-force
//! search that tests and benchmarks hold it to.

mod include;
mod load;
mod pack;
pub mod reference;
mod spread;
pub mod topology;

pub use include::choose_including;

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
}

/// The policies a request or the config can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PolicyName {
    /// The best-connected free GPUs (NVLink, then PCIe distance), leaving the
    /// best-connected ones free for later; like `pack` where links are unknown.
    #[default]
    Topology,
    /// Lowest-numbered free GPUs first, keeping the high ones free for big jobs.
    Pack,
    /// Rotate through the GPUs, starting after the last one handed out, so wear and heat spread.
    Spread,
    /// Lowest utilization first, then most free memory (live figures; `pack` without them).
    LeastLoaded,
    /// Most free memory first (live figures; `pack` without them).
    MostFree,
}

impl PolicyName {
    /// Every policy, in the order error messages list them.
    pub const ALL: [PolicyName; 5] = [
        PolicyName::Topology,
        PolicyName::Pack,
        PolicyName::Spread,
        PolicyName::LeastLoaded,
        PolicyName::MostFree,
    ];

    /// A literal so that it can sit in other `const`s and `#[error]`s; a test keeps it equal
    /// to `ALL`.
    pub const EXPECTED: &'static str =
        "expected one of topology, pack, spread, least-loaded, most-free";

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::Topology => "topology",
            PolicyName::Pack => "pack",
            PolicyName::Spread => "spread",
            PolicyName::LeastLoaded => "least-loaded",
            PolicyName::MostFree => "most-free",
        }
    }

    pub fn policy(self) -> &'static dyn Policy {
        match self {
            PolicyName::Topology => &topology::Topology,
            PolicyName::Pack => &pack::Pack,
            PolicyName::Spread => &spread::Spread,
            PolicyName::LeastLoaded => &load::LeastLoaded,
            PolicyName::MostFree => &load::MostFree,
        }
    }

    /// Whether the policy reads `PolicyInput::live`, so the caller should fetch live
    /// figures (NVML is slow to open: only ask when this is true).
    pub fn needs_live(self) -> bool {
        matches!(self, PolicyName::LeastLoaded | PolicyName::MostFree)
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
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_lists_every_policy_in_order() {
        let names: Vec<&str> = PolicyName::ALL.iter().map(|p| p.as_str()).collect();
        assert_eq!(
            PolicyName::EXPECTED,
            format!("expected one of {}", names.join(", "))
        );
    }

    #[test]
    fn names_agree_across_fromstr_and_serde() {
        for p in PolicyName::ALL {
            assert_eq!(p.as_str().parse::<PolicyName>().unwrap(), p);
            assert_eq!(
                serde_json::to_string(&p).unwrap(),
                format!("{:?}", p.as_str())
            );
        }
        let err = "best".parse::<PolicyName>().unwrap_err().to_string();
        assert!(err.contains(PolicyName::EXPECTED), "{err}");
    }

    #[test]
    fn topology_is_the_default_and_only_load_policies_need_live() {
        assert_eq!(PolicyName::default(), PolicyName::Topology);
        let live: Vec<_> = PolicyName::ALL
            .into_iter()
            .filter(|p| p.needs_live())
            .collect();
        assert_eq!(live, [PolicyName::LeastLoaded, PolicyName::MostFree]);
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use crate::host::inventory::NvmlAccess;
    use crate::input::config::InventorySource;
    use crate::model::gpu::{Gpu, Inventory};

    /// A built-in simulated machine (`sim:NAME`), links and all.
    pub fn sim(name: &str) -> Inventory {
        crate::input::config::inventory::load(
            &InventorySource::Sim(name.into()),
            std::path::Path::new("/nonexistent"),
            &NvmlAccess::InProcess,
        )
        .unwrap()
    }

    /// What a policy is asked: `count` of the GPUs marked in `free`, no cursor, no live
    /// figures.
    pub fn input<'a>(
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
                    mig: None,
                })
                .collect(),
            control_nodes: vec![],
            links: None,
            caps_major: None,
        }
    }
}
