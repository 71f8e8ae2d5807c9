//! The reference implementation of the `topology` ranking: every set of `count` free GPUs,
//! scored from the definition in [`super::topology`] with nothing precomputed or pruned.
//! Tests and benchmarks hold the real search to it; it is public only so that
//! `benches/policy.rs`, which links the crate like any user, can time it. Its cost grows
//! as C(free, count): fine up to 16 GPUs, hopeless at 64.

use super::PolicyInput;
use super::topology::{pair_score, set_score};
use std::cmp::Reverse;

/// Set score, then the cut reversed: larger is better.
type Rank = (u64, Reverse<u64>);

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
        let key = (
            set_score(input.inventory, &chosen),
            Reverse(cut(input, &chosen)),
        );
        // Sets come in lexicographic order: keeping the first of equals keeps the lowest.
        if best.as_ref().is_none_or(|(b, _)| key > *b) {
            best = Some((key, chosen));
        }
        if !next_combination(&mut set, free.len()) {
            return best.map(|(_, chosen)| chosen);
        }
    }
}

/// Score between the chosen GPUs and the free GPUs left behind.
pub fn cut(input: &PolicyInput, chosen: &[usize]) -> u64 {
    let Some(links) = &input.inventory.links else {
        return 0;
    };
    let left = input.free_positions().filter(|p| !chosen.contains(p));
    left.map(|l| chosen.iter().map(|&c| pair_score(links[c][l])).sum::<u64>())
        .sum()
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
