//! The search's view of one request: bandwidth and PCIe path of every pair of free GPUs,
//! each GPU's bandwidth to the other free ones, and the groups of interchangeable GPUs.

use super::bandwidth::{self, Path};
use super::{Key, Terms, ring};
use crate::model::gpu::Inventory;
use std::cmp::Reverse;

/// Free GPUs renumbered `0..n` in ascending position order; every index below is one of these.
pub(super) struct Problem {
    /// Inventory position of each free GPU, ascending.
    pub positions: Vec<usize>,
    n: usize,
    /// `n * n` pair bandwidths (MB/s per direction), 0 on the diagonal.
    bw: Vec<u64>,
    /// `n * n` PCIe paths, `NvLink` on the diagonal (it constrains nothing).
    path: Vec<Path>,
    /// Sum of a GPU's bandwidth to every other free GPU.
    pub degree: Vec<u64>,
}

impl Problem {
    /// `None` without link data.
    pub(super) fn new(inventory: &Inventory, free: &[bool]) -> Option<Self> {
        let links = inventory.links.as_ref()?;
        let positions: Vec<usize> = (0..free.len()).filter(|&p| free[p]).collect();
        let families: Vec<_> = positions
            .iter()
            .map(|&p| bandwidth::family(&inventory.gpus[p].name))
            .collect();
        let n = positions.len();
        let mut bw = vec![0; n * n];
        let mut path = vec![Path::NvLink; n * n];
        for (a, &pa) in positions.iter().enumerate() {
            for (b, &pb) in positions.iter().enumerate() {
                if a != b {
                    let (w, p) = bandwidth::pair(links[pa][pb], families[a], families[b]);
                    bw[a * n + b] = w;
                    path[a * n + b] = p;
                }
            }
        }
        let degree = (0..n)
            .map(|a| bw[a * n..(a + 1) * n].iter().sum())
            .collect();
        Some(Problem {
            positions,
            n,
            bw,
            path,
            degree,
        })
    }

    pub(super) fn len(&self) -> usize {
        self.n
    }

    pub(super) fn bw(&self, a: usize, b: usize) -> u64 {
        self.bw[a * self.n + b]
    }

    pub(super) fn path(&self, a: usize, b: usize) -> Path {
        self.path[a * self.n + b]
    }

    /// The weight that makes "lowest positions" an additive, maximised term: for sets of
    /// one size, the lexicographically smallest sorted set is the one whose smallest
    /// differing member it holds, i.e. the one with the larger sum of `1 << (127 - i)`.
    /// Past 128 free GPUs the weight is 0 and ties there fall to search order.
    pub(super) fn low_bit(i: usize) -> u128 {
        if i < 128 { 1u128 << (127 - i) } else { 0 }
    }

    /// The ranking terms of a set of free indices.
    pub(super) fn terms(&self, set: &[usize]) -> Terms {
        let mut t = Terms::EMPTY;
        let mut slowest = u64::MAX;
        for (x, &a) in set.iter().enumerate() {
            for &b in &set[x + 1..] {
                t.worst_path = t.worst_path.min(self.path(a, b));
                slowest = slowest.min(self.bw(a, b));
                t.total += self.bw(a, b);
            }
        }
        if set.len() >= 2 {
            t.slowest = slowest;
        }
        t.ring = ring::bottleneck(set, |a, b| self.bw(a, b));
        t.left = set.iter().map(|&a| self.degree[a]).sum::<u64>() - 2 * t.total;
        t
    }

    /// The full ranking key of a set of free indices.
    pub(super) fn key(&self, set: &[usize]) -> Key {
        Key::new(
            &self.terms(set),
            set.iter().map(|&a| Problem::low_bit(a)).sum(),
        )
    }

    /// `a` and `b` are twins when they have the same bandwidth and path to every other
    /// free GPU: swapping them changes no term, so the search only decides how many of a
    /// group to take (and takes the lowest). Twinship is an equivalence relation (if
    /// a~b and b~c then s(a,b) = s(c,b) from a~c's definition), so comparing with one
    /// representative per group suffices.
    fn twins(&self, a: usize, b: usize) -> bool {
        // Twins have equal degrees: a cheap test that rejects most pairs.
        if self.degree[a] != self.degree[b] {
            return false;
        }
        (0..self.n).all(|x| {
            x == a
                || x == b
                || (self.bw(a, x) == self.bw(b, x) && self.path(a, x) == self.path(b, x))
        })
    }

    /// Groups of twins, each ascending, best-connected first.
    pub(super) fn classes(&self) -> Classes {
        let mut members: Vec<Vec<usize>> = Vec::new();
        for a in 0..self.n {
            match members.iter_mut().find(|m| self.twins(m[0], a)) {
                Some(m) => m.push(a),
                None => members.push(vec![a]),
            }
        }
        // Best-connected groups first: deciding them early settles most of the score,
        // so the bound tightens sooner. Ties keep the order of the first member.
        members.sort_by_key(|m| Reverse(self.degree[m[0]]));
        let c = members.len();
        let mut between = vec![0; c * c];
        let mut path = vec![Path::NvLink; c * c];
        for x in 0..c {
            for y in 0..c {
                // Within a group of one there is no pair; any member pair stands for all.
                if x != y || members[x].len() > 1 {
                    let (a, b) = (members[x][0], members[y][usize::from(x == y)]);
                    between[x * c + y] = self.bw(a, b);
                    path[x * c + y] = self.path(a, b);
                }
            }
        }
        let degree = members.iter().map(|m| self.degree[m[0]]).collect();
        Classes {
            members,
            between,
            path,
            degree,
        }
    }
}

/// Twin groups and their pairs: `between[x * len + y]` is the bandwidth of any member of
/// `x` with any (other) member of `y`, `path` likewise.
pub(super) struct Classes {
    pub members: Vec<Vec<usize>>,
    pub between: Vec<u64>,
    pub path: Vec<Path>,
    pub degree: Vec<u64>,
}

impl Classes {
    pub(super) fn len(&self) -> usize {
        self.members.len()
    }

    pub(super) fn between(&self, x: usize, y: usize) -> u64 {
        self.between[x * self.len() + y]
    }

    pub(super) fn path(&self, x: usize, y: usize) -> Path {
        self.path[x * self.len() + y]
    }
}
