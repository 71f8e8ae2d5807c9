//! One holder as `gpupin status` shows it: who it is (a container's name and image where
//! its engine told them, a person's job or hold with their user name), its process and
//! its age; and the same as JSON.

use super::table::Cell;
use crate::model::holder::HolderKind;
use crate::state::ledger::{Mode, Record};
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// What the table shows where a pid would be, for a hold without a process.
pub(super) const UNTIL_RELEASED: &str = "until released";

/// How people know a holder: a container's name where its engine told it, else its id.
pub(super) fn label(r: &Record) -> String {
    r.shown_name().to_string()
}

/// A holder's row after the GPU index: HOLDER, KIND, IMAGE, PID, AGE. `idle`: since when
/// it is idle (`Ledger::idle`), if it is.
pub(super) fn cells(r: &Record, now: SystemTime, grace: Duration, idle: Option<u64>) -> [Cell; 5] {
    let container = r.container.as_ref();
    let kind = match r.kind {
        HolderKind::Container => container
            .and_then(|c| c.engine.clone())
            .unwrap_or("container".into()),
        HolderKind::Exec | HolderKind::Hold => r.kind.as_str().into(),
    };
    let image = container.and_then(|c| c.image.clone()).unwrap_or_default();
    let pid = match (r.pid, r.until_release) {
        (Some(pid), _) => pid.to_string(),
        (None, true) => match r.expires_at {
            Some(end) => until(now, end),
            None => UNTIL_RELEASED.into(),
        },
        (None, false) => String::new(),
    };
    [
        Cell {
            text: label(r),
            tail: tags(r, now, grace, idle),
            keep_end: false,
        },
        Cell::from(kind),
        Cell {
            text: image,
            tail: String::new(),
            keep_end: true,
        },
        Cell::from(pid),
        Cell::from(age(now, r)),
    ]
}

/// When a hold for a while (`gpupin hold --for 3h`) ends, in UTC as the audit log writes
/// times: `until 17:05 UTC` within a day, else with the date, `until 12-07 17:05 UTC`.
fn until(now: SystemTime, end: u64) -> String {
    let at = std::time::UNIX_EPOCH + Duration::from_secs(end);
    // 2026-12-05T17:05:00Z
    let stamp = humantime::format_rfc3339_seconds(at).to_string();
    let within_a_day = at
        .duration_since(now)
        .is_ok_and(|left| left < Duration::from_secs(24 * 3600));
    match within_a_day {
        true => format!("until {} UTC", &stamp[11..16]),
        false => format!("until {} {} UTC", &stamp[5..10], &stamp[11..16]),
    }
}

/// ` (alice, shared, 20GiB, idle 1h05m)`: the person a job or hold is for, how it shares
/// its GPUs, whether it is idle or gone; nothing for a busy running exclusive container.
fn tags(r: &Record, now: SystemTime, grace: Duration, idle: Option<u64>) -> String {
    let mut tags: Vec<String> = Vec::new();
    if let Some(owner) = &r.owner {
        tags.push(owner.user.clone());
    }
    if r.mode == Mode::Shared {
        tags.push("shared".into());
        tags.extend(r.request.reserve.map(crate::base::units::format_size));
    }
    if let Some(end) = r.expires_at {
        let end = crate::base::clock::unix(end);
        let left = end.duration_since(now).unwrap_or_default().as_secs();
        tags.push(format!("{} left", short_duration(left)));
    }
    if let Some(reason) = &r.reason {
        tags.push(reason.clone());
    }
    if r.is_stale(now, grace) {
        tags.push("gone".into());
    } else if let Some(since) = idle {
        tags.push(format!("idle {}", idle_for(now, since)));
    }
    match tags.is_empty() {
        true => String::new(),
        false => format!(" ({})", tags.join(", ")),
    }
}

/// How long the holder has held its GPUs: `42s`, `12m`, `3h05m`, `2d04h`. A record from
/// the future (a clock stepped back) is `0s` old.
fn age(now: SystemTime, r: &Record) -> String {
    age_of(now, r)
}

/// `age`, for the one-line-per-GPU view's SINCE.
pub(super) fn age_of(now: SystemTime, r: &Record) -> String {
    let s = now
        .duration_since(r.created())
        .unwrap_or_default()
        .as_secs();
    short_duration(s)
}

