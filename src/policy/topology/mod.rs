//! `topology`: the free GPUs a collective (an NCCL ring or tree) runs fastest on, chosen
//! so that the GPUs left free stay as well connected as possible for the next request.
//!
//! # Bandwidth per link
//!
//! Each pair of GPUs gets an estimate of what one direction of its link carries, from its
//! `nvidia-smi topo -m` entry and the GPUs' generation (from their names), in
//! `bandwidth`:
//!
//! | link | bandwidth per direction | source |
//! |---|---|---|
//! | `NV<k>` | k x the generation's per-link rate: 20 GB/s (Pascal, NVLink 1), 25 GB/s (Volta, Turing: NVLink 2; A100: NVLink 3; Hopper: NVLink 4), 14.06 GB/s (GA102 bridges: A6000, A40, 3090), 50 GB/s (Blackwell, NVLink 5) | NVIDIA's NVLink page and GPU datasheets: per-GPU totals of 160, 300, 600, 900 and 1800 GB/s over 4, 6, 12, 18 and 18 links, 112.5 GB/s over 4 GA102 links, 100 GB/s over 2 Turing links; halved for one direction |
//! | `NVS` | every NVLink of the GPU: 150 (V100), 300 (A100), 450 (Hopper), 900 GB/s (Blackwell) | the same figures; an NVSwitch gives each pair the GPU's full NVLink bandwidth |
//! | `PIX` | 100% of the x16 PCIe rate | PCI-SIG: 8, 16, 32, 64 GT/s per lane for PCIe 3, 4, 5, 6, with 128b/130b (3-5) and FLIT (6) coding: 15.8, 31.5, 63.0, 121 GB/s |
//! | `PXB` | 90% | estimate: more switch hops, a shared upstream link |
//! | `PHB` | 75% | estimate: peer traffic through the CPU's root complex |
//! | `NODE` | 60% | estimate: between root complexes over the CPU's fabric |
//! | `SYS` | 40% | estimate: across sockets, where peer-to-peer is often disabled and copies go through host memory |
//!
//! A pair of different generations counts at the slower one's figures. PCIe: Pascal,
//! Volta, Turing 3; Ampere, Ada 4; Hopper 5; Blackwell 6. The PCIe path percentages are
//! gpupin's own estimates: no vendor publishes them, and they vary by platform; only
//! their order (`PIX` > `PXB` > `PHB` > `NODE` > `SYS`) is certain.
//!
//! # Ranking
//!
//! Among the sets of `count` free GPUs the policy picks, comparing term by term:
//! 1. the best worst PCIe path ([`Terms::worst_path`]) among the pairs that no NVLink
//!    joins: never a `SYS` pair when a set of the same size without one is free, never a
//!    `NODE` pair when one without is free, and so on to `PIX`; sets whose pairs are all
//!    NVLinked come first;
//! 2. the highest ring bottleneck (`ring`): over every order of the set, the slowest
//!    link on the closed ring through it, at its best; exact up to 8 GPUs, above that a
//!    sound upper bound (the set stays 2-connected over links that fast);
//! 3. the fastest slowest pair (what an all-to-all or a tree meets at worst);
//! 4. the most total bandwidth over all pairs;
//! 5. the least bandwidth between the chosen GPUs and the free GPUs left behind (the
//!    cut): given 4, the choice that leaves the free GPUs best connected among
//!    themselves. For `count = 1` (every other term ties) it is the free GPU least
//!    connected to the other free ones, so a lone GPU is not taken out of a good group;
//! 6. the lowest positions (the lexicographically smallest sorted set).
//!
//! The answer is therefore unique, and it is what [`super::reference::best`] finds by
//! trying every set. Without link data (`links` is `None`) the policy is `pack`.
//!
//! # Search and its bound
//!
//! GPUs with the same bandwidth and path to every other free GPU are interchangeable
//! (all GPUs on one NVSwitch, the GPUs under one PCIe switch), so the search decides
//! only how many to take from each such group, lowest positions first. A greedy growth
//! from each group, the best of them improved by single swaps, gives a first answer;
//! then a depth-first branch and bound over the groups drops every branch whose
//! optimistic bound, term by term, cannot beat the best answer so far:
//! - worst path and slowest pair: no better than among the GPUs taken so far, than what
//!   each taken GPU can still have with `count - 1` partners taken or to come, or than
//!   the best level at which `count` free GPUs pairwise reach it at all (a clique
//!   search over the groups, done once);
//! - ring: no higher than the level at which the GPUs taken so far lie in one connected
//!   group of at least `count` free GPUs, nor than what gives each of them two partners;
//! - total: each newcomer's bandwidth with what is taken plus half its best possible
//!   links with the other newcomers;
//! - the smallest possible cut; the lowest open positions.
//!
//! The bound never underestimates, so the result is exact whenever the search finishes.
//!
//! With up to [`EXACT_UP_TO`] free GPUs the search may visit its whole tree (at most
//! 2^17 nodes), so it is always exact. With more it stops after [`NODE_BUDGET`] nodes
//! and returns the best answer found: never worse than the greedy one. On the built-in
//! machines and the 64-GPU machines of `benches/policy.rs` (NVSwitch islands, a PCIe
//! tree, eight cube-meshes) it finishes well inside the budget; see
//! docs/policy-benchmarks.md. [`search()`] reports whether an answer is exact.

