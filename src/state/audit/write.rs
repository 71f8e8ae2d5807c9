//! Appending to the audit log, and rotating it when it grows past its cap.
//!
//! Many processes append at once (hooks, the shim, `gpupin serve`): each line is one
//! `write(2)` to a file opened with O_APPEND, under an flock of `<log>.lock` (root's
//! alone: a user can flock the log itself, which everyone may read). A line is written
//! whole or not at all: a write a full file system cuts short is taken back. Rotation
//! happens under the same lock, and only by a writer that still has the file the path
//! names (another may have rotated it a moment ago), so no rotated file is overwritten.
//!
//! The events of a user's holders (those with a uid other than root's) go to a log of
//! that user's (`audit.users/<uid>.log`), rotated on its own: one user looping
//! hold-then-release fills only their own files, and cannot rotate another user's
//! allocations, or root's and the containers', out of the trail or of `gpupin usage`.
//!
//! Refusals go to a log of their own beside it (`audit.refusals.log` for `audit.log`),
//! rotated the same way: anyone may be refused as often as they like, and their refusals
//! must never push an allocation, hold, bind or release out of the rotated files. Each
//! refusal line is bounded (`Event::bounded`), and at most `REFUSALS_PER_MINUTE` of one
//! requester (a uid; a container without one by its engine) are written in full per
//! minute; the rest are counted and written as one summary line with the next refusal
//! after that minute (`(N more refusals of alice suppressed ...)`).

use super::{Event, EventKind};
use crate::base::safe_open;
use crate::input::config::AuditLog;
use crate::model::holder::ContainerInfo;
use rustix::fs::FlockOperation;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Refusal lines of one requester written in full per minute; the rest are summarised.
pub const REFUSALS_PER_MINUTE: u32 = 20;
/// A refusal line longer than this, even with its values bounded, loses its `request`.
const MAX_REFUSAL_LINE: usize = 8 << 10;
/// Requesters tracked per minute; past this, new ones share one budget (`others`), so
/// that the budget file stays small whatever the number of uids or engines.
const MAX_KEYS: usize = 1024;

/// Who used the machine's GPUs is as open as `gpupin status`: everyone may read the log.
/// An administrator who wants the history private makes its directory 0750 (gpupin only
/// creates the directory when it is missing and never changes its mode).
const LOG_MODE: u32 = 0o644;
/// The writers' lock (`writer_lock`): root's alone, so that no one else can hold it.
const LOCK_MODE: u32 = 0o600;
const DIR_MODE: u32 = 0o755;

