//! A choice that must contain some GPUs already: the kubelet's `must_include` devices
//! (an init container's GPUs a container reuses). The policy picks the rest.
//!
//! Policies that rank GPUs one by one (`pack`, `spread`, `least-loaded`, `most-free`) pick
//! the rest among the other free GPUs as they would anyway. `topology` ranks whole sets,
//! so the fixed GPUs take part in the ranking: among the sets that contain them, the
//! first by the terms [`super::topology`] defines (worst PCIe path, ring bottleneck,
//! slowest pair, total bandwidth, least bandwidth to the free GPUs left), then the
//! lowest positions. Every such set is tried while there are at most
//! [`EXHAUSTIVE_UP_TO`] of them; past that (large machines, large requests) GPUs are
//! added one at a time: the one whose worst path to those taken is best, then with the
//! most bandwidth to them, then the least to the free GPUs left, then the lowest.

use super::topology::{Path, Rank, Ranker};
use super::{Policy, PolicyInput};
use std::cmp::Reverse;

/// Up to this many candidate sets, the topology completion tries them all.
pub(super) const EXHAUSTIVE_UP_TO: u64 = 20_000;

/// `input.count` positions that contain `fixed`, the others chosen by `policy` among
/// `input.free` (which need not contain `fixed`); `None` when too few are free or `fixed`
/// alone is more than `input.count`. The result is sorted.
pub(crate) fn choose_including(
    policy: &dyn Policy,
    input: &PolicyInput,
    fixed: &[usize],
) -> Option<Vec<usize>> {
    let mut fixed: Vec<usize> = fixed.to_vec();
    fixed.sort_unstable();
    fixed.dedup();
    let rest = input.count.checked_sub(fixed.len())?;
    let free: Vec<bool> = (0..input.free.len())
        .map(|p| input.free[p] && !fixed.contains(&p))
        .collect();
    let others = PolicyInput {
        free: &free,
        count: rest,
        ..*input
    };
    let added = if !fixed.is_empty() && policy.ranks_whole_sets() && input.inventory.links.is_some()
    {
        complete_topology(&others, &fixed)?
    } else {
        policy.choose(&others)?
    };
    let mut chosen = fixed;
    chosen.extend(added);
    chosen.sort_unstable();
    Some(chosen)
}

/// The topology choice of `input.count` more GPUs beside `fixed`.
fn complete_topology(input: &PolicyInput, fixed: &[usize]) -> Option<Vec<usize>> {
    let free: Vec<usize> = input.free_positions().collect();
    if free.len() < input.count {
        return None;
    }
    // The fixed GPUs belong to every set: ranked with the free ones, never left behind.
    let pool: Vec<bool> = (0..input.free.len())
        .map(|p| input.free[p] || fixed.contains(&p))
        .collect();
    let ranker = Ranker::new(input.inventory, &pool)?;
    if combinations(free.len() as u64, input.count as u64) <= EXHAUSTIVE_UP_TO {
        Some(exhaustive(&ranker, input.count, fixed, &free))
    } else {
        Some(greedy(&ranker, input.count, fixed, &free))
    }
}

/// The ranking of `fixed` plus `added` (the caller keeps the first of equals, so the
/// lowest positions).
fn rank(ranker: &Ranker, fixed: &[usize], added: &[usize]) -> Rank {
    let mut all: Vec<usize> = fixed.iter().chain(added).copied().collect();
    all.sort_unstable();
    ranker.terms(&all).rank()
}

fn exhaustive(ranker: &Ranker, k: usize, fixed: &[usize], free: &[usize]) -> Vec<usize> {
    let mut set: Vec<usize> = (0..k).collect();
    let mut best: Option<(Rank, Vec<usize>)> = None;
    loop {
        let added: Vec<usize> = set.iter().map(|&i| free[i]).collect();
        let key = rank(ranker, fixed, &added);
        // Sets come in lexicographic order: keeping the first of equals keeps the lowest.
        if best.as_ref().is_none_or(|(b, _)| key > *b) {
            best = Some((key, added));
        }
        // The next combination of k indices below free.len(), in lexicographic order.
        let Some(i) = (0..k).rev().find(|&i| set[i] < free.len() - k + i) else {
            return best.map(|(_, added)| added).unwrap_or_default();
        };
        set[i] += 1;
        for j in i + 1..k {
            set[j] = set[j - 1] + 1;
        }
    }
}

