//! GPU-hours: how long each holder had how many GPUs, summed by user, holder or GPU.
//!
//! A holding is an interval with its GPUs: a `release` or `reap` event is
//! [time - held_s, time]; a record still in the ledger is [created_at, now], counted up to
//! now. Each interval is clipped to [since, now] and counts its length once per GPU. A
//! pure function of the events, the records and the two times, so that the sums can be
//! checked with fixed numbers.
//!
//! Every GPU-second is billed once. A holder nested in another's GPUs (`within`) shares
//! them with its parent: while the parent, or any holder further up its chain, holds a GPU
//! the nested holder has, that GPU's time is the enclosing holder's; for the rest of the
//! nested holder's life (the parent released or reaped before it, a GPU the parent does
//! not have) it is the nested holder's own. Holder ids are reused, so a parent is the
//! holding of that id that was there when the nested holder began, never a later one.

mod digest;
mod rows;
mod tally;
mod trail;

#[cfg(test)]
mod tests_trail;

pub use rows::{Rows, UsageRow};
pub use trail::{TrailUsage, usage_of_trail};

use crate::state::audit::{BadValue, Event, EventKind};
use crate::state::ledger::Record;
use std::time::{SystemTime, UNIX_EPOCH};
use tally::{Gpu, Span, Tally};

/// What the rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum By {
    /// The user; a container without one under its engine, else `-` (`Event::who`).
    #[default]
    User,
    /// The holder id.
    Holder,
    /// The GPU index (its UUID where the index is not known): one row per GPU.
    Gpu,
}

impl By {
    pub fn parse(text: &str) -> Result<By, BadValue> {
        match text.trim() {
            "user" => Ok(By::User),
            "holder" => Ok(By::Holder),
            "gpu" => Ok(By::Gpu),
            other => Err(BadValue::By(other.to_string())),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            By::User => "user",
            By::Holder => "holder",
            By::Gpu => "gpu",
        }
    }
}

/// The sums over [since, until], the largest row first.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub since: SystemTime,
    pub until: SystemTime,
    pub by: By,
    pub rows: Rows,
    /// All rows together; `holders` counts each holder once, whichever rows it is in.
    pub total: UsageRow<'static>,
}

/// A holding that ended (a `release` or `reap` line), as `usage` needs it: who, which
/// GPUs, from when to when, inside whose. A year of a busy box ends some 370,000
/// holdings; kept as whole `Event`s they took 430 MB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    holder: Box<str>,
    shown: Box<str>,
    who: Box<str>,
    /// Each GPU's UUID and row key.
    gpus: Box<[(Box<str>, Box<str>)]>,
    start: u64,
    end: u64,
    within: Option<Box<str>>,
}

impl Ended {
    /// The holding `event` ends; `None` for an event that ends none (neither a release
    /// nor a reap, or without the time or the `held_s` that place it).
    pub fn of(event: &Event) -> Option<Ended> {
        Some(Ended::from_span(&event_span(event)?))
    }

    fn from_span(span: &Span<'_>) -> Ended {
        Ended {
            holder: span.holder.into(),
            shown: span.shown.into(),
            who: span.who.into(),
            gpus: span
                .gpus
                .iter()
                .map(|g| (g.uuid.into(), g.key.as_ref().into()))
                .collect(),
            start: span.start,
            end: span.end,
            within: span.within.map(Into::into),
        }
    }

    fn span(&self) -> Span<'_> {
        Span {
            holder: &self.holder,
            shown: &self.shown,
            who: &self.who,
            gpus: self
                .gpus
                .iter()
                .map(|(uuid, key)| Gpu {
                    uuid,
                    key: std::borrow::Cow::Borrowed(key),
                })
                .collect(),
            start: self.start,
            end: self.end,
            within: self.within.as_deref(),
        }
    }
}

/// Whether the log's event `event` at `at` is one `usage` counts from `since`: the end
/// of a holding (a release or a reap) since `since`, or before it and nested (a nested
/// holding that ended before still links a holder nested in it to the holders above,
/// which may cover it in the period).
pub fn counts(at: SystemTime, event: &Event, since: SystemTime) -> bool {
    matches!(event.event, EventKind::Release | EventKind::Reap)
        && counts_end(at, event.within.is_some(), since)
}

/// `counts` for the end of a holding at `at` (nested or not), as a digest keeps it.
fn counts_end(at: SystemTime, nested: bool, since: SystemTime) -> bool {
    at >= since || nested
}

