//! A good first answer for the exact search: the tighter the incumbent, the more the
//! bound prunes. Also the answer of last resort when the search runs out of budget.

use super::Key;
use super::bandwidth::Path;
use super::problem::{Classes, Problem};
use std::cmp::Reverse;

/// The best, by the full key, of one greedy growth per twin group (twins give the same
/// growth), and of that best improved by swapping one member for one outsider while
/// that raises every term but the ring (which is too dear to recompute per swap).
pub(super) fn incumbent(p: &Problem, classes: &Classes, k: usize) -> (Vec<usize>, Key) {
    let keyed = |set: Vec<usize>| {
        let key = p.key(&set);
        (set, key)
    };
    // Past `SEEDS` groups, the best connected ones: on big machines each growth costs
    // about as much as a few search nodes, and the search does not need the best start.
    let mut seeds: Vec<usize> = (0..classes.len()).collect();
    if seeds.len() > SEEDS {
        seeds.sort_by_key(|&x| Reverse(classes.degree[x]));
        seeds.truncate(SEEDS);
    }
    let grown = seeds
        .iter()
        .map(|&x| keyed(grow(p, classes.members[x][0], k)))
        .max_by(|a, b| a.1.cmp(&b.1))
        .expect("the search only runs with at least one free GPU");
    let improved = keyed(improve(p, grown.0.clone()));
    if improved.1 > grown.1 {
        improved
    } else {
        grown
    }
}

/// Growths at most (see `incumbent`).
const SEEDS: usize = 16;

/// From `seed`, repeatedly add the GPU whose worst PCIe path to the set so far is best,
/// then with the most bandwidth to it; ties to the GPU least linked to the others, then
/// the lowest.
fn grow(p: &Problem, seed: usize, k: usize) -> Vec<usize> {
    let n = p.len();
    let mut gain = vec![0; n];
    let mut path = vec![Path::NvLink; n];
    let mut taken = vec![false; n];
    let mut set = Vec::with_capacity(k);
    let mut next = seed;
    loop {
        set.push(next);
        taken[next] = true;
        if set.len() == k {
            break;
        }
        for v in 0..n {
            gain[v] += p.bw(next, v);
            path[v] = path[v].min(p.path(next, v));
        }
        next = (0..n)
            .filter(|&v| !taken[v])
            .max_by_key(|&v| (path[v], gain[v], Reverse(p.degree[v]), Reverse(v)))
            .expect("k never exceeds the free GPUs");
    }
    set.sort_unstable();
    set
}

/// The terms a swap is judged by: the key without the ring.
type Proxy = (Path, u64, u64, Reverse<u64>, u128);

/// 1-swap local search on [`Proxy`]: a result no single exchange improves.
fn improve(p: &Problem, mut set: Vec<usize>) -> Vec<usize> {
    let n = p.len();
    let k = set.len();
    if k < 2 || k == n {
        return set;
    }
    // Each accepted swap strictly raises the proxy, so this only caps pathological runs.
    for _ in 0..4 * n {
        let now = proxy(p, &set);
        let mut inside = vec![false; n];
        set.iter().for_each(|&a| inside[a] = true);
        let swap = (0..k).find_map(|x| {
            let rest: Vec<usize> = (0..k).filter(|&y| y != x).map(|y| set[y]).collect();
            let (path, slowest, total) = pairs_of(p, &rest);
            (0..n)
                .filter(|&v| !inside[v])
                .map(|inn| {
                    let mut cand = (path, slowest, total);
                    for &s in &rest {
                        cand.0 = cand.0.min(p.path(inn, s));
                        cand.1 = cand.1.min(p.bw(inn, s));
                        cand.2 += p.bw(inn, s);
                    }
                    let spare = now.3.0 - p.degree[set[x]] + p.degree[inn];
                    let low = now.4 - Problem::low_bit(set[x]) + Problem::low_bit(inn);
                    (inn, (cand.0, cand.1, cand.2, Reverse(spare), low))
                })
                .find(|&(_, cand)| cand > now)
                .map(|(inn, _)| (x, inn))
        });
        let Some((x, inn)) = swap else {
            break;
        };
        set[x] = inn;
    }
    set.sort_unstable();
    set
}

fn proxy(p: &Problem, set: &[usize]) -> Proxy {
    let (path, slowest, total) = pairs_of(p, set);
    (
        path,
        slowest,
        total,
        Reverse(set.iter().map(|&a| p.degree[a]).sum()),
        set.iter().map(|&a| Problem::low_bit(a)).sum(),
    )
}

/// Worst path, slowest pair (`u64::MAX` without pairs) and total over the pairs of `set`.
fn pairs_of(p: &Problem, set: &[usize]) -> (Path, u64, u64) {
    let mut out = (Path::NvLink, u64::MAX, 0);
    for (x, &a) in set.iter().enumerate() {
        for &b in &set[x + 1..] {
            out.0 = out.0.min(p.path(a, b));
            out.1 = out.1.min(p.bw(a, b));
            out.2 += p.bw(a, b);
        }
    }
    out
}