/// One GPU at a time: the best worst path to what is taken, then the most bandwidth
/// with it, then the least with the free GPUs left, then the lowest position.
fn greedy(ranker: &Ranker, k: usize, fixed: &[usize], free: &[usize]) -> Vec<usize> {
    let mut taken: Vec<usize> = fixed.to_vec();
    let mut added = Vec::with_capacity(k);
    let mut left: Vec<usize> = free.to_vec();
    for _ in 0..k {
        let with = |p: usize, among: &[usize]| {
            among
                .iter()
                .filter(|&&q| q != p)
                .map(|&q| ranker.pair(p, q))
                .fold((Path::NvLink, 0), |(path, bw), (b, q)| {
                    (path.min(q), bw + b)
                })
        };
        let best = left
            .iter()
            .copied()
            .max_by_key(|&p| {
                let (path, bw) = with(p, &taken);
                (path, bw, Reverse(with(p, &left).1), Reverse(p))
            })
            .expect("enough free GPUs were checked");
        left.retain(|&p| p != best);
        taken.push(best);
        added.push(best);
    }
    added
}

/// C(n, k), saturating.
fn combinations(n: u64, k: u64) -> u64 {
    let k = k.min(n - k.min(n));
    (0..k).fold(1u64, |acc, i| acc.saturating_mul(n - i) / (i + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::policy::testing::{input, sim};

    #[test]
    fn without_fixed_gpus_it_is_the_policy_itself() {
        let inv = sim("cubemesh8");
        let free = [true, false, true, true, true, true, false, true];
        for policy in PolicyName::ALL {
            for count in 1..=5 {
                let i = input(&inv, &free, count);
                assert_eq!(
                    choose_including(policy.policy(), &i, &[]),
                    policy.policy().choose(&i),
                    "{policy} count {count}"
                );
            }
        }
    }

    #[test]
    fn topology_completes_a_fixed_gpu_into_its_fully_linked_quad() {
        let inv = sim("cubemesh8");
        let free = [true; 8];
        for fixed in [0, 2] {
            let chosen = choose_including(
                PolicyName::Topology.policy(),
                &input(&inv, &free, 4),
                &[fixed],
            );
            assert_eq!(chosen, Some(vec![0, 1, 2, 3]), "fixed {fixed}");
        }
        let chosen = choose_including(PolicyName::Topology.policy(), &input(&inv, &free, 4), &[6]);
        assert_eq!(chosen, Some(vec![4, 5, 6, 7]));
    }

    #[test]
    fn greedy_adds_the_best_linked_gpu_each_time() {
        let inv = sim("cubemesh8");
        let free_positions: Vec<usize> = (1..8).collect();
        let ranker = Ranker::new(&inv, &[true; 8]).unwrap();
        // 0-3 is NV2; then 2 has NV1 to 0 and NV2 to 3, more than any other has.
        assert_eq!(greedy(&ranker, 2, &[0], &free_positions), [3, 2]);
    }

    #[test]
    fn other_policies_take_the_rest_as_they_would() {
        let inv = crate::policy::testing::machine(8);
        let free = [true; 8];
        assert_eq!(
            choose_including(PolicyName::Pack.policy(), &input(&inv, &free, 3), &[6]),
            Some(vec![0, 1, 6])
        );
    }

    #[test]
    fn too_many_fixed_or_too_few_free_is_none() {
        let inv = sim("nvswitch8");
        let free = [true, true, false, false, false, false, false, false];
        assert_eq!(
            choose_including(
                PolicyName::Topology.policy(),
                &input(&inv, &free, 1),
                &[0, 1]
            ),
            None
        );
        assert_eq!(
            choose_including(PolicyName::Topology.policy(), &input(&inv, &free, 4), &[5]),
            None
        );
        assert_eq!(
            choose_including(PolicyName::Topology.policy(), &input(&inv, &free, 3), &[5]),
            Some(vec![0, 1, 5])
        );
    }

    #[test]
    fn combinations_count_sets() {
        assert_eq!(combinations(8, 2), 28);
        assert_eq!(combinations(8, 0), 1);
        assert_eq!(combinations(5, 5), 1);
        assert!(combinations(64, 8) > EXHAUSTIVE_UP_TO);
    }
}