/// Whether a raw log line could be an event `counts` keeps, told from its bytes
/// (`AuditLog::events_where`): a line without "release" or "reap" in it, or certainly
/// before `since` without "within", is none. A year of lines is read at the speed of a
/// substring search, and only the ends of holdings parsed. Built once, asked of every
/// line.
pub fn could_end_in(since: SystemTime) -> impl Fn(&[u8]) -> bool + 'static {
    use crate::state::audit::{Needle, before, escaped};
    let [release, reap, within] = [b"release".as_slice(), b"reap", b"within"].map(Needle::new);
    move |line: &[u8]| {
        escaped(line)
            || ((release.in_(line) || reap.in_(line)) && (!before(line, since) || within.in_(line)))
    }
}

/// GPU-hours between `since` and `now`, from the holdings that ended (`Ended::of` the
/// log's `release` and `reap` events) and the ledger's `records`.
///
/// A nested holder (`within`) counts only where no holder up its chain covers it (see
/// the module's comment): counting both would add up to more than the machine has,
/// counting neither lets a job run unbilled inside a parent released at once. Pass every
/// release and reap of the log, not only those since `since`: a parent that ended before
/// it still links a nested holder to the holders above. A record whose release is among
/// `events` too (read just before it was released) is counted once.
pub fn usage(
    ended: &[Ended],
    records: &[Record],
    since: SystemTime,
    now: SystemTime,
    by: By,
) -> Usage {
    let parent_ids = ended.iter().filter_map(|e| e.within.as_deref());
    let mut tally = Tally::new(records, parent_ids, since, now, by);
    for holding in ended {
        tally.add(&holding.span());
    }
    tally.finish()
}

fn event_span(event: &Event) -> Option<Span<'_>> {
    if !matches!(event.event, EventKind::Release | EventKind::Reap) {
        return None;
    }
    let end = unix(event.at()?);
    Some(Span {
        holder: &event.holder,
        shown: event.shown_holder(),
        who: event.who(),
        gpus: event
            .gpus
            .iter()
            .map(|g| Gpu {
                uuid: &g.uuid,
                key: crate::state::audit::unit_name(g.index, &g.uuid).into(),
            })
            .collect(),
        start: end.saturating_sub(event.held_s?),
        end,
        within: event.within.as_deref(),
    })
}