/// How long a holder idle since `since` (seconds since the Unix epoch) has been: `1h05m`.
pub(super) fn idle_for(now: SystemTime, since: u64) -> String {
    short_duration(idle_seconds(now, since))
}

/// Seconds from `since` (since the Unix epoch) to `now`; 0 for a time ahead of it.
pub(super) fn idle_seconds(now: SystemTime, since: u64) -> u64 {
    now.duration_since(crate::base::clock::unix(since))
        .map_or(0, |d| d.as_secs())
}

/// `42s`, `12m`, `3h05m`, `2d04h`.
fn short_duration(s: u64) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{:02}h", s / 86400, s % 86400 / 3600),
    }
}

pub(super) fn since(record: &Record) -> String {
    humantime::format_rfc3339_seconds(record.created()).to_string()
}

/// A holder in `gpupin status --json`. `owner` and `container` are null where unknown,
/// and so are the container's engine, name and image each; `idle` is null but for a
/// holder found idle: since when, and for how many seconds.
pub(super) fn json(r: &Record, now: SystemTime, grace: Duration, idle: Option<u64>) -> Value {
    json!({
        "id": r.id,
        "kind": r.kind,
        "owner": r.owner.as_ref().map(|o| json!({"uid": o.uid, "user": o.user})),
        "container": r.container.as_ref().map(|c| json!({
            "engine": c.engine, "name": c.name, "image": c.image,
        })),
        "gpus": r.gpus,
        "mode": r.mode,
        "pid": r.pid,
        "until_release": r.until_release,
        "since": since(r),
        "source": r.source,
        "state": if r.is_stale(now, grace) { "gone" } else { "running" },
        "request": r.request,
        "reason": r.reason,
        "memory_limit": r.memory_limit,
        "expires_at": r.expires_at.map(|s| humantime::format_rfc3339_seconds(
            crate::base::clock::unix(s)
        ).to_string()),
        "idle": idle.map(|since| json!({
            "since": humantime::format_rfc3339_seconds(
                crate::base::clock::unix(since)
            ).to_string(),
            "seconds": idle_seconds(now, since),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_for_a_while_shows_when_it_ends() {
        let now = std::time::UNIX_EPOCH + Duration::from_secs(1_780_000_000);
        // 2026-05-28T20:26:40Z; three hours on, then two days on.
        assert_eq!(until(now, 1_780_000_000 + 3 * 3600), "until 23:26 UTC");
        assert_eq!(
            until(now, 1_780_000_000 + 2 * 86400),
            "until 05-30 20:26 UTC"
        );
    }

    #[test]
    fn ages_read_like_uptime() {
        let created = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let r = crate::state::ledger::testing::record("c", &[]);
        let r = Record {
            created_at: 1_000_000,
            cgroups: Vec::new(),
            expires_at: None,
            reason: None,
            ..r
        };
        let at = |s: u64| age(created + Duration::from_secs(s), &r);
        assert_eq!(at(0), "0s");
        assert_eq!(at(59), "59s");
        assert_eq!(at(12 * 60 + 59), "12m");
        assert_eq!(at(3 * 3600 + 5 * 60), "3h05m");
        assert_eq!(at(2 * 86400 + 4 * 3600 + 59), "2d04h");
        assert_eq!(age(created - Duration::from_secs(5), &r), "0s");
    }

    /// A record written with an end no clock can reach (before holds were bounded, or by
    /// hand) and times past the year 9999 still show, for everyone, rather than panic.
    #[test]
    fn times_no_clock_reaches_still_show() {
        let r = crate::state::ledger::testing::record("h", &[]);
        let r = Record {
            created_at: u64::MAX,
            expires_at: Some(u64::MAX),
            ..r
        };
        let now = SystemTime::now();
        let grace = Duration::from_secs(5);
        let tags = tags(&r, now, grace, Some(u64::MAX));
        assert!(tags.contains(" left"), "{tags}");
        let json = json(&r, now, grace, Some(u64::MAX));
        assert_eq!(json["expires_at"], "9999-12-31T23:59:59Z");
        assert_eq!(json["idle"]["since"], "9999-12-31T23:59:59Z");
        assert_eq!(age_of(now, &r), "0s");
    }
}
