//! The ring bottleneck of a set of GPUs: the best, over every order of the set, of the
//! slowest link on the closed ring through it in that order. A ring collective (NCCL's
//! ring all-reduce) moves every byte over every link of its ring, so it runs at this
//! link's speed.
//!
//! Exact up to [`EXACT_RING`] GPUs: the largest bandwidth `t` such that the links of at
//! least `t` hold a Hamiltonian cycle, found by a subset dynamic program (at most
//! 2^7 x 8 steps). Above that, a sound upper bound: the largest `t` whose links leave the
//! set 2-connected (no GPU whose loss splits it), which every ring is; on NVSwitch
//! machines, PCIe trees and NVLink islands joined by PCIe it is the exact value. (Past
//! 128 GPUs only the two-links-per-GPU part of that bound is checked.)

/// Up to this many GPUs the bottleneck is exact.
pub(crate) const EXACT_RING: usize = 8;

/// The bottleneck of the ring through `set` (any order), bandwidth of a pair from `bw`.
/// One GPU has no ring (0); two make a ring of their one link, both ways.
pub(crate) fn bottleneck(set: &[usize], bw: impl Fn(usize, usize) -> u64) -> u64 {
    let k = set.len();
    if k < 2 {
        return 0;
    }
    let w = |i: usize, j: usize| bw(set[i], set[j]);
    if k == 2 {
        return w(0, 1);
    }
    // Every GPU of a ring has two ring links: the ring is at most the smallest, over the
    // set, of each GPU's second-fastest link. Start there and step down through the
    // bandwidths present until the links that fast hold a ring (at the lowest every
    // pair is linked, which always does).
    let mut t = (0..k)
        .map(|i| second_largest((0..k).filter(|&j| j != i).map(|j| w(i, j))))
        .min()
        .unwrap_or(0);
    loop {
        let adjacent = |i: usize, j: usize| i != j && w(i, j) >= t;
        let holds = if k <= EXACT_RING {
            hamiltonian(k, adjacent)
        } else {
            k > 128 || biconnected(k, adjacent)
        };
        if holds {
            return t;
        }
        let below = (0..k)
            .flat_map(|i| (i + 1..k).map(move |j| (i, j)))
            .map(|(i, j)| w(i, j))
            .filter(|&v| v < t)
            .max();
        match below {
            Some(v) => t = v,
            None => return t,
        }
    }
}

fn second_largest(values: impl Iterator<Item = u64>) -> u64 {
    let (mut first, mut second) = (0, 0);
    for v in values {
        if v > first {
            second = first;
            first = v;
        } else if v > second {
            second = v;
        }
    }
    second
}

/// Whether the graph on `0..k` (3 <= k <= 8) has a cycle through every vertex.
/// `reach[mask]`: the ends `v` of paths that start at 0 and visit exactly `mask` (a
/// subset of 1..k, bit v - 1).
fn hamiltonian(k: usize, adjacent: impl Fn(usize, usize) -> bool) -> bool {
    // Every vertex of a cycle has two neighbours on it: a cheap refusal first.
    if (0..k).any(|i| (0..k).filter(|&j| adjacent(i, j)).count() < 2) {
        return false;
    }
    let adj: Vec<u8> = (0..k)
        .map(|i| {
            (1..k)
                .filter(|&j| adjacent(i, j))
                .fold(0, |m, j| m | 1 << (j - 1))
        })
        .collect();
    let full = (1usize << (k - 1)) - 1;
    let mut reach = vec![0u8; full + 1];
    for v in 1..k {
        if adj[0] & 1 << (v - 1) != 0 {
            reach[1 << (v - 1)] |= 1 << (v - 1);
        }
    }
    for mask in 1..full {
        let mut ends = reach[mask];
        while ends != 0 {
            let v = ends.trailing_zeros() as usize + 1;
            ends &= ends - 1;
            let mut next = adj[v] & !(mask as u8) & full as u8;
            while next != 0 {
                let bit = next & next.wrapping_neg();
                next &= next - 1;
                reach[mask | bit as usize] |= bit;
            }
        }
    }
    reach[full] & adj[0] != 0
}

