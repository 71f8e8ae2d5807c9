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
            EventKind::Bind
            | EventKind::Clear
            | EventKind::Evict
            | EventKind::Idle
            | EventKind::Drain
            | EventKind::Undrain
            | EventKind::Health => {}
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
            // A cursor that does not end a line of its file (torn, planted, another
            // log's) says nothing true about the counts: all is counted again.
            Some(i) if !ends_a_line(&files[i], tally.offset) => {
                tally = Tally::default();
                (0, 0)
            }
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

/// Whether `offset` is 0 or just after a newline of `path`: where a cursor can be.
fn ends_a_line(path: &Path, offset: u64) -> bool {
    use std::os::unix::fs::FileExt;
    if offset == 0 {
        return true;
    }
    let mut byte = [0u8];
    safe_open::open(path, Links::Refuse)
        .and_then(|f| f.read_exact_at(&mut byte, offset - 1))
        .is_ok_and(|()| byte[0] == b'\n')
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

/// `update`, from the cursor in `cursor_file` (a state file) where there is one to trust,
/// else from the start; the new cursor is saved there by the state dir's owner (root: the
/// metrics file's writer, root's `gpupin metrics`). Anyone else only reads it: a user's
/// `gpupin metrics` writes nothing, and costs what the lines since the last save cost.
pub(crate) fn update_saved(log: &AuditLog, cursor_file: Option<&Path>) -> Counters {
    let before = cursor_file
        .and_then(|p| read_trusted(p).ok())
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let counters = update(log, before);
    if let Some(path) = cursor_file
        && keeps_cursor(path)
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

/// The cursor's bytes, from a regular file (never through a symlink) that root or this
/// user owns and no one else may write, as `update_saved` writes it: counts anyone else
/// could have planted are not counts of the log.
fn read_trusted(path: &Path) -> std::io::Result<Vec<u8>> {
    let (file, stat) = safe_open::open_with_stat(path, Links::Refuse)?;
    safe_open::written_by_us(&stat)
        .map_err(|why| std::io::Error::new(std::io::ErrorKind::PermissionDenied, why))?;
    safe_open::read_file(file, stat.st_size as u64)
}

/// Whether this process is the one to save the cursor at `path`: it owns the directory
/// (the state dir is root's; in tests, the user's own).
fn keeps_cursor(path: &Path) -> bool {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::symlink_metadata(dir)
        .is_ok_and(|m| m.is_dir() && m.uid() == rustix::process::geteuid().as_raw())
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

    /// A cursor that cannot be trusted (torn, garbage, ending mid-line, a
    /// symlink, writable by others) gives the counts of a full recount, never others.
    #[test]
    fn a_torn_stale_or_planted_cursor_counts_as_a_full_recount() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        for _ in 0..5 {
            log.append(&Event::new(EventKind::Allocate, "a")).unwrap();
            log.append(&refusal("limit")).unwrap();
        }
        let full = update(&log, Counters::default());
        let cursor = tmp.path().join("cursor.json");
        let good = serde_json::to_vec(&full).unwrap();
        // Counts of another log: the cursor in the middle of a line of this one.
        let moved = |offset: u64| {
            let mut c = full.clone();
            c.main.offset = offset;
            c.allocations.insert("container".into(), 1_000);
            c.main.allocations.insert("container".into(), 1_000);
            serde_json::to_vec(&c).unwrap()
        };
        let len = std::fs::metadata(&log.path).unwrap().len();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("torn", good[..good.len() / 2].to_vec()),
            ("garbage", b"\x00\xff not json".to_vec()),
            ("empty", Vec::new()),
            ("mid-line", moved(7)),
            ("one short of a line end", moved(len - 1)),
        ];
        for (what, bytes) in cases {
            std::fs::write(&cursor, &bytes).unwrap();
            let c = update_saved(&log, Some(&cursor));
            assert_eq!(c.allocations, full.allocations, "{what}");
            assert_eq!(c.refusals, full.refusals, "{what}");
        }
        // Counts others could have written, however well formed, are not read.
        let planted = {
            let mut c = full.clone();
            c.main.allocations.insert("container".into(), 1_000);
            serde_json::to_vec(&c).unwrap()
        };
        std::fs::write(&cursor, &planted).unwrap();
        std::fs::set_permissions(&cursor, std::fs::Permissions::from_mode(0o666)).unwrap();
        let c = update_saved(&log, Some(&cursor));
        assert_eq!(c.allocations, full.allocations, "writable by others");
        let elsewhere = tmp.path().join("elsewhere.json");
        std::fs::write(&elsewhere, &planted).unwrap();
        std::fs::remove_file(&cursor).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &cursor).unwrap();
        let c = update_saved(&log, Some(&cursor));
        assert_eq!(c.allocations, full.allocations, "a symlink");
        // A good cursor saved by the dir's owner reads on from where it ended.
        std::fs::remove_file(&cursor).unwrap();
        assert_eq!(
            update_saved(&log, Some(&cursor)).allocations,
            full.allocations
        );
        log.append(&Event::new(EventKind::Allocate, "b")).unwrap();
        let c = update_saved(&log, Some(&cursor));
        assert_eq!(c.allocations["container"], 6);
        assert_eq!(c, update(&log, Counters::default()));
    }

    /// Only the owner of the cursor's directory saves it: a reader who is not (a user's
    /// `gpupin metrics` against root's state dir) writes nothing.
    #[test]
    fn only_the_state_dirs_owner_saves_the_cursor() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(keeps_cursor(&tmp.path().join("cursor.json")));
        // The root directory is root's: anyone else is only a reader there.
        let me = rustix::process::geteuid().as_raw();
        assert_eq!(keeps_cursor(Path::new("/cursor.json")), me == 0);
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
