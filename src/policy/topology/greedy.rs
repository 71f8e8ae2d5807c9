//! A good first answer for the exact search: the tighter the incumbent, the more the
//! bound prunes. Also the answer of last resort when the search runs out of budget.

use super::Key;
use super::problem::{Classes, Problem};
use std::cmp::Reverse;

/// The best of one greedy growth per twin group (twins give the same growth), improved by
/// swapping one member for one outsider while that raises the key.
pub(super) fn incumbent(p: &Problem, classes: &Classes, k: usize) -> (Vec<usize>, Key) {
    let (set, key) = classes
        .members
        .iter()
        .map(|m| grow(p, m[0], k))
        .map(|set| {
            let key = p.key(&set);
            (set, key)
        })
        .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
        .expect("the search only runs with at least one free GPU");
    improve(p, set, key)
}

/// From `seed`, repeatedly add the GPU best linked to the set so far; ties to the GPU
/// least linked to the others, then the lowest.
fn grow(p: &Problem, seed: usize, k: usize) -> Vec<usize> {
    let mut gain = vec![0; p.len()];
    let mut taken = vec![false; p.len()];
    let mut set = Vec::with_capacity(k);
    let mut next = seed;
    loop {
        set.push(next);
        taken[next] = true;
        if set.len() == k {
            break;
        }
        for (v, g) in gain.iter_mut().enumerate() {
            *g += p.score(next, v);
        }
        next = (0..p.len())
            .filter(|&v| !taken[v])
            .max_by_key(|&v| (gain[v], Reverse(p.degree[v]), Reverse(v)))
            .expect("k never exceeds the free GPUs");
    }
    set.sort_unstable();
    set
}

/// 1-swap local search: a result no single exchange can improve.
fn improve(p: &Problem, mut set: Vec<usize>, mut key: Key) -> (Vec<usize>, Key) {
    let n = p.len();
    let mut taken = vec![false; n];
    set.iter().for_each(|&a| taken[a] = true);
    // `gain[v]`: v's score with the current set, kept up to date across swaps.
    let mut gain: Vec<u64> = (0..n)
        .map(|v| set.iter().map(|&s| p.score(v, s)).sum())
        .collect();
    // Enough passes for every realistic case; each accepted swap strictly raises the key.
    for _ in 0..4 * n {
        let swap = set.iter().enumerate().find_map(|(x, &out)| {
            (0..n)
                .filter(|&v| !taken[v])
                .map(|inn| (inn, swapped(p, key, &gain, out, inn)))
                .find(|&(_, k)| k > key)
                .map(|(inn, k)| (x, out, inn, k))
        });
        let Some((x, out, inn, better)) = swap else {
            break;
        };
        set[x] = inn;
        taken[out] = false;
        taken[inn] = true;
        key = better;
        for (v, g) in gain.iter_mut().enumerate() {
            *g = *g + p.score(v, inn) - p.score(v, out);
        }
    }
    set.sort_unstable();
    (set, key)
}

/// The key after replacing `out` by `inn`; `gain[v]` is v's score with the current set.
fn swapped(p: &Problem, key: Key, gain: &[u64], out: usize, inn: usize) -> Key {
    Key {
        links: key.links - gain[out] + gain[inn] - p.score(out, inn),
        spare: Reverse(key.spare.0 - p.degree[out] + p.degree[inn]),
        low: key.low - Problem::low_bit(out) + Problem::low_bit(inn),
    }
}
