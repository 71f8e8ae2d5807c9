//! The search's view of one request: pair scores among the free GPUs only, each GPU's
//! connectivity to the other free ones, and the groups of interchangeable GPUs.

use super::{Key, pair_score};
use crate::inventory::Link;
use std::cmp::Reverse;

/// Free GPUs renumbered `0..n` in ascending position order; every index below is one of these.
pub(super) struct Problem {
    /// Inventory position of each free GPU, ascending.
    pub positions: Vec<usize>,
    n: usize,
    /// `n * n` pair scores, 0 on the diagonal.
    score: Vec<u64>,
    /// Sum of a GPU's pair scores with every other free GPU.
    pub degree: Vec<u64>,
}

impl Problem {
    pub fn new(links: &[Vec<Link>], free: &[bool]) -> Self {
        let positions: Vec<usize> = (0..free.len()).filter(|&p| free[p]).collect();
        let n = positions.len();
        let mut score = vec![0; n * n];
        for (a, &pa) in positions.iter().enumerate() {
            for (b, &pb) in positions.iter().enumerate() {
                if a != b {
                    score[a * n + b] = pair_score(links[pa][pb]);
                }
            }
        }
        let degree = (0..n)
            .map(|a| score[a * n..(a + 1) * n].iter().sum())
            .collect();
        Problem {
            positions,
            n,
            score,
            degree,
        }
    }

    pub fn len(&self) -> usize {
        self.n
    }

    pub fn score(&self, a: usize, b: usize) -> u64 {
        self.score[a * self.n + b]
    }

    /// The weight that makes "lowest positions" an additive, maximised term: for sets of
    /// one size, the lexicographically smallest sorted set is the one whose smallest
    /// differing member it holds, i.e. the one with the larger sum of `1 << (127 - i)`.
    /// Past 128 free GPUs the weight is 0 and ties there fall to search order.
    pub fn low_bit(i: usize) -> u128 {
        if i < 128 { 1u128 << (127 - i) } else { 0 }
    }

    /// The full ranking key of a set of free indices.
    pub fn key(&self, set: &[usize]) -> Key {
        let mut links = 0;
        for (x, &a) in set.iter().enumerate() {
            for &b in &set[x + 1..] {
                links += self.score(a, b);
            }
        }
        Key {
            links,
            spare: Reverse(set.iter().map(|&a| self.degree[a]).sum()),
            low: set.iter().map(|&a| Problem::low_bit(a)).sum(),
        }
    }

    /// `a` and `b` are twins when they score the same against every other free GPU:
    /// swapping them changes no score, so the search only decides how many of a group
    /// to take (and takes the lowest). Twinship is an equivalence relation (if a~b and
    /// b~c then s(a,b) = s(c,b) from a~c's definition), so comparing with one
    /// representative per group suffices.
    fn twins(&self, a: usize, b: usize) -> bool {
        // Twins have equal degrees: a cheap test that rejects most pairs.
        if self.degree[a] != self.degree[b] {
            return false;
        }
        let (ra, rb) = (self.row(a), self.row(b));
        (0..self.n).all(|x| x == a || x == b || ra[x] == rb[x])
    }

    fn row(&self, a: usize) -> &[u64] {
        &self.score[a * self.n..(a + 1) * self.n]
    }

    /// Groups of twins, each ascending, ordered by their first member.
    pub fn classes(&self) -> Classes {
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
        for x in 0..c {
            for y in 0..c {
                // Within a group of one there is no pair; any member pair stands for all.
                let (a, b) = (
                    members[x][0],
                    *members[y].get(usize::from(x == y)).unwrap_or(&0),
                );
                if x != y || members[x].len() > 1 {
                    between[x * c + y] = self.score(a, b);
                }
            }
        }
        let degree = members.iter().map(|m| self.degree[m[0]]).collect();
        Classes {
            members,
            between,
            degree,
        }
    }
}

/// Twin groups and their scores: `between[x * len + y]` is the score of any member of `x`
/// with any (other) member of `y`.
pub(super) struct Classes {
    pub members: Vec<Vec<usize>>,
    pub between: Vec<u64>,
    pub degree: Vec<u64>,
}

impl Classes {
    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn between(&self, x: usize, y: usize) -> u64 {
        self.between[x * self.len() + y]
    }
}
