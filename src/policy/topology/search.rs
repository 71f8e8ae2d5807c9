//! Exact branch and bound over twin groups: decide, group by group, how many GPUs to take
//! from each (most first), and abandon a branch as soon as an optimistic bound on every
//! completion, term by term, does not beat the best set found.

use super::Key;
use super::bandwidth::Path;
use super::problem::{Classes, Problem};
use super::{clique, ring};
use std::cmp::{Ordering, Reverse};

/// The search's answer: free indices, ascending.
pub(super) struct Found {
    /// `None` only when nothing was allowed (a runner-up where there is no other set).
    pub best: Option<(Vec<usize>, Key)>,
    /// False when the node budget ran out: `best` is then the best found, no worse than
    /// the incumbent it started from.
    pub exact: bool,
    pub nodes: u64,
}

/// What the search is told besides the machine.
pub(super) struct Goal<'a> {
    pub k: usize,
    /// The best set known before the search (the greedy one).
    pub start: Option<(Vec<usize>, Key)>,
    pub budget: u64,
    /// A choice (GPUs taken per group) that is not to be returned: the runner-up's search
    /// excludes the chosen set this way.
    pub exclude: Option<&'a [usize]>,
}

pub(super) fn run(p: &Problem, classes: &Classes, goal: Goal) -> Found {
    let mut s = Search::new(p, classes, &goal);
    s.best = goal.start;
    let cap = s.first_cap();
    s.descend(0, goal.k, Partial::EMPTY, cap, None);
    Found {
        best: s.best,
        exact: s.nodes <= s.budget,
        nodes: s.nodes,
    }
}

/// The terms of what is taken so far, exact for it.
#[derive(Clone, Copy)]
struct Partial {
    path: Path,
    /// Slowest pair taken; `u64::MAX` before the first pair.
    slowest: u64,
    total: u64,
    /// Sum of the taken GPUs' bandwidth to every free GPU.
    spare: u64,
    low: u128,
}

impl Partial {
    const EMPTY: Partial = Partial {
        path: Path::NvLink,
        slowest: u64::MAX,
        total: 0,
        spare: 0,
        low: 0,
    };
}

struct Search<'a> {
    p: &'a Problem,
    c: &'a Classes,
    k: usize,
    exclude: Option<&'a [usize]>,
    /// `open_low[i]`: the `low` of all members of groups `i..`; one bit per member, so its
    /// `r` highest set bits are the most `low` that `r` more members can add.
    open_low: Vec<u128>,
    /// `member_low[x][m]`: `low` of the first `m` members of group `x`.
    member_low: Vec<Vec<u128>>,
    /// Members in groups `i..`.
    room: Vec<usize>,
    /// The distinct pair bandwidths, falling: few (one per link kind present), which
    /// keeps the bounds' work per group short.
    levels: Vec<u64>,
    /// `level_of[y * groups + z]`: index in `levels` of the bandwidth between `y` and `z`.
    level_of: Vec<usize>,
    /// `open[y * levels + l]`: how many GPUs in groups not yet decided (other than `y`'s
    /// own member) have bandwidth `levels[l]` with a member of `y`. Kept as groups close.
    open: Vec<usize>,
    /// `taken[y * levels + l]`: the same for the GPUs taken so far.
    taken: Vec<usize>,
    /// `open_path[y * PATHS + q]`, `taken_path[..]`: the same by PCIe path, best first
    /// (`path_index`).
    open_path: Vec<usize>,
    taken_path: Vec<usize>,
    /// `component[l * groups + x]`: the component of group `x` among the free GPUs
    /// joined by links of at least `levels[l]`, or `LOOSE` when `x`'s members are not
    /// joined there; `size[l * groups + x]`: GPUs in that component (1 when loose).
    component: Vec<usize>,
    size: Vec<usize>,
    /// No set of `k` has a better worst path, or a faster slowest pair, than these
    /// (see [`clique`]).
    path_cap: Path,
    slowest_cap: u64,
    /// Groups by rising degree.
    by_degree: Vec<usize>,
    /// `cross[y]`: bandwidth of one member of `y` with everything taken so far.
    cross: Vec<u64>,
    take: Vec<usize>,
    units: Vec<(u64, usize)>,
    best: Option<(Vec<usize>, Key)>,
    nodes: u64,
    budget: u64,
}

const LOOSE: usize = usize::MAX;

/// Clique search nodes for the caps of one search; past them a cap is left loose.
const CLIQUE_BUDGET: u64 = 20_000;

