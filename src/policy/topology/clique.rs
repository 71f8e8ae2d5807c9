//! Whether `k` free GPUs exist whose every pair passes a test (a PCIe path at least this
//! good, a bandwidth at least this high): a clique search over twin groups. The search
//! uses the answers as caps on its first terms: no set has a worse pair than the best
//! level at which such a clique exists, and without the cap the bound would hope for
//! better until deep in the tree (a socket has room for 16 GPUs, but no 16 of them
//! without a `SYS` pair between two of one cube-mesh).

use super::problem::Classes;

/// Group counts this module handles: one bit each.
pub(super) const MAX_GROUPS: usize = 128;

/// `Some(true)` if `k` GPUs pairwise pass `ok` (on groups: `ok(x, x)` is the pair of two
/// members of `x`), `Some(false)` if not, `None` when `budget` (search nodes, counted
/// down) ran out or there are more than [`MAX_GROUPS`] groups.
pub(super) fn exists(
    c: &Classes,
    k: usize,
    ok: impl Fn(usize, usize) -> bool,
    budget: &mut u64,
) -> Option<bool> {
    let g = c.len();
    if g > MAX_GROUPS {
        return None;
    }
    // How many GPUs each group can give: all when its members pass among themselves.
    let cap: Vec<usize> = (0..g)
        .map(|x| if ok(x, x) { c.members[x].len() } else { 1 })
        .collect();
    let adj: Vec<u128> = (0..g)
        .map(|x| {
            (0..g)
                .filter(|&y| y != x && ok(x, y))
                .fold(0, |m, y| m | 1 << y)
        })
        .collect();
    let all = if g == MAX_GROUPS {
        u128::MAX
    } else {
        (1u128 << g) - 1
    };
    Clique {
        cap: &cap,
        adj: &adj,
        k,
        budget,
    }
    .expand(all, 0)
}

struct Clique<'a> {
    cap: &'a [usize],
    adj: &'a [u128],
    k: usize,
    budget: &'a mut u64,
}

impl Clique<'_> {
    /// Whether `sum` GPUs taken plus a clique among `cands` reach `k`.
    fn expand(&mut self, mut cands: u128, sum: usize) -> Option<bool> {
        if sum >= self.k {
            return Some(true);
        }
        if *self.budget == 0 {
            return None;
        }
        *self.budget -= 1;
        // Greedy colouring: groups of one colour are pairwise incompatible, so a clique
        // takes at most one of them; the biggest per colour bound what is left.
        let (order, bounds) = self.colour(cands);
        for (v, bound) in order.into_iter().zip(bounds).rev() {
            if sum + bound < self.k {
                return Some(false);
            }
            if self.expand(cands & self.adj[v], sum + self.cap[v])? {
                return Some(true);
            }
            cands &= !(1 << v);
        }
        Some(false)
    }

    /// The candidates in colour order, each with the bound of the colours up to its own.
    fn colour(&self, cands: u128) -> (Vec<usize>, Vec<usize>) {
        let mut order = Vec::new();
        let mut bounds = Vec::new();
        let mut left = cands;
        let mut total = 0;
        while left != 0 {
            let start = order.len();
            let mut free = left;
            let mut biggest = 0;
            while free != 0 {
                let v = free.trailing_zeros() as usize;
                free &= !(1 << v) & !self.adj[v];
                left &= !(1 << v);
                biggest = biggest.max(self.cap[v]);
                order.push(v);
            }
            total += biggest;
            bounds.resize(order.len(), total);
            debug_assert!(bounds.len() > start);
        }
        (order, bounds)
    }
}