/// An audit line that could not be written.
#[derive(Debug, thiserror::Error)]
#[error("could not write the audit log {}", path.display())]
pub struct WriteError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The config's `AuditLog` written to and read back here (its settings are the config's).
impl AuditLog {
    /// The live file and the rotated ones that exist, oldest first.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = (1..=self.keep.max(1))
            .rev()
            .map(|n| rotated(&self.path, n))
            .filter(|p| p.symlink_metadata().is_ok())
            .collect();
        files.push(self.path.clone());
        files
    }

    /// Appends `event`; a refusal goes to the refusals log, bounded and rate-limited.
    /// The caller decides what a failure means (`audit_failure` for an allocation; a
    /// warning for a release, which has happened whatever the log says).
    pub fn append(&self, event: &Event) -> Result<(), WriteError> {
        match (event.event, event.uid) {
            (EventKind::Refuse, _) => self.append_refusal(event, now()),
            // A user's holders in a log of their own (`of_user`).
            (_, Some(uid)) if uid != 0 => {
                let theirs = self.of_user(uid);
                theirs.try_append(event).map_err(|source| WriteError {
                    path: theirs.path.clone(),
                    source,
                })
            }
            _ => self.try_append(event).map_err(|source| WriteError {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// The users whose logs exist (`of_user`), by uid; a name that is no uid's log, or an
    /// entry that is no regular file, is none.
    pub fn user_logs(&self) -> Vec<u32> {
        let Ok(entries) = fs::read_dir(self.users_dir()) else {
            return Vec::new();
        };
        let mut uids: Vec<u32> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| {
                let name = e.file_name();
                name.to_str()?.strip_suffix(".log")?.parse().ok()
            })
            .collect();
        uids.sort_unstable();
        uids
    }

    /// Writes `event` (a refusal) to the refusals log, unless its requester has had
    /// `REFUSALS_PER_MINUTE` lines written in the minute of `now` (Unix seconds): then
    /// it is only counted, and the count written as one line with the first refusal of a
    /// later minute.
    fn append_refusal(&self, event: &Event, now: u64) -> Result<(), WriteError> {
        let log = self.refusals();
        let failed = |source| WriteError {
            path: log.path.clone(),
            source,
        };
        log.ensure_dir().map_err(failed)?;
        let budget_path = budget_path(&log.path);
        let mut file =
            safe_open::open_read_write(&budget_path, LOG_MODE).map_err(|source| WriteError {
                path: budget_path.clone(),
                source,
            })?;
        rustix::fs::flock(&file, FlockOperation::LockExclusive).map_err(|e| failed(e.into()))?;
        let mut budget = read_budget(&mut file);
        let minute = now / 60;
        let mut lines = Vec::new();
        if budget.minute != minute {
            for (key, spent) in std::mem::take(&mut budget.keys) {
                if !spent.suppressed.is_empty() {
                    lines.push(summary(&key, spent, budget.minute));
                }
            }
            budget.minute = minute;
        }
        let event = event.bounded();
        let mut key = requester(&event);
        if !budget.keys.contains_key(&key) && budget.keys.len() >= MAX_KEYS {
            key = "others".into();
        }
        let spent = budget.keys.entry(key).or_insert_with(|| Spent {
            user: event.user.clone(),
            uid: event.uid,
            engine: event.container.engine.clone(),
            ..Spent::default()
        });
        if spent.written < REFUSALS_PER_MINUTE {
            spent.written += 1;
            lines.push(event);
        } else {
            let code = event.code.clone().unwrap_or_else(|| "other".into());
            *spent.suppressed.entry(code).or_default() += 1;
        }
        for line in &lines {
            log.try_append(line).map_err(failed)?;
        }
        write_budget(&mut file, &budget).map_err(|source| WriteError {
            path: budget_path.clone(),
            source,
        })
    }

    fn try_append(&self, event: &Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(event).map_err(std::io::Error::other)?;
        if event.event == EventKind::Refuse && line.len() > MAX_REFUSAL_LINE {
            let short = Event {
                request: None,
                truncated: true,
                ..event.clone()
            };
            line = serde_json::to_vec(&short).map_err(std::io::Error::other)?;
        }
        line.push(b'\n');
        self.ensure_dir()?;
        let _writing = self.writer_lock()?;
        let mut file = safe_open::open_append(&self.path, LOG_MODE)?;
        if file.metadata()?.len() + line.len() as u64 > self.max_bytes {
            file = self.rotate(file)?;
        }
        append_whole(&file, &line)
    }

    /// The lock every writer of this log holds while it appends or rotates: an flock of
    /// `<log>.lock`, a file of root's that only root may open, so that no user can take it
    /// and stall the writers (anyone may open the log itself, and flock what they open).
    fn writer_lock(&self) -> std::io::Result<fs::File> {
        let mut name = self.path.as_os_str().to_os_string();
        name.push(".lock");
        let lock = safe_open::open_read_write(Path::new(&name), LOCK_MODE)?;
        rustix::fs::flock(&lock, FlockOperation::LockExclusive)?;
        Ok(lock)
    }

    /// Creates the log's directory when missing; refuses one that is a symlink or that
    /// others could write (they could swap the log for a link to any file root appends to).
    fn ensure_dir(&self) -> std::io::Result<()> {
        let Some(dir) = self.path.parent().filter(|d| !d.as_os_str().is_empty()) else {
            return Ok(());
        };
        if dir.symlink_metadata().is_err() {
            match fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
            {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        let meta = dir.symlink_metadata()?;
        let me = rustix::process::geteuid().as_raw();
        let safe = meta.is_dir()
            && meta.permissions().mode() & 0o022 == 0
            && (meta.uid() == me || meta.uid() == 0);
        if !safe {
            return Err(std::io::Error::other(format!(
                "refusing audit log directory {}: not a directory of root's that only its owner may write",
                dir.display()
            )));
        }
        Ok(())
    }

    /// Rotates the log `file` is open on, unless another writer has just done so; returns
    /// the file to append to.
    /// The caller holds `writer_lock`.
    fn rotate(&self, file: fs::File) -> std::io::Result<fs::File> {
        let still_ours = fs::symlink_metadata(&self.path)
            .and_then(|now| file.metadata().map(|open| now.ino() == open.ino()))
            .unwrap_or(false);
        if !still_ours {
            return safe_open::open_append(&self.path, LOG_MODE);
        }
        if file.metadata()?.len() <= self.max_bytes / 2 {
            // Rotated and refilled a little while this writer waited for the lock.
            return Ok(file);
        }
        if self.keep == 0 {
            file.set_len(0)?;
            return Ok(file);
        }
        for n in (1..self.keep).rev() {
            let from = rotated(&self.path, n);
            if from.symlink_metadata().is_ok() {
                fs::rename(&from, rotated(&self.path, n + 1))?;
            }
        }
        fs::rename(&self.path, rotated(&self.path, 1))?;
        // A writer of an older gpupin still holding the old file appends there, which
        // keeps its line (in audit.log.1).
        safe_open::open_append(&self.path, LOG_MODE)
    }
}

/// Appends `line` to `file` (O_APPEND, the caller holds `writer_lock`) whole or not at
/// all: a write the file system cut short (it is full) is taken back, so that no reader
/// finds a torn line (an allocation with no readable line, a release `gpupin usage`
/// cannot read).
fn append_whole(file: &fs::File, line: &[u8]) -> std::io::Result<()> {
    let before = file.metadata()?.len();
    let written = rustix::io::write(file, line);
    match written {
        Ok(n) if n == line.len() => Ok(()),
        Ok(n) => {
            let _ = file.set_len(before);
            Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                format!(
                    "only {n} of the line's {} bytes fit: the line was taken back (the file system is full)",
                    line.len()
                ),
            ))
        }
        Err(e) => {
            let _ = file.set_len(before);
            Err(e.into())
        }
    }
}

/// Refusal lines written and refusals counted in one minute, per requester: kept beside
/// the refusals log, under its flock, since every hook is a process of its own.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Budget {
    /// Unix minutes.
    minute: u64,
    keys: BTreeMap<String, Spent>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Spent {
    written: u32,
    /// Refusals not written, by code.
    suppressed: BTreeMap<String, u64>,
    user: Option<String>,
    uid: Option<u32>,
    engine: Option<String>,
}

fn budget_path(refusals: &Path) -> PathBuf {
    let mut name = refusals.as_os_str().to_os_string();
    name.push(".budget");
    PathBuf::from(name)
}

/// Whose budget a refusal spends: its uid; a container without one, its engine's.
fn requester(event: &Event) -> String {
    match (event.uid, &event.container.engine) {
        (Some(uid), _) => format!("uid {uid}"),
        (None, Some(engine)) => format!("engine {engine}"),
        (None, None) => "-".into(),
    }
}

/// A budget that does not read (a torn write, a file of another version) is a new one:
/// at worst one minute's lines more.
fn read_budget(file: &mut fs::File) -> Budget {
    let mut text = Vec::new();
    let _ = file.take(1 << 20).read_to_end(&mut text);
    serde_json::from_slice(&text).unwrap_or_default()
}

fn write_budget(file: &mut fs::File, budget: &Budget) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(budget).map_err(std::io::Error::other)?;
    file.set_len(0)?;
    file.seek(SeekFrom::Start(0))?;
    file.write_all(&bytes)
}

/// The line that stands for the refusals of `key` not written in `minute`.
fn summary(key: &str, spent: Spent, minute: u64) -> Event {
    let n: u64 = spent.suppressed.values().sum();
    let who = spent
        .user
        .clone()
        .or_else(|| spent.engine.clone())
        .unwrap_or_else(|| key.to_string());
    let from = crate::base::clock::unix(minute.saturating_mul(60));
    let reason = format!(
        "({n} more refusals of {who} suppressed in the minute from {})",
        humantime::format_rfc3339_seconds(from)
    );
    Event {
        user: spent.user,
        uid: spent.uid,
        container: ContainerInfo {
            engine: spent.engine,
            ..ContainerInfo::default()
        },
        code: Some("suppressed".into()),
        suppressed: spent.suppressed,
        ..Event::new(EventKind::Refuse, "-").because(reason)
    }
    .bounded()
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::audit::EventKind;

    fn lines(path: &Path) -> Vec<Event> {
        fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Anyone may read the log, and flock what they open: a writer that locked the log
    /// itself to rotate it waited for as long as a user held such a lock, with the
    /// ledger's lock held. The writers' lock is a file only root may open.
    #[test]
    fn a_reader_holding_a_lock_on_the_log_stalls_no_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = AuditLog::at(tmp.path().join("audit.log"));
        log.max_bytes = 200;
        log.append(&Event::new(EventKind::Release, "first"))
            .unwrap();
        let reader = fs::File::open(&log.path).unwrap();
        rustix::fs::flock(&reader, FlockOperation::LockExclusive).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = log.clone();
        std::thread::spawn(move || {
            for n in 0..5 {
                writer
                    .append(&Event::new(EventKind::Release, &format!("next-{n}")))
                    .unwrap();
            }
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the writer finished, rotating past the reader's lock");
        assert!(rotated(&log.path, 1).exists(), "it rotated");
        let lock = tmp.path().join("audit.log.lock");
        assert_eq!(
            fs::metadata(lock).unwrap().permissions().mode() & 0o777,
            0o600
        );
    }

    /// Issue 31, finding 6: a full file system cut lines short (write_all wrote what fit
    /// and failed on the rest), and a torn line is an allocation with no readable line,
    /// or a release `gpupin usage` cannot read. On a real full tmpfs, every line is whole.
    #[test]
    fn a_full_file_system_tears_no_line() {
        if !rustix::process::geteuid().is_root() {
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "mounting a small tmpfs needs root"
            );
            eprintln!("skipped: mounting a small tmpfs needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let small = tmp.path().join("small");
        fs::create_dir(&small).unwrap();
        rustix::mount::mount(
            "gpupin-test",
            &small,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            Some(c"size=64k,mode=0755"),
        )
        .unwrap();
        struct Unmount<'a>(&'a Path);
        impl Drop for Unmount<'_> {
            fn drop(&mut self) {
                let _ = rustix::mount::unmount(self.0, rustix::mount::UnmountFlags::DETACH);
            }
        }
        let _unmount = Unmount(&small);
        // Fill it all, then give one page back: the log gets that page and no more.
        let filler = small.join("filler");
        let mut f = fs::File::create(&filler).unwrap();
        while f.write_all(&[b'x'; 4096]).is_ok() {}
        let len = f.metadata().unwrap().len();
        f.set_len(len - (len % 4096) - 4096).unwrap();
        drop(f);
        let log = AuditLog::at(small.join("audit.log"));
        let mut written = 0;
        let err = loop {
            let event = Event::new(
                EventKind::Release,
                &format!("holder-{written:04}-with-a-longer-name"),
            );
            match log.append(&event) {
                Ok(()) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 1000, "the file system never filled");
        };
        assert!(written > 0, "{err}");
        let text = fs::read_to_string(small.join("audit.log")).unwrap();
        assert!(
            text.ends_with('\n'),
            "a torn last line: {:?}",
            &text[text.len().saturating_sub(80)..]
        );
        assert_eq!(lines(&small.join("audit.log")).len(), written);
        // Space again: the next line is written whole after the others.
        fs::remove_file(&filler).unwrap();
        log.append(&Event::new(EventKind::Release, "after"))
            .unwrap();
        assert_eq!(lines(&small.join("audit.log")).len(), written + 1);
    }

    #[test]
    fn appends_one_json_object_a_line_and_creates_the_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("log/gpupin/audit.log"));
        log.append(&Event::new(EventKind::Release, "c1").because("a\nb"))
            .unwrap();
        log.append(&Event::new(EventKind::Reap, "c2")).unwrap();
        let text = fs::read_to_string(&log.path).unwrap();
        assert_eq!(text.lines().count(), 2, "{text}");
        let events = lines(&log.path);
        assert_eq!(events[0].holder, "c1");
        assert_eq!(events[0].reason.as_deref(), Some("a\nb"));
        assert_eq!(events[1].event, EventKind::Reap);
        let mode = fs::metadata(&log.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, LOG_MODE);
    }

    #[test]
    fn rotates_past_the_cap_and_keeps_as_many_files_as_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog {
            max_bytes: 300,
            keep: 2,
            ..AuditLog::at(tmp.path().join("audit.log"))
        };
        for i in 0..20 {
            log.append(&Event::new(EventKind::Release, &format!("holder{i:02}")))
                .unwrap();
        }
        let files = log.files();
        assert_eq!(
            files,
            [
                tmp.path().join("audit.log.2"),
                tmp.path().join("audit.log.1"),
                tmp.path().join("audit.log")
            ]
        );
        for f in &files {
            assert!(fs::metadata(f).unwrap().len() <= 300, "{f:?}");
        }
        let kept: Vec<String> = files
            .iter()
            .flat_map(|f| lines(f))
            .map(|e| e.holder)
            .collect();
        assert_eq!(kept.last().unwrap(), "holder19");
        let mut sorted = kept.clone();
        sorted.sort();
        assert_eq!(kept, sorted, "oldest file first, lines in order");
        assert!(!tmp.path().join("audit.log.3").exists());
    }

    #[test]
    fn never_writes_through_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, tmp.path().join("audit.log")).unwrap();
        let err = AuditLog::at(tmp.path().join("audit.log"))
            .append(&Event::new(EventKind::Hold, "h"))
            .unwrap_err();
        assert_eq!(fs::read_to_string(&target).unwrap(), "");
        let line = crate::base::message::one_line(&err);
        assert!(line.starts_with("could not write the audit log "), "{line}");
    }

    /// A refusal of `uid` (alice is 1000) as a hook writes it: the whole request, which
    /// names `devices` GPUs of 64 characters each.
    fn refusal(uid: u32, devices: usize) -> Event {
        use crate::input::request::{GpuRequest, Origin, Selection};
        let names = (0..devices).map(|i| format!("GPU-{i:060}")).collect();
        let request = GpuRequest::new(Selection::Devices(names), Origin::Annotations);
        Event {
            uid: Some(uid),
            user: Some(if uid == 1000 { "alice" } else { "mallory" }.into()),
            request: Some(request),
            code: Some("unknown_gpu".into()),
            ..Event::new(EventKind::Refuse, "flood").because("x".repeat(70_000))
        }
    }

    fn refusals_of(log: &AuditLog) -> Vec<Event> {
        lines(&log.refusals().path)
    }

    #[test]
    fn a_refusal_line_is_bounded_whatever_was_asked() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        log.append(&refusal(1000, 1000)).unwrap();
        let text = fs::read_to_string(log.refusals().path).unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.len() <= MAX_REFUSAL_LINE + 1, "{} bytes", text.len());
        let line: Event = serde_json::from_str(text.trim()).unwrap();
        assert!(line.truncated);
        assert_eq!(line.user.as_deref(), Some("alice"));
        assert!(line.reason.unwrap().len() <= crate::state::audit::MAX_REASON);
        // Refusals are not in the log of allocations.
        assert!(!log.path.exists());
    }

    #[test]
    fn a_flood_of_refusals_never_rotates_an_allocation_away() {
        // The finding: 700 refusals quoting 1,000 names each pushed another user's hold
        // out of every rotated file. Small files make it take a few lines.
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog {
            max_bytes: 4096,
            keep: 1,
            ..AuditLog::at(tmp.path().join("audit.log"))
        };
        let mut hold = Event::new(EventKind::Hold, "honest");
        hold.user = Some("bob".into());
        log.append(&hold).unwrap();
        for _ in 0..700 {
            log.append(&refusal(1001, 1000)).unwrap();
        }
        let holders: Vec<String> = log
            .events()
            .map(|e| e.unwrap().event)
            .filter(|e| e.event != EventKind::Refuse)
            .map(|e| e.holder)
            .collect();
        assert_eq!(holders, ["honest"]);
    }

    #[test]
    fn refusals_past_the_budget_are_counted_and_summarised_a_minute_later() {
        let tmp = tempfile::tempdir().unwrap();
        let log = AuditLog::at(tmp.path().join("audit.log"));
        let minute = 28_576_080; // 2024-05-01T12:00:00Z
        for i in 0..25 {
            log.append_refusal(&refusal(1001, 2), minute * 60 + i)
                .unwrap();
        }
        // Another user's budget is their own.
        for i in 0..3 {
            log.append_refusal(&refusal(1000, 2), minute * 60 + 30 + i)
                .unwrap();
        }
        let written = refusals_of(&log);
        let of = |uid| written.iter().filter(|e| e.uid == Some(uid)).count();
        assert_eq!((of(1001), of(1000)), (REFUSALS_PER_MINUTE as usize, 3));
        // The next minute: first the summary of the last one, then the refusal.
        log.append_refusal(&refusal(1000, 2), (minute + 1) * 60 + 5)
            .unwrap();
        let written = refusals_of(&log);
        let summary = &written[written.len() - 2];
        assert_eq!(summary.uid, Some(1001));
        assert_eq!(summary.suppressed.get("unknown_gpu"), Some(&5));
        assert_eq!(
            summary.reason.as_deref(),
            Some("(5 more refusals of mallory suppressed in the minute from 2024-05-01T12:00:00Z)")
        );
        assert_eq!(written.last().unwrap().uid, Some(1000));
        assert_eq!(written.len(), REFUSALS_PER_MINUTE as usize + 3 + 2);
    }

    #[test]
    fn a_log_that_cannot_be_written_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        // A file where the log's directory should be: ENOTDIR, for anyone, root too.
        fs::write(tmp.path().join("log"), "").unwrap();
        let log = AuditLog::at(tmp.path().join("log/audit.log"));
        for event in [Event::new(EventKind::Allocate, "a"), refusal(1000, 1)] {
            let err = log.append(&event).unwrap_err();
            assert!(
                crate::base::message::one_line(&err)
                    .contains(&tmp.path().join("log").display().to_string()),
                "{err}"
            );
        }
    }
}