/// PCIe paths, best first: `BY_INDEX[path_index(p)] == p`.
const PATHS: usize = 6;
const BY_INDEX: [Path; PATHS] = [
    Path::NvLink,
    Path::Pix,
    Path::Pxb,
    Path::Phb,
    Path::Node,
    Path::Sys,
];

fn path_index(p: Path) -> usize {
    match p {
        Path::NvLink => 0,
        Path::Pix => 1,
        Path::Pxb => 2,
        Path::Phb => 3,
        Path::Node => 4,
        Path::Sys => 5,
    }
}

/// The first of `levels` levels (best first) at which the running sum of `count`
/// reaches `need`.
fn first_reaching(levels: usize, need: usize, count: impl Fn(usize) -> usize) -> Option<usize> {
    let mut have = 0;
    (0..levels).find(|&lv| {
        have += count(lv);
        have >= need
    })
}

impl<'a> Search<'a> {
    fn new(p: &'a Problem, c: &'a Classes, goal: &Goal<'a>) -> Self {
        let g = c.len();
        let mut open_low = vec![0; g + 1];
        let mut room = vec![0; g + 1];
        for i in (0..g).rev() {
            open_low[i] = open_low[i + 1]
                + c.members[i]
                    .iter()
                    .map(|&a| Problem::low_bit(a))
                    .sum::<u128>();
            room[i] = room[i + 1] + c.members[i].len();
        }
        let member_low = c
            .members
            .iter()
            .map(|m| prefix(m.iter().map(|&a| Problem::low_bit(a))))
            .collect();
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
                    .expect("every bandwidth is a level")
            })
            .collect();
        let l = levels.len();
        let mut open = vec![0; g * l];
        let mut open_path = vec![0; g * PATHS];
        for y in 0..g {
            for z in 0..g {
                let n = c.members[z].len() - usize::from(z == y);
                open[y * l + level_of[y * g + z]] += n;
                open_path[y * PATHS + path_index(c.path(y, z))] += n;
            }
        }
        let (component, size) = components(c, &levels);
        let (path_cap, slowest_cap) = caps(c, goal.k, &levels);
        let mut by_degree: Vec<usize> = (0..g).collect();
        by_degree.sort_by_key(|&x| c.degree[x]);
        Search {
            p,
            c,
            k: goal.k,
            exclude: goal.exclude,
            open_low,
            member_low,
            room,
            levels,
            level_of,
            open,
            taken: vec![0; g * l],
            open_path,
            taken_path: vec![0; g * PATHS],
            component,
            size,
            path_cap,
            slowest_cap,
            by_degree,
            cross: vec![0; g],
            take: vec![0; g],
            units: Vec::with_capacity(g),
            best: None,
            nodes: 0,
            budget: goal.budget,
        }
    }

    /// The ring bound before anything is taken: the highest level with a component big
    /// enough for the request.
    fn first_cap(&self) -> usize {
        let g = self.c.len();
        (0..self.levels.len())
            .find(|&l| (0..g).any(|x| self.size[l * g + x] >= self.k))
            .unwrap_or(self.levels.len() - 1)
    }

    /// Groups `..i` are decided, `r` GPUs are still to take, `part` scores what is taken;
    /// the ring is at most `levels[cap]` (see `joined_cap`); `anchor`: the first group taken.
    fn descend(&mut self, i: usize, r: usize, part: Partial, cap: usize, anchor: Option<usize>) {
        self.nodes += 1;
        if self.nodes > self.budget {
            return;
        }
        if r == 0 {
            self.leaf(part, cap);
            return;
        }
        if self.prunes(i, r, part, cap) {
            return;
        }
        let size = self.c.members[i].len();
        let fewest = r.saturating_sub(self.room[i + 1]);
        self.close(i, true);
        for m in (fewest..=size.min(r)).rev() {
            let (next, next_cap) = if m == 0 {
                (part, cap)
            } else {
                (self.with(i, m, part), self.joined_cap(i, m, cap, anchor))
            };
            self.add_taken(i, m, true);
            self.take[i] = m;
            let next_anchor = anchor.or((m > 0).then_some(i));
            self.descend(i + 1, r - m, next, next_cap, next_anchor);
            self.add_taken(i, m, false);
        }
        self.take[i] = 0;
        self.close(i, false);
    }

    fn leaf(&mut self, part: Partial, cap: usize) {
        if self.exclude == Some(&self.take[..]) {
            return;
        }
        let pairs = self.k >= 2;
        let (path, ring, _) = self.pair_bounds(part, cap, false);
        let mut key = Key {
            path,
            ring,
            slowest: if pairs { part.slowest } else { 0 },
            total: part.total,
            spare: Reverse(part.spare),
            low: part.low,
        };
        if let Some((_, best)) = &self.best
            && key <= *best
        {
            return;
        }
        let set = self.materialize();
        if pairs {
            key.ring = ring::bottleneck(&set, |a, b| self.p.bw(a, b));
        }
        if self.best.as_ref().is_none_or(|(_, best)| key > *best) {
            self.best = Some((set, key));
        }
    }

    /// Group `i` is decided (or undecided again, when `close` is false): its members no
    /// longer count as open partners.
    fn close(&mut self, i: usize, close: bool) {
        let (g, l) = (self.c.len(), self.levels.len());
        let n = self.c.members[i].len();
        for y in 0..g {
            let n = n - usize::from(y == i);
            let slot = &mut self.open[y * l + self.level_of[y * g + i]];
            if close {
                *slot -= n
            } else {
                *slot += n
            }
            let slot = &mut self.open_path[y * PATHS + path_index(self.c.path(y, i))];
            if close { *slot -= n } else { *slot += n }
        }
    }

    /// `part` plus `m` (at least one) members of group `i`.
    fn with(&self, i: usize, m: usize, part: Partial) -> Partial {
        let m64 = m as u64;
        let inside = m64 * (m64 - 1) / 2 * self.c.between(i, i);
        let (mut path, mut slowest) = (part.path, part.slowest);
        if m >= 2 {
            path = path.min(self.c.path(i, i));
            slowest = slowest.min(self.c.between(i, i));
        }
        for y in (0..i).filter(|&y| self.take[y] > 0) {
            path = path.min(self.c.path(i, y));
            slowest = slowest.min(self.c.between(i, y));
        }
        Partial {
            path,
            slowest,
            total: part.total + inside + m64 * self.cross[i],
            spare: part.spare + m64 * self.c.degree[i],
            low: part.low + self.member_low[i][m],
        }
    }

    /// The ring bound after taking `m` members of group `i`: the highest level, not above
    /// `cap`, at which everything taken lies in one component of at least `k` GPUs (a
    /// ring is connected), with `i`'s members joined.
    fn joined_cap(&self, i: usize, m: usize, cap: usize, anchor: Option<usize>) -> usize {
        let g = self.c.len();
        let last = self.levels.len() - 1;
        (cap..=last)
            .find(|&l| {
                let comp = self.component[l * g + i];
                let joined = m == 1 || comp != LOOSE;
                let with_anchor =
                    anchor.is_none_or(|a| comp != LOOSE && comp == self.component[l * g + a]);
                joined && with_anchor && self.size[l * g + i] >= self.k
            })
            .unwrap_or(last)
    }

    fn add_taken(&mut self, i: usize, m: usize, add: bool) {
        if m == 0 {
            return;
        }
        let (g, l) = (self.c.len(), self.levels.len());
        for y in 0..g {
            let d = m as u64 * self.c.between(i, y);
            let n = m - usize::from(y == i);
            let slot = &mut self.taken[y * l + self.level_of[y * g + i]];
            if add {
                *slot += n
            } else {
                *slot -= n
            }
            let slot = &mut self.taken_path[y * PATHS + path_index(self.c.path(y, i))];
            if add {
                *slot += n
            } else {
                *slot -= n
            }
            if add {
                self.cross[y] += d;
            } else {
                self.cross[y] -= d;
            }
        }
    }

    /// Whether no completion of this branch can beat the best set found. The bound is
    /// built term by term, the cheap ones first: when the first terms already decide
    /// against (or for) the branch, the rest is not computed.
    fn prunes(&mut self, i: usize, r: usize, part: Partial, cap: usize) -> bool {
        let Some((_, best)) = &self.best else {
            return false;
        };
        let best = *best;
        let (mut path, mut ring, mut slowest) = (part.path.min(self.path_cap), 0, 0);
        if self.k >= 2 {
            ring = self.levels[cap];
            slowest = part.slowest.min(self.slowest_cap).min(ring);
        }
        let head =
            |path, ring, slowest| (path, ring, slowest).cmp(&(best.path, best.ring, best.slowest));
        if head(path, ring, slowest) == Ordering::Greater {
            (path, ring, slowest) = self.pair_bounds(part, cap, true);
        }
        match head(path, ring, slowest) {
            Ordering::Less => return true,
            Ordering::Greater => return false,
            Ordering::Equal => {}
        }
        let rest = (
            part.total + self.links_bound(i, r),
            Reverse(part.spare + self.spare_bound(i, r)),
            part.low + highest_bits(self.open_low[i], r),
        );
        rest <= (best.total, best.spare, best.low)
    }

    /// Bounds on the worst path, the ring and the slowest pair from the links each taken
    /// GPU has to GPUs taken or (with `open`) still to come. In the final set each GPU
    /// has `k - 1` partners, all with at least the worst path and the slowest pair of the
    /// set, and two ring neighbours (one when the ring is a pair) with at least the ring
    /// bottleneck; the ring lies in one component (`cap`); no pair is slower than the
    /// ring, so the slowest pair is not either.
    fn pair_bounds(&self, part: Partial, cap: usize, open: bool) -> (Path, u64, u64) {
        if self.k < 2 {
            return (Path::NvLink, 0, 0);
        }
        let (g, l) = (self.c.len(), self.levels.len());
        let ring_need = if self.k == 2 { 1 } else { 2 };
        let mut path = part.path.min(self.path_cap);
        let mut ring = self.levels[cap];
        let mut slowest = part.slowest.min(self.slowest_cap);
        let level = |reached: Option<usize>| reached.map_or(0, |lv| self.levels[lv]);
        for y in (0..g).filter(|&y| self.take[y] > 0) {
            let count =
                |lv: usize| self.taken[y * l + lv] + if open { self.open[y * l + lv] } else { 0 };
            ring = ring.min(level(first_reaching(l, ring_need, count)));
            slowest = slowest.min(level(first_reaching(l, self.k - 1, count)));
            let count = |q: usize| {
                self.taken_path[y * PATHS + q]
                    + if open {
                        self.open_path[y * PATHS + q]
                    } else {
                        0
                    }
            };
            let reached = first_reaching(PATHS, self.k - 1, count);
            path = path.min(reached.map_or(Path::Sys, |q| BY_INDEX[q]));
        }
        (path, ring, slowest.min(ring))
    }

    /// Each newcomer adds its bandwidth with what is taken plus, counted from both ends
    /// of each new pair, half its `r - 1` best links among the groups still open; the
    /// `r` best of those per-member gains bound the sum. Values are doubled to keep
    /// integers.
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

