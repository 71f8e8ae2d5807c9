//! The billing rules of `usage` (see the module above), one holding at a time: a year of
//! a busy box ends hundreds of thousands of holdings, and a query must not keep them all.
//!
//! A holding not nested in another's GPUs (no `within`) bills its own time whatever else
//! happened, so it is summed as it comes and forgotten. Only the holdings whose sums
//! depend on others are kept until the end: those nested in another (`within`), and
//! those that could be another's parent (their id is among `parent_ids`, the `within` of
//! any holding the caller will add). The caller names the possible parents before it
//! adds anything (`Tally::new`); a holding nested in an id not named there makes the
//! tally incomplete (`complete`), and the caller reads again.
//!
//! Nothing here depends on the order holdings come in, so that the rotated files'
//! digests and the raw lines, read file by file, give the answer of the lines merged by
//! time.

use super::rows::{HolderSet, Summing};
use super::{By, Ended, Usage, UsageRow, unix};
use crate::state::ledger::Record;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::time::SystemTime;

/// One holding: who, which GPUs, from when to when (Unix seconds), and inside whose.
#[derive(Debug, Clone)]
pub(crate) struct Span<'a> {
    pub holder: &'a str,
    /// The row `--by holder` puts it in: a container's name, else the id (a container's
    /// cut to 12 characters), as `gpupin status` and `gpupin log` show it.
    pub shown: &'a str,
    pub who: &'a str,
    pub gpus: Vec<Gpu<'a>>,
    pub start: u64,
    pub end: u64,
    pub within: Option<&'a str>,
}

/// One GPU of a holding: the UUID that says which GPU it is (indices are only what it
/// was allocated under), and the row key people read (the index where known).
#[derive(Debug, Clone)]
pub(crate) struct Gpu<'a> {
    pub uuid: &'a str,
    pub key: Cow<'a, str>,
}

/// The sums so far; see the module's comment.
pub(crate) struct Tally<'r> {
    since: SystemTime,
    now: SystemTime,
    from: u64,
    until: u64,
    by: By,
    parent_ids: HashSet<Box<str>>,
    /// A holding nested in an id not among `parent_ids` was added.
    missed_parent: bool,
    records: &'r [Record],
    /// The starts of the ended holdings of the live records' ids: a record whose
    /// release was read too (it was released while this read) is counted once.
    ended_of_records: HashMap<&'r str, Vec<u64>>,
    /// Holdings nested in another, or that could be another's parent.
    kept: Vec<Ended>,
    rows: Summing,
    total_seconds: u64,
    total_holders: HolderSet<u64>,
    ids: Ids,
}

/// A holder id as 64 bits, by a hasher keyed at random for this process (SipHash): a
/// year's hundreds of thousands of distinct ids are counted without keeping them (as
/// strings they took a hundred bytes each). Two of n ids hash alike by a chance of about
/// n^2 / 2^65: for the 360,000 holders of a busy year, 4 in a billion that a count is one
/// short. No one can aim for it: the key is drawn anew for each run.
struct Ids(RandomState);

impl Ids {
    fn of(&self, id: &str) -> u64 {
        self.0.hash_one(id)
    }
}

