//! `topology`: the free GPUs that talk to each other fastest, chosen so that the GPUs left
//! free stay as well connected as possible for the next request.
//!
//! # Score
//!
//! Each pair of GPUs scores by its link in `nvidia-smi topo -m` notation:
//!
//! | link      | pair score          | why |
//! |-----------|---------------------|-----|
//! | `NVS`     | 1800 (as `NV18`)    | an NVSwitch gives every pair the GPU's full NVLink bandwidth (18 links on H100), so no direct link beats it |
//! | `NV<k>`   | 100 × k (k ≤ 18)    | bandwidth grows with the number of links; one link (25-50 GB/s per direction) already outruns any PCIe peer path |
//! | `PIX`     | 40                  | peer-to-peer through one PCIe switch, at link speed, without the CPU |
//! | `PXB`     | 30                  | several switches, still below the host bridge |
//! | `PHB`     | 20                  | through a host bridge: the CPU's root complex carries the traffic |
//! | `NODE`    | 10                  | between host bridges of one NUMA node, over the CPU's internal fabric |
//! | `SYS`     | 0                   | across sockets (UPI / Infinity Fabric): the slowest path, no credit |
//!
//! `NV<k>` with k above 18 counts as 18, so `NVS` is never beaten. The PCIe steps are
//! even because their real gaps depend on the platform (many servers disable P2P above
//! `PIX`); only their order is certain, and every NVLink pair outranks every PCIe pair.
//!
//! A set's score is the sum of its pair scores. Among the sets of `count` free GPUs the
//! policy picks, in this order:
//! 1. the highest set score;
//! 2. the least score between the chosen GPUs and the free GPUs left behind (the cut):
//!    given 1, this is the choice that leaves the GPUs still free with the highest score
//!    among themselves. For `count = 1` (every set scores 0) it is the free GPU least
//!    connected to the other free ones, so a lone GPU is not taken out of a good group;
//! 3. the lowest positions (the lexicographically smallest sorted set).
//!
//! The answer is therefore unique, and it is what [`super::reference::best`] finds by
//! trying every set. Without link data (`links` is `None`) the policy is `pack`.
//!
//! # Search and its bound
//!
//! GPUs that score the same against every other free GPU are interchangeable (all GPUs
//! on one NVSwitch, the GPUs under one PCIe switch), so the search decides only how many
//! to take from each such group, lowest positions first. A greedy growth from each group,
//! improved by single swaps, gives a first answer; then a depth-first branch and bound
//! over the groups drops every branch whose optimistic bound (each newcomer's score with
//! what is taken, plus half its best possible scores with the other newcomers; the
//! smallest possible cut; the lowest open positions) cannot beat the best answer so far.
//! The bound never underestimates, so the result is exact whenever the search finishes.
//!
//! With up to [`EXACT_UP_TO`] free GPUs the search may visit its whole tree (at most
//! 2^17 nodes), so it is always exact. With more it stops after [`NODE_BUDGET`] nodes
//! (about 10 ms at 64 GPUs on one core) and returns the best answer found: never worse
//! than the greedy one, and a 1-swap local optimum. On the built-in machines and the
//! 64-GPU machines of `benches/policy.rs` (NVSwitch islands, a PCIe tree, eight
//! cube-meshes) it finishes well inside the budget; see docs/policy-benchmarks.md.
//! [`search`] reports whether an answer is exact.

mod greedy;
mod problem;
mod search;

use super::pack::Pack;
use super::{Policy, PolicyInput};
use crate::inventory::{Inventory, Link};
use problem::Problem;
use std::cmp::Reverse;

/// Up to this many free GPUs the search is never cut short.
pub const EXACT_UP_TO: usize = 16;

/// Search nodes visited, with more than [`EXACT_UP_TO`] free GPUs, before the search
/// settles for the best answer found so far. A node costs under a microsecond at 64
/// GPUs, so this caps the search near 10 ms.
pub const NODE_BUDGET: u64 = 10_000;

/// A tree over at most 16 groups has fewer nodes than this: no cut-off below 17 GPUs.
const WHOLE_TREE: u64 = 1 << (EXACT_UP_TO + 1);

/// The score of one pair's link, per the table above.
pub fn pair_score(link: Link) -> u64 {
    match link {
        Link::SelfLink => 0,
        Link::NvSwitch => 1800,
        Link::NvLink(k) => 100 * u64::from(k.min(18)),
        Link::PcieSwitch => 40,
        Link::PcieMultiSwitch => 30,
        Link::HostBridge => 20,
        Link::SameNuma => 10,
        Link::CrossSocket => 0,
    }
}

/// The sum of pair scores over a set of positions; 0 without link data.
pub fn set_score(inventory: &Inventory, set: &[usize]) -> u64 {
    let Some(links) = &inventory.links else {
        return 0;
    };
    let mut sum = 0;
    for (x, &a) in set.iter().enumerate() {
        for &b in &set[x + 1..] {
            sum += pair_score(links[a][b]);
        }
    }
    sum
}

/// The ranking key, compared field by field: more `links`, then less `spare`
/// (connectivity of the chosen GPUs to every free GPU: for sets of equal `links` the
/// smallest cut), then more `low` (see `Problem::low_bit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct Key {
    links: u64,
    spare: Reverse<u64>,
    low: u128,
}

/// A choice and how it was reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Positions, ascending.
    pub chosen: Vec<usize>,
    /// False only when the node budget ran out (see the module docs).
    pub exact: bool,
    /// Search nodes visited.
    pub nodes: u64,
}

/// The topology choice with its search statistics; `None` when too few GPUs are free.
pub fn search(input: &PolicyInput) -> Option<Outcome> {
    let free = input.free.iter().filter(|&&f| f).count();
    let budget = if free <= EXACT_UP_TO {
        WHOLE_TREE
    } else {
        NODE_BUDGET
    };
    search_with_budget(input, budget)
}

/// [`search`] with another node budget, for tests of the fallback.
pub fn search_with_budget(input: &PolicyInput, budget: u64) -> Option<Outcome> {
    let Some(links) = &input.inventory.links else {
        let chosen = Pack.choose(input)?;
        return Some(Outcome {
            chosen,
            exact: true,
            nodes: 0,
        });
    };
    let p = Problem::new(links, input.free);
    if p.len() < input.count {
        return None;
    }
    if input.count == 0 {
        return Some(Outcome {
            chosen: Vec::new(),
            exact: true,
            nodes: 0,
        });
    }
    let classes = p.classes();
    let start = greedy::incumbent(&p, &classes, input.count);
    let found = search::run(&classes, input.count, start, budget);
    Some(Outcome {
        chosen: found.set.iter().map(|&a| p.positions[a]).collect(),
        exact: found.exact,
        nodes: found.nodes,
    })
}

pub struct Topology;

impl Policy for Topology {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        search(input).map(|o| o.chosen)
    }
}

#[cfg(test)]
mod tests;