/// The best worst path and the fastest slowest pair any `k` free GPUs can have: the best
/// levels at which `k` of them pairwise reach it. One GPU has no pairs to cap.
fn caps(c: &Classes, k: usize, levels: &[u64]) -> (Path, u64) {
    if k < 2 {
        return (Path::NvLink, u64::MAX);
    }
    let mut budget = CLIQUE_BUDGET;
    let mut reachable =
        |ok: &dyn Fn(usize, usize) -> bool| clique::exists(c, k, ok, &mut budget) != Some(false);
    let path = BY_INDEX
        .into_iter()
        .find(|&w| reachable(&|x, y| c.path(x, y) >= w))
        .unwrap_or(Path::Sys);
    let slowest = levels
        .iter()
        .copied()
        .find(|&m| reachable(&|x, y| c.between(x, y) >= m))
        .unwrap_or(0);
    (path, slowest)
}

/// Components of the free GPUs at each level, by group (see `Search::component`). The
/// members of a group are joined at a level when they link to each other there, or all
/// to one GPU of another group (twins share their links).
fn components(c: &Classes, levels: &[u64]) -> (Vec<usize>, Vec<usize>) {
    let g = c.len();
    let mut component = vec![LOOSE; levels.len() * g];
    let mut size = vec![1; levels.len() * g];
    let mut parent: Vec<usize> = Vec::with_capacity(g);
    for (l, &t) in levels.iter().enumerate() {
        parent.clear();
        parent.extend(0..g);
        let mut joined = vec![false; g];
        for x in 0..g {
            joined[x] |= c.members[x].len() == 1 || c.between(x, x) >= t;
            for y in x + 1..g {
                if c.between(x, y) >= t {
                    joined[x] = true;
                    joined[y] = true;
                    let (rx, ry) = (root(&mut parent, x), root(&mut parent, y));
                    parent[rx] = ry;
                }
            }
        }
        let mut members = vec![0; g];
        for x in (0..g).filter(|&x| joined[x]) {
            let r = root(&mut parent, x);
            members[r] += c.members[x].len();
        }
        for x in (0..g).filter(|&x| joined[x]) {
            let r = root(&mut parent, x);
            component[l * g + x] = r;
            size[l * g + x] = members[r];
        }
    }
    (component, size)
}

fn root(parent: &mut [usize], mut x: usize) -> usize {
    while parent[x] != x {
        parent[x] = parent[parent[x]];
        x = parent[x];
    }
    x
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
