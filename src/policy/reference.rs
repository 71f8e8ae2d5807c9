//! The reference implementation of the `topology` ranking: every set of `count` free GPUs,
//! ranked from the definition in [`super::topology`] with nothing precomputed or pruned.
//! Tests and benchmarks hold the real search to it; it is public only so that
//! `benches/policy.rs`, which links the crate like any user, can time it. Its cost grows
//! as C(free, count): fine up to 16 GPUs, hopeless at 64.

use super::PolicyInput;
use super::topology::bandwidth::{self, Path};
use super::topology::ring;
use std::cmp::Reverse;

/// The terms in ranking order: larger is better.
type Rank = (Path, u64, u64, u64, Reverse<u64>);

/// The best set of positions (ascending), or `None` when too few are free. Without link
/// data every set ties, so this is the lowest free positions, like `pack`.
pub fn best(input: &PolicyInput) -> Option<Vec<usize>> {
    let free: Vec<usize> = input.free_positions().collect();
    if free.len() < input.count {
        return None;
    }
    let mut set: Vec<usize> = (0..input.count).collect();
    let mut best: Option<(Rank, Vec<usize>)> = None;
    loop {
        let chosen: Vec<usize> = set.iter().map(|&i| free[i]).collect();
        let key = rank(input, &chosen);
        // Sets come in lexicographic order: keeping the first of equals keeps the lowest.
        if best.as_ref().is_none_or(|(b, _)| key > *b) {
            best = Some((key, chosen));
        }
        if !next_combination(&mut set, free.len()) {
            return best.map(|(_, chosen)| chosen);
        }
    }
}

/// The ranking terms of `chosen`, straight from their definitions.
fn rank(input: &PolicyInput, chosen: &[usize]) -> Rank {
    let Some(links) = &input.inventory.links else {
        return (Path::NvLink, 0, 0, 0, Reverse(0));
    };
    let pair = |a: usize, b: usize| -> (u64, Path) {
        let family = |p: usize| bandwidth::family(&input.inventory.gpus[p].name);
        bandwidth::pair(links[a][b], family(a), family(b))
    };
    let pairs: Vec<(u64, Path)> = chosen
        .iter()
        .enumerate()
        .flat_map(|(x, &a)| chosen[x + 1..].iter().map(move |&b| (a, b)))
        .map(|(a, b)| pair(a, b))
        .collect();
    let worst_path = pairs.iter().map(|p| p.1).min().unwrap_or(Path::NvLink);
    let slowest = pairs.iter().map(|p| p.0).min().unwrap_or(0);
    let total = pairs.iter().map(|p| p.0).sum();
    let ring = ring::bottleneck(chosen, |a, b| pair(a, b).0);
    let left = input
        .free_positions()
        .filter(|p| !chosen.contains(p))
        .map(|l| chosen.iter().map(|&c| pair(c, l).0).sum::<u64>())
        .sum();
    (worst_path, ring, slowest, total, Reverse(left))
}

/// Advances `set` (ascending indices below `n`) to the next combination in
/// lexicographic order; false after the last.
fn next_combination(set: &mut [usize], n: usize) -> bool {
    let k = set.len();
    let Some(i) = (0..k).rev().find(|&i| set[i] < n - k + i) else {
        return false;
    };
    set[i] += 1;
    for j in i + 1..k {
        set[j] = set[j - 1] + 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combinations_come_in_lexicographic_order() {
        let mut set = vec![0, 1];
        let mut all = vec![set.clone()];
        while next_combination(&mut set, 4) {
            all.push(set.clone());
        }
        assert_eq!(
            all,
            [[0, 1], [0, 2], [0, 3], [1, 2], [1, 3], [2, 3]].map(|s| s.to_vec())
        );
        assert!(!next_combination(&mut [], 3));
    }
}
