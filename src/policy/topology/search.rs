//! Exact branch and bound over twin groups: decide, group by group in order of their
//! lowest member, how many GPUs to take from each (most first), and abandon a branch as
//! soon as an optimistic bound on every completion does not beat the best set found.

use super::Key;
use super::problem::{Classes, Problem};

use std::cmp::Reverse;

/// The search's answer: free indices, ascending.
pub(super) struct Found {
    pub set: Vec<usize>,
    /// False when the node budget ran out: `set` is then the best found, no worse than
    /// the greedy incumbent.
    pub exact: bool,
    pub nodes: u64,
}

pub(super) fn run(classes: &Classes, k: usize, start: (Vec<usize>, Key), budget: u64) -> Found {
    let mut s = Search::new(classes, k, budget);
    s.best_key = start.1;
    s.best = start.0;
    s.descend(0, k, Key::default());
    Found {
        set: s.best,
        exact: s.nodes <= s.budget,
        nodes: s.nodes,
    }
}

struct Search<'a> {
    c: &'a Classes,
    /// Members of groups `i..`, as `low` prefix sums: `low_prefix[i][r]` is the most
    /// `low` that `r` more members can add.
    low_prefix: Vec<Vec<u128>>,
    /// `member_low[x][m]`: `low` of the first `m` members of group `x`.
    member_low: Vec<Vec<u128>>,
    /// Members in groups `i..`.
    room: Vec<usize>,
    /// For each group, all groups by falling score with it.
    by_score: Vec<Vec<usize>>,
    /// Groups by rising degree.
    by_degree: Vec<usize>,
    /// `cross[y]`: score of one member of `y` with everything taken so far.
    cross: Vec<u64>,
    take: Vec<usize>,
    units: Vec<(u64, usize)>,
    best: Vec<usize>,
    best_key: Key,
    nodes: u64,
    budget: u64,
}

impl<'a> Search<'a> {
    fn new(c: &'a Classes, k: usize, budget: u64) -> Self {
        let g = c.len();
        let low_prefix = (0..=g)
            .map(|i| {
                let mut m: Vec<usize> = c.members[i..].iter().flatten().copied().collect();
                m.sort_unstable();
                prefix(m.iter().take(k).map(|&a| Problem::low_bit(a)))
            })
            .collect();
        let member_low = c
            .members
            .iter()
            .map(|m| prefix(m.iter().map(|&a| Problem::low_bit(a))))
            .collect();
        let mut room = vec![0; g + 1];
        for i in (0..g).rev() {
            room[i] = room[i + 1] + c.members[i].len();
        }
        let by_score = (0..g)
            .map(|x| {
                let mut ys: Vec<usize> = (0..g).collect();
                ys.sort_by_key(|&y| Reverse(c.between(x, y)));
                ys
            })
            .collect();
        let mut by_degree: Vec<usize> = (0..g).collect();
        by_degree.sort_by_key(|&x| c.degree[x]);
        Search {
            c,
            low_prefix,
            member_low,
            room,
            by_score,
            by_degree,
            cross: vec![0; g],
            take: vec![0; g],
            units: Vec::with_capacity(g),
            best: Vec::new(),
            best_key: Key::default(),
            nodes: 0,
            budget,
        }
    }

    /// Groups `..i` are decided, `r` GPUs are still to take, `key` scores what is taken.
    fn descend(&mut self, i: usize, r: usize, key: Key) {
        self.nodes += 1;
        if self.nodes > self.budget {
            return;
        }
        if r == 0 {
            if key > self.best_key {
                self.best_key = key;
                self.best = self.materialize();
            }
            return;
        }
        if self.bound(i, r, key) <= self.best_key {
            return;
        }
        let size = self.c.members[i].len();
        let fewest = r.saturating_sub(self.room[i + 1]);
        for m in (fewest..=size.min(r)).rev() {
            let next = self.with(i, m, key);
            self.add_cross(i, m, true);
            self.take[i] = m;
            self.descend(i + 1, r - m, next);
            self.add_cross(i, m, false);
        }
        self.take[i] = 0;
    }

    /// `key` plus `m` members of group `i`.
    fn with(&self, i: usize, m: usize, key: Key) -> Key {
        let m64 = m as u64;
        let inside = m64 * m64.saturating_sub(1) / 2 * self.c.between(i, i);
        Key {
            links: key.links + inside + m64 * self.cross[i],
            spare: Reverse(key.spare.0 + m64 * self.c.degree[i]),
            low: key.low + self.member_low[i][m],
        }
    }

    fn add_cross(&mut self, i: usize, m: usize, add: bool) {
        for y in i + 1..self.c.len() {
            let d = m as u64 * self.c.between(i, y);
            if add {
                self.cross[y] += d
            } else {
                self.cross[y] -= d
            }
        }
    }

    /// Beats or equals every completion of this branch, field by field (so also in order).
    fn bound(&mut self, i: usize, r: usize, key: Key) -> Key {
        Key {
            links: key.links + self.links_bound(i, r),
            spare: Reverse(key.spare.0 + self.spare_bound(i, r)),
            low: key.low + self.low_prefix[i][r],
        }
    }

    /// Each newcomer adds its score with what is taken plus, counted from both ends of each
    /// new pair, half its `r - 1` best scores among the groups still open; the `r` best of
    /// those per-member gains bound the sum. Values are doubled to keep integers.
    fn links_bound(&mut self, i: usize, r: usize) -> u64 {
        self.units.clear();
        for y in i..self.c.len() {
            let mut left = r - 1;
            let mut best = 0;
            for &z in &self.by_score[y] {
                if left == 0 {
                    break;
                }
                if z < i {
                    continue;
                }
                let n = self.c.members[z].len() - usize::from(z == y);
                let t = n.min(left);
                best += t as u64 * self.c.between(y, z);
                left -= t;
            }
            self.units
                .push((2 * self.cross[y] + best, self.c.members[y].len()));
        }
        self.units.sort_unstable_by_key(|&(v, _)| Reverse(v));
        take_best(self.units.iter().copied(), r) / 2
    }

    /// Newcomers add at least the `r` smallest degrees among the open groups.
    fn spare_bound(&self, i: usize, r: usize) -> u64 {
        let units = self
            .by_degree
            .iter()
            .filter(|&&y| y >= i)
            .map(|&y| (self.c.degree[y], self.c.members[y].len()));
        take_best(units, r)
    }

    fn materialize(&self) -> Vec<usize> {
        let mut set: Vec<usize> = (0..self.c.len())
            .flat_map(|x| self.c.members[x][..self.take[x]].iter().copied())
            .collect();
        set.sort_unstable();
        set
    }
}

/// Sum of the first `r` units of `(value, count)`, in the given order.
fn take_best(units: impl Iterator<Item = (u64, usize)>, r: usize) -> u64 {
    let mut left = r;
    let mut sum = 0;
    for (v, n) in units {
        let t = n.min(left);
        sum += t as u64 * v;
        left -= t;
        if left == 0 {
            break;
        }
    }
    sum
}

fn prefix(weights: impl Iterator<Item = u128>) -> Vec<u128> {
    let mut out = vec![0];
    for w in weights {
        out.push(out.last().unwrap() + w);
    }
    out
}