impl<'r> Tally<'r> {
    /// A tally of GPU-time between `since` and `now` by `by`, with the ledger's `records`
    /// (counted at the end, up to `now`), where the holdings to come are nested in no
    /// other id than `parent_ids` (more do no harm; the records' own are added here).
    pub(super) fn new<'p>(
        records: &'r [Record],
        parent_ids: impl IntoIterator<Item = &'p str>,
        since: SystemTime,
        now: SystemTime,
        by: By,
    ) -> Tally<'r> {
        let mut parents: HashSet<Box<str>> = parent_ids.into_iter().map(Box::from).collect();
        parents.extend(
            records
                .iter()
                .filter_map(|r| r.request.within.as_deref())
                .map(Box::from),
        );
        Tally {
            since,
            now,
            from: unix(since),
            until: unix(now),
            by,
            parent_ids: parents,
            missed_parent: false,
            records,
            ended_of_records: records
                .iter()
                .map(|r| (r.id.as_str(), Vec::new()))
                .collect(),
            kept: Vec::new(),
            rows: Summing::new(),
            total_seconds: 0,
            total_holders: HolderSet::default(),
            ids: Ids(RandomState::new()),
        }
    }

    /// Adds a holding that ended (a `release` or `reap` the caller counts).
    pub(super) fn add(&mut self, span: &Span<'_>) {
        if let Some(starts) = self.ended_of_records.get_mut(span.holder) {
            starts.push(span.start);
        }
        self.take(span);
    }

    /// Whether every holding added so far was nested in an id named to `new`.
    pub(super) fn complete(&self) -> bool {
        !self.missed_parent
    }

    /// The sums: the records not released meanwhile added, then the nested holdings.
    pub(super) fn finish(mut self) -> Usage {
        let released = |r: &Record| {
            self.ended_of_records
                .get(r.id.as_str())
                .is_some_and(|starts| starts.iter().any(|s| s.abs_diff(r.created_at) <= 1))
        };
        let live: Vec<&Record> = self.records.iter().filter(|r| !released(r)).collect();
        for record in live {
            self.take(&record_span(record, self.until));
        }
        let kept = std::mem::take(&mut self.kept);
        let spans: Vec<Span> = kept.iter().map(Ended::span).collect();
        let within_ids: HashSet<&str> = spans.iter().filter_map(|s| s.within).collect();
        let of_holder = index_by_holder(&spans, |id| within_ids.contains(id));
        let parents: Vec<Option<usize>> = (0..spans.len())
            .map(|i| parent(&spans, &of_holder, i))
            .collect();
        for (i, span) in spans.iter().enumerate() {
            if span.within.is_some() {
                let chain: Vec<&Span> = ancestors(&parents, i).iter().map(|&a| &spans[a]).collect();
                self.bill(span, &chain);
            }
        }
        self.sums()
    }

    fn take(&mut self, span: &Span<'_>) {
        let candidate = self.parent_ids.contains(span.holder);
        if let Some(within) = span.within {
            self.missed_parent |= !self.parent_ids.contains(within);
        }
        if span.within.is_some() || candidate {
            self.kept.push(Ended::from_span(span));
        }
        // Nested: billed at the end, once its parents are all known.
        if span.within.is_none() {
            self.bill(span, &[]);
        }
    }

    /// Adds `span`'s time between `from` and `until` that none of `chain` (the holdings
    /// above it, its parent first) covers.
    fn bill(&mut self, span: &Span<'_>, chain: &[&Span<'_>]) {
        let (start, end) = (span.start.max(self.from), span.end.min(self.until));
        if end < start {
            return;
        }
        let nested = !chain.is_empty();
        let holder = self.ids.of(span.holder);
        for gpu in &span.gpus {
            let covers: Vec<(u64, u64)> = chain
                .iter()
                .filter(|a| a.gpus.iter().any(|g| g.uuid == gpu.uuid))
                .map(|a| (a.start, a.end))
                .collect();
            let seconds = uncovered(start, end, covers);
            // A holder with time of its own is one of the row's; a nested one whose
            // time was all its parent's is not (it added nothing).
            if nested && seconds == 0 {
                continue;
            }
            let key = match self.by {
                By::User => span.who,
                By::Holder => span.shown,
                By::Gpu => &gpu.key,
            };
            self.rows.add(key, seconds, holder);
            self.total_seconds += seconds;
            self.total_holders.insert(holder);
        }
    }

    fn sums(self) -> Usage {
        Usage {
            since: self.since,
            until: self.now,
            by: self.by,
            rows: self.rows.finish(),
            total: UsageRow {
                key: "total",
                gpu_seconds: self.total_seconds,
                holders: self.total_holders.len(),
            },
        }
    }
}

/// The indices of `spans` by holder id, of the ids `wanted` keeps, each list in index
/// order: a nested holder's parent is looked up among the holdings of one id, not among
/// all (a year holds hundreds of thousands; looking through all for each nested one was
/// quadratic), and only the few ids looked up are indexed.
fn index_by_holder<'a>(
    spans: &[Span<'a>],
    wanted: impl Fn(&str) -> bool,
) -> HashMap<&'a str, Vec<usize>> {
    let mut of: HashMap<&'a str, Vec<usize>> = HashMap::new();
    for (i, span) in spans.iter().enumerate() {
        if wanted(span.holder) {
            of.entry(span.holder).or_default().push(i);
        }
    }
    of
}

/// The holding `spans[child]` was nested in: one of its parent's id that was there when
/// it began (started no later, ended no earlier). Of several (an id released and taken
/// again within one second), the earliest, then the one that ended first, then by what
/// it held: the answer does not depend on the order the holdings were read in.
fn parent(spans: &[Span], of_holder: &HashMap<&str, Vec<usize>>, child: usize) -> Option<usize> {
    let c = &spans[child];
    let within = c.within?;
    of_holder
        .get(within)?
        .iter()
        .map(|&i| (i, &spans[i]))
        .filter(|&(i, p)| i != child && p.start <= c.start && c.start <= p.end)
        .min_by(|(_, a), (_, b)| earliest(a, b))
        .map(|(i, _)| i)
}

/// The order of `parent`'s choice among holdings of one id.
fn earliest(a: &Span, b: &Span) -> std::cmp::Ordering {
    (a.start, a.end, a.within)
        .cmp(&(b.start, b.end, b.within))
        .then_with(|| {
            a.gpus
                .iter()
                .map(|g| g.uuid)
                .cmp(b.gpus.iter().map(|g| g.uuid))
        })
}

/// The holdings above `spans[i]`, its parent first. A loop (ids reused within a second
/// can make one) ends the chain where it comes back.
fn ancestors(parents: &[Option<usize>], i: usize) -> Vec<usize> {
    let mut chain = Vec::new();
    let mut at = parents[i];
    while let Some(p) = at {
        if p == i || chain.contains(&p) {
            break;
        }
        chain.push(p);
        at = parents[p];
    }
    chain
}

