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
    let mut s = Search::new(classes, budget);
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
    /// `open_low[i]`: the `low` of all members of groups `i..`; one bit per member, so its
    /// `r` highest set bits are the most `low` that `r` more members can add.
    /// `low` that `r` more members can add.
    open_low: Vec<u128>,
    /// `member_low[x][m]`: `low` of the first `m` members of group `x`.
    member_low: Vec<Vec<u128>>,
    /// Members in groups `i..`.
    room: Vec<usize>,
    /// The distinct pair scores, falling: few (one per link kind present), which keeps
    /// the bound's work per group short.
    levels: Vec<u64>,
    /// `level_of[y * groups + z]`: index in `levels` of the score between `y` and `z`.
    level_of: Vec<usize>,
    /// `open[y * levels + l]`: how many GPUs in groups not yet decided (other than `y`'s
    /// own member) score `levels[l]` with a member of `y`. Kept as groups close.
    open: Vec<usize>,
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
    fn new(c: &'a Classes, budget: u64) -> Self {
        let g = c.len();
        let mut open_low = vec![0; g + 1];
        for i in (0..g).rev() {
            open_low[i] = open_low[i + 1]
                + c.members[i]
                    .iter()
                    .map(|&a| Problem::low_bit(a))
                    .sum::<u128>();
        }
        let member_low = c
            .members
            .iter()
            .map(|m| prefix(m.iter().map(|&a| Problem::low_bit(a))))
            .collect();
        let mut room = vec![0; g + 1];
        for i in (0..g).rev() {
            room[i] = room[i + 1] + c.members[i].len();
        }
        let mut levels = c.between.clone();
        levels.sort_unstable_by_key(|&v| Reverse(v));
        levels.dedup();
        let level_of: Vec<usize> = c
            .between
            .iter()
            .map(|v| {
                levels
                    .iter()
                    .position(|l| l == v)
                    .expect("every score is a level")
            })
            .collect();
        let mut open = vec![0; g * levels.len()];
        for y in 0..g {
            for z in 0..g {
                let n = c.members[z].len() - usize::from(z == y);
                open[y * levels.len() + level_of[y * g + z]] += n;
            }
        }
        let mut by_degree: Vec<usize> = (0..g).collect();
        by_degree.sort_by_key(|&x| c.degree[x]);
        Search {
            c,
            open_low,
            member_low,
            room,
            levels,
            level_of,
            open,
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
        self.close(i, true);
        for m in (fewest..=size.min(r)).rev() {
            let next = self.with(i, m, key);
            self.add_cross(i, m, true);
            self.take[i] = m;
            self.descend(i + 1, r - m, next);
            self.add_cross(i, m, false);
        }
        self.take[i] = 0;
        self.close(i, false);
    }

    /// Group `i` is decided (or undecided again, when `close` is false): its members no
    /// longer count as open partners of the later groups.
    fn close(&mut self, i: usize, close: bool) {
        let (g, l) = (self.c.len(), self.levels.len());
        let n = self.c.members[i].len();
        for y in i + 1..g {
            let slot = &mut self.open[y * l + self.level_of[y * g + i]];
            if close { *slot -= n } else { *slot += n }
        }
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
            low: key.low + highest_bits(self.open_low[i], r),
        }
    }

    /// Each newcomer adds its score with what is taken plus, counted from both ends of each
    /// new pair, half its `r - 1` best scores among the groups still open; the `r` best of
    /// those per-member gains bound the sum. Values are doubled to keep integers.
    fn links_bound(&mut self, i: usize, r: usize) -> u64 {
        self.units.clear();
        let l = self.levels.len();
        for y in i..self.c.len() {
            let open = &self.open[y * l..(y + 1) * l];
            let best = take_best(self.levels.iter().copied().zip(open.iter().copied()), r - 1);
            self.units
                .push((2 * self.cross[y] + best, self.c.members[y].len()));
        }
        // Only the `r` best units can contribute (each holds at least one member): select
        // them in linear time, then order just those.
        if self.units.len() > r {
            self.units
                .select_nth_unstable_by_key(r - 1, |&(v, _)| Reverse(v));
            self.units.truncate(r);
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

/// `bits` with all but its `r` highest set bits cleared.
fn highest_bits(mut bits: u128, r: usize) -> u128 {
    for _ in r..bits.count_ones() as usize {
        bits &= bits - 1;
    }
    bits
}

fn prefix(weights: impl Iterator<Item = u128>) -> Vec<u128> {
    let mut out = vec![0];
    for w in weights {
        out.push(out.last().unwrap() + w);
    }
    out
}