/// Whether the graph on `0..k` (3 <= k <= 128) is connected with no cut vertex.
fn biconnected(k: usize, adjacent: impl Fn(usize, usize) -> bool) -> bool {
    let adj: Vec<u128> = (0..k)
        .map(|i| {
            (0..k)
                .filter(|&j| adjacent(i, j))
                .fold(0, |m, j| m | 1 << j)
        })
        .collect();
    if adj.iter().any(|a| a.count_ones() < 2) {
        return false;
    }
    // Iterative DFS from 0 with discovery times and low points (Tarjan): a non-root
    // vertex u is a cut vertex when a child's subtree reaches no higher than u; the
    // root is one when it has two children.
    const UNSEEN: usize = usize::MAX;
    let mut disc = [UNSEEN; 128];
    let mut low = [0; 128];
    let mut time = 0;
    // (vertex, parent, neighbours not yet looked at)
    let mut stack: Vec<(usize, usize, u128)> = Vec::with_capacity(k);
    stack.push((0, UNSEEN, adj[0]));
    disc[0] = 0;
    let mut root_children = 0;
    while let Some(top) = stack.last_mut() {
        let (u, parent) = (top.0, top.1);
        if top.2 != 0 {
            let v = top.2.trailing_zeros() as usize;
            top.2 &= top.2 - 1;
            if disc[v] == UNSEEN {
                time += 1;
                disc[v] = time;
                low[v] = time;
                if u == 0 {
                    root_children += 1;
                }
                stack.push((v, u, adj[v]));
            } else if v != parent {
                low[u] = low[u].min(disc[v]);
            }
        } else {
            stack.pop();
            if parent != UNSEEN {
                low[parent] = low[parent].min(low[u]);
                if parent != 0 && low[u] >= disc[parent] {
                    return false;
                }
            }
        }
    }
    root_children == 1 && disc[..k].iter().all(|&d| d != UNSEEN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition itself: every order of the set (first GPU fixed).
    fn by_permutations(set: &[usize], bw: &dyn Fn(usize, usize) -> u64) -> u64 {
        fn go(
            order: &mut Vec<usize>,
            rest: &mut Vec<usize>,
            bw: &dyn Fn(usize, usize) -> u64,
            best: &mut u64,
        ) {
            if rest.is_empty() {
                let k = order.len();
                let ring = (0..k).map(|i| bw(order[i], order[(i + 1) % k])).min();
                *best = (*best).max(ring.unwrap_or(0));
                return;
            }
            for i in 0..rest.len() {
                let v = rest.remove(i);
                order.push(v);
                go(order, rest, bw, best);
                order.pop();
                rest.insert(i, v);
            }
        }
        let mut best = 0;
        go(&mut vec![set[0]], &mut set[1..].to_vec(), bw, &mut best);
        best
    }

    fn matrix(n: usize, seed: u64, values: &[u64]) -> Vec<Vec<u64>> {
        let mut x = seed;
        let mut upper = vec![vec![0; n]; n];
        for (a, row) in upper.iter_mut().enumerate() {
            for v in &mut row[a + 1..] {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                *v = values[(x >> 33) as usize % values.len()];
            }
        }
        (0..n)
            .map(|a| (0..n).map(|b| upper[a.min(b)][a.max(b)]).collect())
            .collect()
    }

    #[test]
    fn exact_up_to_eight_on_random_matrices() {
        for seed in 0..300 {
            for k in 3..=EXACT_RING {
                let m = matrix(k, seed, &[1, 2, 5, 9]);
                let set: Vec<usize> = (0..k).collect();
                let bw = |a: usize, b: usize| m[a][b];
                assert_eq!(
                    bottleneck(&set, bw),
                    by_permutations(&set, &bw),
                    "seed {seed} k {k}"
                );
            }
        }
    }

    #[test]
    fn above_eight_never_below_the_true_ring() {
        for seed in 0..20 {
            let m = matrix(9, seed, &[1, 3, 7]);
            let set: Vec<usize> = (0..9).collect();
            let bw = |a: usize, b: usize| m[a][b];
            assert!(
                bottleneck(&set, bw) >= by_permutations(&set, &bw),
                "seed {seed}"
            );
        }
    }

    #[test]
    fn a_gpu_hanging_on_one_fast_link_drags_the_ring_down() {
        // 0-1-2-3 a ring of fast links, 4 fast only to 0: every ring through all five
        // has a slow link at 4.
        let fast = |a: usize, b: usize| {
            let (lo, hi) = (a.min(b), a.max(b));
            matches!((lo, hi), (0, 1) | (1, 2) | (2, 3) | (0, 3) | (0, 4))
        };
        let bw = |a: usize, b: usize| if fast(a, b) { 50 } else { 6 };
        assert_eq!(bottleneck(&[0, 1, 2, 3], bw), 50);
        assert_eq!(bottleneck(&[0, 1, 2, 3, 4], bw), 6);
    }

    #[test]
    fn small_sets() {
        let bw = |a: usize, b: usize| (a + b) as u64;
        assert_eq!(bottleneck(&[], bw), 0);
        assert_eq!(bottleneck(&[3], bw), 0);
        assert_eq!(bottleneck(&[1, 4], bw), 5);
        assert_eq!(bottleneck(&[1, 2, 3], bw), 3);
    }

    #[test]
    fn biconnected_finds_cut_vertices() {
        // Two triangles sharing vertex 2: connected, every degree >= 2, but 2 cuts it.
        let edges = [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (2, 4)];
        let adj = |a: usize, b: usize| edges.contains(&(a.min(b), a.max(b)));
        assert!(!biconnected(5, adj));
        let ring = |a: usize, b: usize| a.abs_diff(b) == 1 || a.abs_diff(b) == 4;
        assert!(biconnected(5, ring));
    }
}
