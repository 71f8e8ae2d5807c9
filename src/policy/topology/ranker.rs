//! The ranking terms of sets drawn from one pool of GPUs, the pair figures worked out
//! once: for callers that rank sets themselves (`policy::include` completes a set around
//! GPUs it must contain).

use super::problem::Problem;
use super::{Path, Terms};
use crate::model::gpu::Inventory;
use std::cmp::Reverse;

/// The terms in ranking order, without the positions' tie-break: larger is better.
pub(crate) type Rank = (Path, u64, u64, u64, Reverse<u64>);

impl Terms {
    pub fn rank(&self) -> Rank {
        (
            self.worst_path,
            self.ring,
            self.slowest,
            self.total,
            Reverse(self.left),
        )
    }
}

pub(crate) struct Ranker {
    p: Problem,
}

impl Ranker {
    /// `pool`: per position, the GPUs sets are drawn from; those a set leaves are the ones
    /// its `left` term counts. `None` without link data.
    pub(crate) fn new(inventory: &Inventory, pool: &[bool]) -> Option<Ranker> {
        Problem::new(inventory, pool).map(|p| Ranker { p })
    }

    /// The terms of `set`, positions all in the pool.
    pub(crate) fn terms(&self, set: &[usize]) -> Terms {
        let local: Vec<usize> = set.iter().map(|&pos| self.local(pos)).collect();
        self.p.terms(&local)
    }

    /// Bandwidth (MB/s per direction) and PCIe path between two positions of the pool.
    pub(crate) fn pair(&self, a: usize, b: usize) -> (u64, Path) {
        let (a, b) = (self.local(a), self.local(b));
        (self.p.bw(a, b), self.p.path(a, b))
    }

    fn local(&self, position: usize) -> usize {
        self.p
            .positions
            .binary_search(&position)
            .expect("a position of the pool")
    }
}
