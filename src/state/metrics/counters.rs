//! Counters for `gpupin metrics`, taken from the audit log: allocations, refusals by
//! reason, releases. The log can hold hundreds of thousands of lines, and a metrics file
//! is rewritten on every ledger change, so the counts are kept with a cursor (which file,
//! how far) and only new lines are read each time.

use crate::base::safe_open::{self, Links};
use crate::input::config::AuditLog;
use crate::state::audit::{Event, EventKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Counters {
    /// `allocate` and `hold` events, by holder kind (container, exec, hold).
    pub allocations: BTreeMap<String, u64>,
    /// `refuse` events, by code (`not_enough_free`, `limit`, ...); a summary line of
    /// suppressed refusals adds what it counted.
    pub refusals: BTreeMap<String, u64>,
    /// `release` and `reap` events, by event.
    pub releases: BTreeMap<String, u64>,
    /// Audit lines that could not be written (`audit_write_failures`); kept in the
    /// state dir, since the log that failed cannot say so.
    #[serde(skip)]
    pub audit_write_failures: u64,
    /// The counts of the log and of its refusals log, each with its cursor.
    #[serde(default)]
    main: Tally,
    #[serde(default)]
    refused: Tally,
    /// Each user's log (`AuditLog::of_user`), by uid.
    #[serde(default)]
    users: BTreeMap<u32, Tally>,
}

/// What one log (its live file and rotated ones) has counted, and how far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Tally {
    allocations: BTreeMap<String, u64>,
    refusals: BTreeMap<String, u64>,
    releases: BTreeMap<String, u64>,
    /// The live log's inode and how far into it the counts go.
    ino: u64,
    offset: u64,
}

impl Tally {
    fn count(&mut self, event: &Event) {
        let bump = |map: &mut BTreeMap<String, u64>, key: &str, n: u64| {
            *map.entry(key.to_string()).or_insert(0) += n;
        };
        match event.event {
            EventKind::Allocate | EventKind::Hold => {
                let kind = event.kind.map_or("container", |k| k.as_str());
                bump(&mut self.allocations, kind, 1);
            }
            EventKind::Refuse if !event.suppressed.is_empty() => {
                for (code, n) in &event.suppressed {
                    bump(&mut self.refusals, code, *n);
                }
            }
            EventKind::Refuse => {
                bump(
                    &mut self.refusals,
                    event.code.as_deref().unwrap_or("other"),
                    1,
                );
            }
            EventKind::Release | EventKind::Reap => {
                bump(&mut self.releases, event.event.as_str(), 1);
            }
            EventKind::Bind | EventKind::Clear | EventKind::Evict | EventKind::Idle => {}
        }
    }

    /// Reads `path` from `from` to its last whole line; returns where that ends.
    fn read_from(&mut self, path: &Path, from: u64) -> std::io::Result<u64> {
        let mut file = safe_open::open(path, Links::Refuse)?;
        file.seek(SeekFrom::Start(from))?;
        let mut reader = BufReader::new(file);
        let mut offset = from;
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line)?;
            // A line being written (no newline yet) is read next time.
            if n == 0 || line.last() != Some(&b'\n') {
                return Ok(offset);
            }
            offset += n as u64;
            if let Ok(event) = serde_json::from_slice::<Event>(&line) {
                self.count(&event);
            }
        }
    }

    /// This tally brought up to date with `log`'s files.
    fn update(self, log: &AuditLog) -> Tally {
        let files = log.files();
        let ino_of = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.ino()).ok();
        let Some(live_ino) = ino_of(&log.path) else {
            // No log yet (or none any more): nothing new to count.
            return self;
        };
        let mut tally = self;
        // Where the cursor's file is now: still the live log, or rotated away.
        let start = files
            .iter()
            .position(|f| tally.ino != 0 && ino_of(f) == Some(tally.ino));
        let len_of = |p: &Path| std::fs::symlink_metadata(p).map(|m| m.len()).unwrap_or(0);
        let (first, mut from) = match start {
            // Truncated in place (audit_keep = 0): what it holds now is all new.
            Some(i) if len_of(&files[i]) < tally.offset => (i, 0),
            Some(i) => (i, tally.offset),
            None => {
                tally = Tally::default();
                (0, 0)
            }
        };
        let mut end = 0;
        for (i, file) in files.iter().enumerate().skip(first) {
            end = tally.read_from(file, from).unwrap_or(from);
            from = 0;
            if i + 1 == files.len() {
                break;
            }
        }
        tally.ino = live_ino;
        tally.offset = end;
        tally
    }
}

