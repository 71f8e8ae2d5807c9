//! GPU-hours: how long each holder had how many GPUs, summed by user, holder or GPU.
//!
//! A holding is an interval with its GPUs: a `release` or `reap` event is
//! [time - held_s, time]; a record still in the ledger is [created_at, now], counted up to
//! now. Each interval is clipped to [since, now] and counts its length once per GPU. A
//! pure function of the events, the records and the two times, so that the sums can be
//! checked with fixed numbers.

use super::{BadValue, Event, EventKind};
use crate::ledger::Record;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{SystemTime, UNIX_EPOCH};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRow {
    pub key: String,
    /// GPU-seconds: exact, where hours would be rounded.
    pub gpu_seconds: u64,
    /// Distinct holders that had a part in the row.
    pub holders: usize,
}

impl UsageRow {
    pub fn gpu_hours(&self) -> f64 {
        self.gpu_seconds as f64 / 3600.0
    }
}

/// The sums over [since, until], the largest row first.
#[derive(Debug, Clone, PartialEq)]
pub struct Usage {
    pub since: SystemTime,
    pub until: SystemTime,
    pub by: By,
    pub rows: Vec<UsageRow>,
    /// All rows together; `holders` counts each holder once, whichever rows it is in.
    pub total: UsageRow,
}

/// One holding: who, which GPUs (as row keys), from when to when (Unix seconds).
struct Span<'a> {
    holder: &'a str,
    who: &'a str,
    gpus: Vec<String>,
    start: u64,
    end: u64,
}

/// GPU-hours between `since` and `now`, from the `release`/`reap` events among `events`
/// (others are ignored) and the ledger's `records`.
///
/// A holder nested in another's GPUs (`within`) is left out: its GPU-hours are already
/// its parent's, and counting both would add up to more than the machine has. A record
/// whose release is among `events` too (read just before it was released) is counted once.
pub fn usage(
    events: &[Event],
    records: &[Record],
    since: SystemTime,
    now: SystemTime,
    by: By,
) -> Usage {
    let (from, until) = (unix(since), unix(now));
    let mut spans: Vec<Span> = events.iter().filter_map(event_span).collect();
    let released = |r: &Record| {
        spans
            .iter()
            .any(|s| s.holder == r.id && s.start.abs_diff(r.created_at) <= 1)
    };
    let live: Vec<Span> = records
        .iter()
        .filter(|r| r.request.within.is_none() && !released(r))
        .map(|r| record_span(r, until))
        .collect();
    spans.extend(live);

    let mut rows: BTreeMap<String, (u64, BTreeSet<&str>)> = BTreeMap::new();
    let mut total = (0, BTreeSet::new());
    for span in &spans {
        let (start, end) = (span.start.max(from), span.end.min(until));
        if end < start {
            continue;
        }
        let seconds = end - start;
        let n = span.gpus.len() as u64;
        let keys: Vec<(&str, u64)> = match by {
            By::User => vec![(span.who, seconds * n)],
            By::Holder => vec![(span.holder, seconds * n)],
            By::Gpu => span.gpus.iter().map(|g| (g.as_str(), seconds)).collect(),
        };
        for (key, amount) in keys {
            let row = rows.entry(key.to_string()).or_default();
            row.0 += amount;
            row.1.insert(span.holder);
        }
        total.0 += seconds * n;
        total.1.insert(span.holder);
    }
    let mut rows: Vec<UsageRow> = rows
        .into_iter()
        .map(|(key, (gpu_seconds, holders))| UsageRow {
            key,
            gpu_seconds,
            holders: holders.len(),
        })
        .collect();
    // Largest first; equal sums in key order, so that the output is stable.
    rows.sort_by(|a, b| {
        b.gpu_seconds
            .cmp(&a.gpu_seconds)
            .then_with(|| a.key.cmp(&b.key))
    });
    Usage {
        since,
        until: now,
        by,
        rows,
        total: UsageRow {
            key: "total".into(),
            gpu_seconds: total.0,
            holders: total.1.len(),
        },
    }
}

fn event_span(event: &Event) -> Option<Span<'_>> {
    if !matches!(event.event, EventKind::Release | EventKind::Reap) || event.within.is_some() {
        return None;
    }
    let end = unix(event.at()?);
    Some(Span {
        holder: &event.holder,
        who: event.who(),
        gpus: event
            .gpus
            .iter()
            .map(|g| g.index.map_or_else(|| g.uuid.clone(), |i| i.to_string()))
            .collect(),
        start: end.saturating_sub(event.held_s?),
        end,
    })
}

fn record_span(record: &Record, now: u64) -> Span<'_> {
    let user = record.owner.as_ref().map(|o| o.user.as_str());
    let engine = record.container.as_ref().and_then(|c| c.engine.as_deref());
    Span {
        holder: &record.id,
        who: super::who(user, engine),
        gpus: record
            .gpus
            .iter()
            .enumerate()
            .map(|(i, uuid)| {
                record
                    .indices
                    .get(i)
                    .map_or_else(|| uuid.clone(), |i| i.to_string())
            })
            .collect(),
        start: record.created_at,
        end: now,
    }
}

/// Seconds since the epoch; a time before it (a broken clock) as the epoch.
fn unix(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::GpuRef;
    use crate::ledger::{ContainerInfo, HolderKind, Mode, Owner};
    use crate::request::{GpuRequest, Origin, Selection};
    use std::time::Duration;

    const HOUR: u64 = 3600;
    /// "Now" in these tests: 2024-05-01T12:00:00Z.
    const NOW: u64 = 1_714_564_800;

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
        Record {
            id: id.into(),
            gpus: indices.iter().map(|i| format!("GPU-{i}")).collect(),
            indices: indices.to_vec(),
            kind: HolderKind::Container,
            owner: None,
            container: Some(ContainerInfo {
                engine: Some("docker".into()),
                ..ContainerInfo::default()
            }),
            until_release: false,
            mode: Mode::Exclusive,
            request: GpuRequest::new(Selection::Count(indices.len() as u32), Origin::Cli),
            source: "test".into(),
            pid: None,
            start_time: None,
            bundle: None,
            claim_digest: None,
            created_at,
            cgroups: Vec::new(),
        }
    }

    fn rows(u: &Usage) -> Vec<(&str, u64, usize)> {
        u.rows
            .iter()
            .map(|r| (r.key.as_str(), r.gpu_seconds, r.holders))
            .collect()
    }

    fn sums(events: &[Event], records: &[Record], since: u64, by: By) -> Usage {
        usage(events, records, time(since), time(NOW), by)
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
        assert_eq!(u.rows[0].gpu_hours(), 2.0);
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