/// Seconds since the epoch; a time before it (a broken clock) as the epoch.
pub(crate) fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::{ContainerInfo, Owner};
    use crate::state::audit::GpuRef;
    use std::time::Duration;

    const HOUR: u64 = 3600;
    /// "Now" in these tests: 2024-05-01T12:00:00Z.
    const NOW: u64 = 1_714_564_800;

    proptest::proptest! {
        /// Whatever the kind, the time, the names (quotes, backslashes, "release" in a
        /// reason) and the nesting, an event `counts` keeps is never ruled out by the
        /// bytes of its line.
        #[test]
        fn a_line_usage_counts_is_never_ruled_out_by_its_bytes(
            kind in proptest::sample::select(vec![EventKind::Release, EventKind::Reap, EventKind::Allocate, EventKind::Hold, EventKind::Refuse]),
            holder in "[a-z\"\\\\é-]{1,10}",
            within in proptest::option::of("[a-z\"\\\\-]{1,8}"),
            reason in proptest::option::of("(released|reaped|[a-z \"\\\\]{0,8})"),
            end in NOW - 10..NOW + 10,
            since in NOW - 10..NOW + 10,
        ) {
            let mut event = Event::new(kind, &holder);
            event.time = humantime::format_rfc3339_seconds(time(end)).to_string();
            event.within = within;
            event.reason = reason;
            let line = serde_json::to_string(&event).unwrap();
            let read: Event = serde_json::from_str(&line).unwrap();
            if counts(read.at().unwrap(), &read, time(since)) {
                proptest::prop_assert!(could_end_in(time(since))(line.as_bytes()), "{}", line);
            }
        }
    }

    #[test]
    fn lines_that_cannot_end_a_holding_in_the_period_are_ruled_out_by_their_bytes() {
        let line = |kind: &str, secs: u64, extra: &str| {
            let at = humantime::format_rfc3339_seconds(time(secs));
            format!(r#"{{"time":"{at}","event":"{kind}","holder":"h"{extra}}}"#)
        };
        let since = time(NOW);
        let test = could_end_in(since);
        let could = |l: String| test(l.as_bytes());
        assert!(!could(line("allocate", NOW + 5, "")));
        assert!(!could(line("release", NOW - 5, "")));
        assert!(could(line("release", NOW + 5, "")));
        assert!(could(line("reap", NOW, "")));
        assert!(could(line("release", NOW - 5, r#","within":"p""#)));
        // An escape can spell anything: parsed.
        assert!(could(line("allocate", NOW - 5, r#","reason":"a\"b""#)));
    }

    fn time(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// A `kind` event at `end` for a holding of `held` seconds of GPUs `indices`.
    fn ended(
        kind: EventKind,
        holder: &str,
        user: &str,
        indices: &[u32],
        end: u64,
        held: u64,
    ) -> Event {
        Event {
            time: humantime::format_rfc3339_seconds(time(end)).to_string(),
            user: Some(user.into()),
            gpus: indices
                .iter()
                .map(|&i| GpuRef {
                    index: Some(i),
                    uuid: format!("GPU-{i}"),
                })
                .collect(),
            held_s: Some(held),
            ..Event::new(kind, holder)
        }
    }

    fn record(id: &str, indices: &[u32], created_at: u64) -> Record {
        let gpus: Vec<String> = indices.iter().map(|i| format!("GPU-{i}")).collect();
        let gpus: Vec<&str> = gpus.iter().map(String::as_str).collect();
        Record {
            indices: indices.to_vec(),
            container: Some(ContainerInfo {
                engine: Some("docker".into()),
                ..ContainerInfo::default()
            }),
            request: GpuRequest::new(Selection::Count(indices.len() as u32), Origin::Cli),
            source: "test".into(),
            pid: None,
            start_time: None,
            created_at,
            ..crate::state::ledger::testing::record(id, &gpus)
        }
    }

    fn rows(u: &Usage) -> Vec<(&str, u64, usize)> {
        u.rows
            .iter()
            .map(|r| (r.key, r.gpu_seconds, r.holders))
            .collect()
    }

    fn sums(events: &[Event], records: &[Record], since: u64, by: By) -> Usage {
        let ended: Vec<Ended> = events.iter().filter_map(Ended::of).collect();
        usage(&ended, records, time(since), time(NOW), by)
    }

    #[test]
    fn an_interval_straddling_since_counts_from_since() {
        // Held 5h, released 1h ago; since 3h ago: 2h of it count.
        let events = [ended(
            EventKind::Release,
            "c1",
            "alice",
            &[0],
            NOW - HOUR,
            5 * HOUR,
        )];
        let u = sums(&events, &[], NOW - 3 * HOUR, By::User);
        assert_eq!(rows(&u), [("alice", 2 * HOUR, 1)]);
        assert_eq!(u.total.gpu_seconds, 2 * HOUR);
    }

    #[test]
    fn an_interval_ended_before_since_counts_nothing() {
        let events = [ended(
            EventKind::Reap,
            "c1",
            "alice",
            &[0],
            NOW - 4 * HOUR,
            HOUR,
        )];
        let u = sums(&events, &[], NOW - 3 * HOUR, By::User);
        assert_eq!(rows(&u), []);
        assert_eq!((u.total.gpu_seconds, u.total.holders), (0, 0));
    }

    #[test]
    fn a_live_record_counts_up_to_now_and_since_clips_it() {
        let records = [record("web", &[2], NOW - 10 * HOUR)];
        let u = sums(&[], &records, NOW - 7 * 24 * HOUR, By::User);
        assert_eq!(rows(&u), [("docker", 10 * HOUR, 1)]);
        let u = sums(&[], &records, NOW - 4 * HOUR, By::Holder);
        assert_eq!(rows(&u), [("web", 4 * HOUR, 1)]);
    }

    #[test]
    fn several_gpus_count_once_each() {
        let events = [ended(
            EventKind::Release,
            "train",
            "bob",
            &[0, 1, 2, 3],
            NOW,
            HOUR / 2,
        )];
        let u = sums(&events, &[], 0, By::User);
        assert_eq!(rows(&u), [("bob", 2 * HOUR, 1)]);
        assert_eq!(u.rows.iter().next().unwrap().gpu_hours(), 2.0);
    }

    #[test]
    fn rows_by_user_holder_and_gpu_add_up_to_the_same_total() {
        let events = [
            ended(EventKind::Release, "a1", "alice", &[0, 1], NOW - HOUR, HOUR),
            ended(EventKind::Reap, "a2", "alice", &[1], NOW - HOUR, 3 * HOUR),
            ended(EventKind::Release, "b1", "bob", &[3], NOW, HOUR),
            // Not an interval: only release and reap end one.
            ended(EventKind::Allocate, "b2", "bob", &[3], NOW, 9 * HOUR),
        ];
        let records = [record("web", &[1, 3], NOW - HOUR / 2)];
        let by_user = sums(&events, &records, 0, By::User);
        assert_eq!(
            rows(&by_user),
            [
                ("alice", 5 * HOUR, 2),
                ("bob", HOUR, 1),
                ("docker", HOUR, 1)
            ]
        );
        let by_holder = sums(&events, &records, 0, By::Holder);
        assert_eq!(
            rows(&by_holder),
            [
                ("a2", 3 * HOUR, 1),
                ("a1", 2 * HOUR, 1),
                ("b1", HOUR, 1),
                ("web", HOUR, 1)
            ]
        );
        let by_gpu = sums(&events, &records, 0, By::Gpu);
        assert_eq!(
            rows(&by_gpu),
            [
                ("1", 4 * HOUR + HOUR / 2, 3),
                ("3", HOUR + HOUR / 2, 2),
                ("0", HOUR, 1)
            ]
        );
        for u in [by_user, by_holder, by_gpu] {
            assert_eq!(
                (u.total.gpu_seconds, u.total.holders),
                (7 * HOUR, 4),
                "{:?}",
                u.by
            );
        }
    }

    #[test]
    fn a_nested_holder_is_its_parents_time_not_more() {
        let mut nested = ended(EventKind::Release, "job", "alice", &[0], NOW, HOUR);
        nested.within = Some("res".into());
        let mut res = record("res", &[0, 1], NOW - 2 * HOUR);
        res.owner = Some(Owner {
            uid: 1000,
            user: "alice".into(),
            groups: vec![],
        });
        let u = sums(&[nested], &[res], 0, By::User);
        assert_eq!(rows(&u), [("alice", 4 * HOUR, 1)]);
    }

    /// `ended`, nested in `parent`.
    fn nested(holder: &str, parent: &str, indices: &[u32], end: u64, held: u64) -> Event {
        let mut e = ended(EventKind::Release, holder, "alice", indices, end, held);
        e.within = Some(parent.into());
        e
    }

    fn alices(id: &str, indices: &[u32], created_at: u64, within: Option<&str>) -> Record {
        let mut r = record(id, indices, created_at);
        r.container = None;
        r.owner = Some(Owner {
            uid: 1000,
            user: "alice".into(),
            groups: vec![],
        });
        r.request.within = within.map(String::from);
        r
    }

    /// (holder, GPU-seconds) rows, and the total.
    fn by_holder(events: &[Event], records: &[Record]) -> (Vec<(String, u64)>, u64) {
        let u = sums(events, records, 0, By::Holder);
        let rows = u
            .rows
            .iter()
            .map(|r| (r.key.to_string(), r.gpu_seconds))
            .collect();
        (rows, u.total.gpu_seconds)
    }

    fn pairs(list: &[(&str, u64)]) -> Vec<(String, u64)> {
        list.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    }

    #[test]
    fn a_nested_holder_whose_parent_was_released_at_once_pays_for_the_rest() {
        // The finding: hold a parent, start a 2-GPU job within it, release the parent at
        // once; the job ran 20 s. Parent [0, 2], job [1, 21].
        let t0 = NOW - 100;
        let parent = ended(EventKind::Release, "res", "alice", &[0, 1], t0 + 2, 2);
        let job = nested("job", "res", &[0, 1], t0 + 21, 20);
        let (rows, total) = by_holder(&[parent, job], &[]);
        assert_eq!(rows, pairs(&[("job", 2 * 19), ("res", 2 * 2)]));
        // Two GPUs from t0 to t0 + 21, each second once.
        assert_eq!(total, 2 * 21);
    }

    #[test]
    fn a_nested_holder_inside_a_parent_that_outlives_it_adds_nothing() {
        let parent = ended(EventKind::Release, "res", "alice", &[0, 1], NOW, 100);
        let job = nested("job", "res", &[0, 1], NOW - 10, 50);
        let events = [job, parent];
        let (held, total) = by_holder(&events, &[]);
        assert_eq!(held, pairs(&[("res", 200)]));
        assert_eq!(total, 200);
        // The job had no time of its own: it is not one of alice's holders either.
        let u = sums(&events, &[], 0, By::User);
        assert_eq!(rows(&u), [("alice", 200, 1)]);
    }

    #[test]
    fn a_gpu_the_parent_does_not_hold_is_the_nested_holders() {
        let parent = alices("res", &[0, 1], NOW - 100, None);
        let job = nested("job", "res", &[1, 2], NOW - 10, 50);
        let (rows, total) = by_holder(&[job], &[parent]);
        assert_eq!(rows, pairs(&[("res", 200), ("job", 50)]));
        assert_eq!(total, 250);
    }

    #[test]
    fn a_chain_of_three_bills_each_second_to_the_outermost_holder_then_there() {
        // A holds 0-2 over [0, 30]; B within A holds 0-1 over [10, 50]; C within B holds
        // 0 over [20, 80].
        let t0 = NOW - 1000;
        let a = ended(EventKind::Release, "a", "alice", &[0, 1, 2], t0 + 30, 30);
        let b = nested("b", "a", &[0, 1], t0 + 50, 40);
        let c = nested("c", "b", &[0], t0 + 80, 60);
        let (rows, total) = by_holder(&[a.clone(), b.clone(), c.clone()], &[]);
        // A: 3 GPUs x 30 s; B: 2 GPUs x [30, 50]; C: GPU 0 x [50, 80].
        assert_eq!(rows, pairs(&[("a", 90), ("b", 40), ("c", 30)]));
        // GPU 0 was held over [0, 80], GPU 1 over [0, 50], GPU 2 over [0, 30].
        assert_eq!(total, 80 + 50 + 30);
        let by_gpu = sums(&[a.clone(), b.clone(), c.clone()], &[], 0, By::Gpu);
        let gpus: Vec<(&str, u64)> = by_gpu.rows.iter().map(|r| (r.key, r.gpu_seconds)).collect();
        assert_eq!(gpus, [("0", 80), ("1", 50), ("2", 30)]);
        // With A up to the end, A covers C through B although B is gone.
        let long_a = ended(EventKind::Release, "a", "alice", &[0, 1, 2], t0 + 100, 100);
        let (rows, total) = by_holder(&[long_a, b, c], &[]);
        assert_eq!(rows, pairs(&[("a", 300)]));
        assert_eq!(total, 300);
    }

    #[test]
    fn a_parent_id_taken_again_later_does_not_cover_the_nested_holder() {
        // res over [0, 10]; job within it over [5, 100]; another holder named res, not
        // the job's parent, over [20, now].
        let t0 = NOW - 200;
        let first = ended(EventKind::Release, "res", "alice", &[0], t0 + 10, 10);
        let job = nested("job", "res", &[0], t0 + 100, 95);
        let later = record("res", &[0], t0 + 20);
        let (rows, total) = by_holder(&[first, job], &[later]);
        // res: 10 + 180; job: [10, 100].
        assert_eq!(rows, pairs(&[("res", 190), ("job", 90)]));
        assert_eq!(total, 280);
    }

    #[test]
    fn running_nested_holders_count_up_to_now() {
        // Both live: the parent covers the job.
        let parent = alices("res", &[0, 1], NOW - 100, None);
        let job = alices("job", &[0, 1], NOW - 95, Some("res"));
        let (rows, total) = by_holder(&[], &[parent, job.clone()]);
        assert_eq!(rows, pairs(&[("res", 200)]));
        assert_eq!(total, 200);
        // The parent released 90 s ago, the job runs on: its last 90 s are its own.
        let released = ended(EventKind::Release, "res", "alice", &[0, 1], NOW - 90, 10);
        let (rows, total) = by_holder(&[released], &[job]);
        assert_eq!(rows, pairs(&[("job", 180), ("res", 20)]));
        assert_eq!(total, 200);
    }

    /// A container no engine named is summed under a name that says so, not a bare `-`.
    #[test]
    fn a_holder_of_no_user_and_no_engine_is_named_so() {
        let mut released = ended(EventKind::Release, "c9", "-", &[0], NOW - HOUR, HOUR);
        released.user = None;
        released.container.engine = None;
        let u = sums(&[released], &[], 0, By::User);
        assert_eq!(rows(&u), [("(no engine)", HOUR, 1)]);
    }

    #[test]
    fn a_record_released_while_being_read_counts_once() {
        let records = [record("web", &[0], NOW - 2 * HOUR)];
        let mut released = ended(EventKind::Release, "web", "-", &[0], NOW - HOUR, HOUR + 1);
        released.user = None;
        let u = sums(&[released], &records, 0, By::Holder);
        assert_eq!(rows(&u), [("web", HOUR + 1, 1)]);
    }

    #[test]
    fn an_interval_past_now_is_clipped_to_now() {
        // A clock stepped back: the event is "in the future".
        let events = [ended(
            EventKind::Release,
            "c1",
            "alice",
            &[0],
            NOW + HOUR,
            2 * HOUR,
        )];
        let u = sums(&events, &[], 0, By::User);
        assert_eq!(rows(&u), [("alice", HOUR, 1)]);
    }
}