pub(crate) mod bandwidth;
mod clique;
mod explain;
mod greedy;
mod problem;
mod ranker;
pub(crate) mod ring;
mod search;

pub(crate) use bandwidth::Path;
pub(crate) use explain::{Explanation, Ranked, Term, explain};
pub(crate) use ranker::{Rank, Ranker};

use super::pack::Pack;
use super::{Policy, PolicyInput};
use problem::Problem;
use std::cmp::Reverse;

/// Up to this many free GPUs the search is never cut short.
pub(crate) const EXACT_UP_TO: usize = 16;

/// Search nodes visited, with more than [`EXACT_UP_TO`] free GPUs, before the search
/// settles for the best answer found so far: a few milliseconds at 64 GPUs on one core.
pub(crate) const NODE_BUDGET: u64 = 10_000;

/// A tree over at most 16 groups has fewer nodes than this: no cut-off below 17 GPUs.
const WHOLE_TREE: u64 = 1 << (EXACT_UP_TO + 1);

/// What the ranking compares, in its order (see the module docs). Bandwidths are MB/s
/// (10^6 bytes per second) per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Terms {
    /// The worst PCIe path between two chosen GPUs that no NVLink joins; `NvLink` when
    /// every pair is NVLinked (and for fewer than two GPUs).
    pub worst_path: Path,
    /// The ring bottleneck; 0 for fewer than two GPUs.
    pub ring: u64,
    /// The slowest pair; 0 for fewer than two GPUs.
    pub slowest: u64,
    /// The sum over all pairs.
    pub total: u64,
    /// Bandwidth between the chosen GPUs and the free GPUs left (less is better).
    pub left: u64,
}

impl Terms {
    const EMPTY: Terms = Terms {
        worst_path: Path::NvLink,
        ring: 0,
        slowest: 0,
        total: 0,
        left: 0,
    };
}

/// The ranking key, compared field by field. `spare` is the chosen GPUs' bandwidth to
/// every free GPU: for sets of equal `total` the larger `spare` is the larger cut, and it
/// bounds more simply. `low` ranks lower positions higher (see `Problem::low_bit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    path: Path,
    ring: u64,
    slowest: u64,
    total: u64,
    spare: Reverse<u64>,
    low: u128,
}

impl Key {
    fn new(t: &Terms, low: u128) -> Key {
        Key {
            path: t.worst_path,
            ring: t.ring,
            slowest: t.slowest,
            total: t.total,
            spare: Reverse(t.left + 2 * t.total),
            low,
        }
    }
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

/// The ranking terms of a set of free positions (all free); `None` without link data.
pub fn terms(input: &PolicyInput, set: &[usize]) -> Option<Terms> {
    Ranker::new(input.inventory, input.free).map(|r| r.terms(set))
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

/// [`search()`] with another node budget, for tests of the fallback.
pub(crate) fn search_with_budget(input: &PolicyInput, budget: u64) -> Option<Outcome> {
    let Some(p) = Problem::new(input.inventory, input.free) else {
        let chosen = Pack.choose(input)?;
        return Some(Outcome {
            chosen,
            exact: true,
            nodes: 0,
        });
    };
    if p.len() < input.count {
        return None;
    }
    // No choice to make: nothing, or every free GPU.
    if input.count == 0 || input.count == p.len() {
        return Some(Outcome {
            chosen: p.positions[..input.count].to_vec(),
            exact: true,
            nodes: 0,
        });
    }
    let classes = p.classes();
    let start = greedy::incumbent(&p, &classes, input.count);
    let goal = search::Goal {
        k: input.count,
        start: Some(start),
        budget,
        exclude: None,
    };
    let found = search::run(&p, &classes, goal);
    let (set, _) = found.best.expect("the search starts from an answer");
    Some(Outcome {
        chosen: set.iter().map(|&a| p.positions[a]).collect(),
        exact: found.exact,
        nodes: found.nodes,
    })
}

pub(crate) struct Topology;

impl Policy for Topology {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        search(input).map(|o| o.chosen)
    }

    fn ranks_whole_sets(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests;