/// The counters of `log`, its refusals log and its users' logs, brought up to date from `before` (a
/// cursor saved earlier, or the default to count everything). Files that cannot be read
/// count as empty.
pub(super) fn update(log: &AuditLog, before: Counters) -> Counters {
    let main = before.main.update(log);
    let refused = before.refused.update(&log.refusals());
    let mut earlier = before.users;
    let users: BTreeMap<u32, Tally> = log
        .user_logs()
        .into_iter()
        .map(|uid| {
            let tally = earlier.remove(&uid).unwrap_or_default();
            (uid, tally.update(&log.of_user(uid)))
        })
        .collect();
    let sum = |pick: fn(&Tally) -> &BTreeMap<String, u64>| {
        let mut total = pick(&main).clone();
        for tally in std::iter::once(&refused).chain(users.values()) {
            for (key, n) in pick(tally) {
                *total.entry(key.clone()).or_insert(0) += n;
            }
        }
        total
    };
    Counters {
        allocations: sum(|t| &t.allocations),
        refusals: sum(|t| &t.refusals),
        releases: sum(|t| &t.releases),
        audit_write_failures: before.audit_write_failures,
        main,
        refused,
        users,
    }
}

/// `update`, with the cursor kept in `cursor_file` (a state file of root's), for callers
/// that may write it; others pass `None` and count from the start.
pub(crate) fn update_saved(log: &AuditLog, cursor_file: Option<&Path>) -> Counters {
    let before = cursor_file
        .and_then(|p| safe_open::read(p, Links::Refuse).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let counters = update(log, before);
    if let Some(path) = cursor_file
        && let Ok(bytes) = serde_json::to_vec(&counters)
    {
        let _ = crate::base::atomic::replace(
            path,
            &bytes,
            0o644,
            crate::base::atomic::Durability::Renamed,
        );
    }
    counters
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::EventKind;

    fn refusal(code: &str) -> Event {
        let mut e = Event::new(EventKind::Refuse, "c");
        e.code = Some(code.into());
        e
    }

    #[test]
    fn counts_new_lines_only_and_follows_a_rotation() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog {
            max_bytes: 400,
            keep: 3,
            ..AuditLog::at(tmp.path().join("audit.log"))
        };
        let cursor = tmp.path().join("cursor.json");
        log.append(&Event::new(EventKind::Allocate, "a")).unwrap();
        log.append(&refusal("limit")).unwrap();
        let c = update_saved(&log, Some(&cursor));
        assert_eq!(c.allocations["container"], 1);
        assert_eq!(c.refusals["limit"], 1);
        // Enough lines to rotate both logs at least once; none counted twice.
        for _ in 0..10 {
            log.append(&Event::new(EventKind::Allocate, "b")).unwrap();
            log.append(&refusal("not_enough_free")).unwrap();
        }
        log.append(&Event::new(EventKind::Release, "a")).unwrap();
        assert!(tmp.path().join("audit.log.1").exists(), "rotated");
        assert!(tmp.path().join("audit.refusals.log.1").exists(), "rotated");
        let c = update_saved(&log, Some(&cursor));
        assert_eq!(c.allocations["container"], 11);
        assert_eq!(c.refusals["not_enough_free"], 10);
        assert_eq!(c.refusals["limit"], 1);
        assert_eq!(c.releases["release"], 1);
        // Counted again from scratch: the same (as long as nothing rotated away).
        assert_eq!(update_saved(&log, Some(&cursor)), c);
        assert_eq!(update_saved(&log, None), c);
    }

    #[test]
    fn a_summary_of_suppressed_refusals_counts_what_it_stands_for() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let mut summary = refusal("suppressed");
        summary.suppressed = [("unknown_gpu".to_string(), 690), ("limit".to_string(), 3)]
            .into_iter()
            .collect();
        let lines = [refusal("unknown_gpu"), summary]
            .iter()
            .map(|e| serde_json::to_string(e).unwrap() + "\n")
            .collect::<String>();
        std::fs::write(log.refusals().path, lines).unwrap();
        let c = update(&log, Counters::default());
        assert_eq!(c.refusals["unknown_gpu"], 691);
        assert_eq!(c.refusals["limit"], 3);
        assert!(!c.refusals.contains_key("suppressed"), "{c:?}");
    }
}