/// Seconds of [start, end] that none of `covers` overlaps.
fn uncovered(start: u64, end: u64, mut covers: Vec<(u64, u64)>) -> u64 {
    covers.sort_unstable();
    let mut at = start;
    let mut free = 0;
    for (s, e) in covers {
        if e <= at {
            continue;
        }
        if s >= end {
            break;
        }
        free += s.saturating_sub(at);
        at = at.max(e);
        if at >= end {
            return free;
        }
    }
    free + end.saturating_sub(at)
}

fn record_span(record: &Record, now: u64) -> Span<'_> {
    let user = record.owner.as_ref().map(|o| o.user.as_str());
    let engine = record.container.as_ref().and_then(|c| c.engine.as_deref());
    Span {
        holder: &record.id,
        shown: record.shown_name(),
        who: crate::state::audit::who(user, engine),
        gpus: record
            .gpus
            .iter()
            .enumerate()
            .map(|(i, uuid)| Gpu {
                uuid,
                key: crate::state::audit::unit_name(record.indices.get(i).copied(), uuid).into(),
            })
            .collect(),
        start: record.created_at,
        end: now,
        within: record.request.within.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a holding is, for comparing parents found in two orders.
    type Shape<'a> = (u64, u64, Option<&'a str>, usize);

    fn shape<'a>(span: &Span<'a>) -> Shape<'a> {
        (span.start, span.end, span.within, span.gpus.len())
    }

    /// The parent of `spans[child]` by a look through all of them.
    fn naive<'a>(spans: &[Span<'a>], child: usize) -> Option<Shape<'a>> {
        let c = &spans[child];
        let within = c.within?;
        spans
            .iter()
            .enumerate()
            .filter(|&(i, p)| i != child && p.holder == within)
            .filter(|(_, p)| p.start <= c.start && c.start <= p.end)
            .min_by(|(_, a), (_, b)| earliest(a, b))
            .map(|(_, p)| shape(p))
    }

    /// Each holding with its parent, as `parent` finds it, sorted.
    fn found<'a>(spans: &[Span<'a>]) -> Vec<(&'a str, Shape<'a>, Option<Shape<'a>>)> {
        let of_holder = index_by_holder(spans, |_| true);
        let mut all: Vec<_> = (0..spans.len())
            .map(|i| {
                let p = parent(spans, &of_holder, i).map(|p| shape(&spans[p]));
                assert_eq!(p, naive(spans, i));
                (spans[i].holder, shape(&spans[i]), p)
            })
            .collect();
        all.sort();
        all
    }

    /// `parent` looks among the holdings of one id; the answer is the one a look through
    /// all of them gives (ids reused within a second, nested chains, self-references),
    /// whatever the order they came in.
    #[test]
    fn the_parent_found_by_id_is_the_parent_found_among_all_in_any_order() {
        let ids = ["a", "b", "c", "d"];
        let uuids = ["GPU-0", "GPU-1"];
        let mut seed = 34u64;
        let mut next = move |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        for _ in 0..200 {
            let mut spans: Vec<Span> = (0..12)
                .map(|_| {
                    let start = next(6);
                    Span {
                        holder: ids[next(4) as usize],
                        shown: "-",
                        who: "-",
                        gpus: (0..next(3))
                            .map(|g| Gpu {
                                uuid: uuids[g as usize % 2],
                                key: "0".into(),
                            })
                            .collect(),
                        start,
                        end: start + next(3),
                        within: (next(2) == 0).then(|| ids[next(4) as usize]),
                    }
                })
                .collect();
            let forward = found(&spans);
            spans.reverse();
            assert_eq!(forward, found(&spans));
        }
    }

    /// A holding nested in an id not named before the tally began makes it incomplete:
    /// its parent may have gone by unkept (the reader reads again).
    #[test]
    fn a_holding_nested_in_an_unnamed_id_leaves_the_tally_incomplete() {
        let now = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000);
        let span = |holder, within| Span {
            holder,
            shown: holder,
            who: "-",
            gpus: vec![Gpu {
                uuid: "GPU-0",
                key: "0".into(),
            }],
            start: 10,
            end: 20,
            within,
        };
        let mut tally = Tally::new(&[], ["p"], std::time::UNIX_EPOCH, now, By::User);
        tally.add(&span("a", None));
        tally.add(&span("b", Some("p")));
        assert!(tally.complete());
        tally.add(&span("c", Some("q")));
        assert!(!tally.complete());
        tally.add(&span("d", Some("p")));
        assert!(!tally.complete(), "stays incomplete");
    }

    #[test]
    fn uncovered_counts_what_no_cover_overlaps() {
        assert_eq!(uncovered(0, 10, vec![]), 10);
        assert_eq!(uncovered(0, 10, vec![(2, 4), (3, 6)]), 6);
        assert_eq!(uncovered(0, 10, vec![(0, 10)]), 0);
        assert_eq!(uncovered(5, 10, vec![(0, 6), (9, 20)]), 3);
        assert_eq!(uncovered(5, 5, vec![]), 0);
    }
}
