//! `gpupin usage` over the whole audit trail: every file of the log, of its refusals and
//! of each user's log, read through its digest (`digest`) where one is trusted, raw where
//! none is, with the ledger's live records.
//!
//! Two passes, so that memory follows the holders, not the year: the first learns which
//! ids any holding is nested in (the digests' heads, the raw lines that say `within`), the
//! second sums every holding as it comes (`Tally`) and keeps only the nested ones and
//! their possible parents. Both passes read the same bytes: each file is read only up to
//! the size it had at the first look, and a file rotated (or a digest rewritten) between
//! them starts the whole read again.
//!
//! Whoever owns the log's directory (root, for the system's log) writes the digests that
//! are missing or stale as it reads (`audit.digests/`, one a file, named by device and
//! inode, which a rotation keeps): a rotated file's once, the live file's each time 4 MiB
//! were appended past its digest. Anyone else reads the digests root wrote, and the raw
//! lines of any file without one. The answer is the same either way.

use super::digest::{self, Head, Trouble};
use super::tally::Tally;
use super::{By, Usage, could_end_in, counts, counts_end, event_span};
use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use crate::input::config::AuditLog;
use crate::state::audit::{Lines, Needle, ReadError, Wanted, escaped, open_log_with_stat, wanted};
use crate::state::ledger::Record;
use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Reads started again when files were rotated meanwhile, before giving up.
const TRIES: usize = 3;
/// Bytes appended to the live file past its digest that make the next reader by root
/// digest it anew; fewer are read raw.
const LIVE_AGAIN: u64 = 4 << 20;
/// Digests are as open as the log they digest.
const DIGEST_MODE: u32 = 0o644;
const DIR_MODE: u32 = 0o755;

/// `usage`'s answer, and the lines it could not read.
#[derive(Debug)]
pub struct TrailUsage {
    pub usage: Usage,
    /// Lines that could have been the end of a holding in the period but were no event.
    pub unreadable: usize,
}

/// GPU-hours between `since` and `now` by `by`, from the whole trail of `audit` and the
/// ledger's `records` (read before the trail: a holder released in between is in both,
/// and counted once). The answer of `usage::usage` over every release and reap the trail
/// has.
pub fn usage_of_trail(
    audit: &AuditLog,
    records: &[Record],
    since: SystemTime,
    now: SystemTime,
    by: By,
) -> Result<TrailUsage, ReadError> {
    let mut digests = Digests::of(audit);
    let mut rotated = audit.path.clone();
    for _ in 0..TRIES {
        match attempt(audit, &digests, records, since, now, by) {
            Ok(done) => return Ok(done),
            Err(Again::Rotated(path)) => rotated = path,
            Err(Again::BadDigest) => {
                tracing::debug!("a digest of the audit log does not parse: read raw");
                digests = Digests::none();
            }
            Err(Again::Read(err)) => return Err(err),
        }
    }
    Err(ReadError::Rotated {
        path: rotated,
        tries: TRIES,
    })
}

/// Why a read ends before its answer.
enum Again {
    /// A file was rotated, or its digest written anew, between the passes.
    Rotated(PathBuf),
    /// A digest's head parsed but its holdings did not: read without digests.
    BadDigest,
    Read(ReadError),
}

impl From<ReadError> for Again {
    fn from(err: ReadError) -> Again {
        Again::Read(err)
    }
}

/// One file of the trail as the first pass found it.
struct Source {
    path: PathBuf,
    dev: u64,
    ino: u64,
    /// Its digest, which covers it up to `raw.0`.
    digest: Option<Head>,
    /// The bytes read raw: from the digest's end up to the file's size at the first look.
    raw: (u64, u64),
}

fn attempt(
    audit: &AuditLog,
    digests: &Digests,
    records: &[Record],
    since: SystemTime,
    now: SystemTime,
    by: By,
) -> Result<TrailUsage, Again> {
    let sources = first_look(audit, digests)?;

    // Pass 1: the ids holdings are nested in.
    let within = Needle::new(b"within");
    let mut parent_ids: HashSet<String> = HashSet::new();
    for source in &sources {
        if let Some(head) = &source.digest {
            parent_ids.extend(head.withins.iter().cloned());
        }
        if source.raw.0 < source.raw.1 {
            let says_within = |line: &[u8]| escaped(line) || within.in_(line);
            each_raw_line(source, reopen(source)?, |line| {
                if let Wanted::Event(entry) = wanted(line, &says_within) {
                    parent_ids.extend(entry.event.within);
                }
            })?;
        }
    }

    // Pass 2: every holding that ended, as it comes.
    let mut tally = Tally::new(
        records,
        parent_ids.iter().map(String::as_str),
        since,
        now,
        by,
    );
    let could = could_end_in(since);
    let mut unreadable = 0;
    for source in &sources {
        let log = reopen(source)?;
        if let Some(head) = &source.digest {
            let file = digests
                .open(source.dev, source.ino)
                .ok_or(Again::BadDigest)?;
            let counted = |at: SystemTime, span: &super::tally::Span| {
                if counts_end(at, span.within.is_some(), since) {
                    tally.add(span);
                }
            };
            digest::holdings(&mut digest::reader(file), head, counted).map_err(|t| match t {
                Trouble::Changed => Again::Rotated(source.path.clone()),
                Trouble::Unreadable => Again::BadDigest,
            })?;
            for &(at, len) in &head.unreadable {
                let mut line = vec![0; len as usize];
                log.read_exact_at(&mut line, at)
                    .map_err(|e| io_error(&source.path, e))?;
                unreadable += usize::from(could(&line));
            }
        }
        each_raw_line(source, log, |line| match wanted(line, &could) {
            Wanted::Skipped => {}
            Wanted::Unreadable => unreadable += 1,
            Wanted::Event(entry) => {
                if counts(entry.at, &entry.event, since)
                    && let Some(span) = event_span(&entry.event)
                {
                    tally.add(&span);
                }
            }
        })?;
    }
    if !tally.complete() {
        // A holding nested in an id the first pass did not see: the files changed.
        return Err(Again::Rotated(audit.path.clone()));
    }
    Ok(TrailUsage {
        usage: tally.finish(),
        unreadable,
    })
}

/// Every file of the trail with its digest (written first where this may and it is
/// missing or stale).
fn first_look(audit: &AuditLog, digests: &Digests) -> Result<Vec<Source>, ReadError> {
    let mut logs = vec![audit.clone(), audit.refusals()];
    logs.extend(audit.user_logs().into_iter().map(|uid| audit.of_user(uid)));
    let mut sources = Vec::new();
    let mut wrote = false;
    for log in logs {
        for path in log.files() {
            let Some((file, stat)) = open_log_with_stat(&path)? else {
                continue;
            };
            let size = stat.st_size as u64;
            let mut head = digests.load(&file, &stat);
            let covered = head.as_ref().map_or(0, |h| h.covers.len);
            let stale = match &head {
                _ if path == log.path => size - covered >= LIVE_AGAIN,
                None => true,
                // Rotated since it was digested, or changed after (it was live then).
                Some(h) => h.covers.mtime != digest::mtime(&stat),
            };
            if stale && digests.save(&file, &stat) {
                wrote = true;
                head = digests.load(&file, &stat);
            }
            let from = head.as_ref().map_or(0, |h| h.covers.len);
            sources.push(Source {
                path,
                dev: stat.st_dev,
                ino: stat.st_ino,
                digest: head,
                raw: (from, size),
            });
        }
    }
    if wrote {
        digests.prune(&sources);
    }
    Ok(sources)
}

/// Gives each raw line of `source` (those its digest does not cover, up to its size at
/// the first look) to `each`; `file` is `source` opened again (`reopen`).
fn each_raw_line(source: &Source, file: File, mut each: impl FnMut(&[u8])) -> Result<(), Again> {
    if source.raw.0 >= source.raw.1 {
        return Ok(());
    }
    let failed = |e| io_error(&source.path, e);
    let mut lines = Lines::of(file, source.raw.0, source.raw.1).map_err(failed)?;
    while let Some((_, line)) = lines.next_line().map_err(failed)? {
        each(line);
    }
    Ok(())
}

/// The file `source` is, opened again by its path; `Rotated` where the path names another
/// file now.
fn reopen(source: &Source) -> Result<File, Again> {
    match open_log_with_stat(&source.path)? {
        Some((file, stat)) if (stat.st_dev, stat.st_ino) == (source.dev, source.ino) => Ok(file),
        _ => Err(Again::Rotated(source.path.clone())),
    }
}

fn io_error(path: &Path, source: std::io::Error) -> Again {
    Again::Read(ReadError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// The digests' directory, and what this process may do there.
struct Digests {
    /// `None`: no digest is read (the directory is missing, a link, or others could write it).
    dir: Option<PathBuf>,
    writable: bool,
}

impl Digests {
    fn none() -> Digests {
        Digests {
            dir: None,
            writable: false,
        }
    }

    /// The digests of `audit`'s files: written where this process owns the log's
    /// directory (it made the directory safe for the log: `AuditLog::append`), read where
    /// root or this user owns theirs and no one else may write it.
    fn of(audit: &AuditLog) -> Digests {
        let dir = audit.digests_dir();
        let me = rustix::process::geteuid().as_raw();
        let log_dir = dir.parent().unwrap_or(Path::new("/"));
        let owns_log_dir = log_dir.symlink_metadata().is_ok_and(|m| m.uid() == me);
        if owns_log_dir && dir.symlink_metadata().is_err() {
            // As open as the log, whatever the umask (a 0750 log directory keeps both private).
            let made = std::fs::DirBuilder::new().mode(DIR_MODE).create(&dir);
            if made.is_ok() {
                let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(DIR_MODE));
            }
        }
        let safe = dir
            .symlink_metadata()
            .is_ok_and(|m| m.is_dir() && m.mode() & 0o022 == 0 && (m.uid() == 0 || m.uid() == me));
        if !safe {
            return Digests::none();
        }
        Digests {
            writable: owns_log_dir && dir.symlink_metadata().is_ok_and(|m| m.uid() == me),
            dir: Some(dir),
        }
    }

    fn path(&self, dev: u64, ino: u64) -> Option<PathBuf> {
        Some(self.dir.as_ref()?.join(format!("{dev}-{ino}.digest")))
    }

    /// The digest file of the file `dev`/`ino`, when it is one that could only be root's
    /// or ours.
    fn open(&self, dev: u64, ino: u64) -> Option<File> {
        let path = self.path(dev, ino)?;
        let (file, stat) = safe_open::open_with_stat(&path, Links::Refuse).ok()?;
        safe_open::written_by_us(&stat).ok()?;
        Some(file)
    }

    /// The head of the digest of `file` (`stat` its stat), where there is one that is
    /// still true of it.
    fn load(&self, file: &File, stat: &rustix::fs::Stat) -> Option<Head> {
        let digest = self.open(stat.st_dev, stat.st_ino)?;
        let head = digest::read_head(&mut digest::reader(digest))?;
        digest::matches(&head.covers, file, stat).then_some(head)
    }

    /// Writes the digest of `file`; whether it was written.
    fn save(&self, file: &File, stat: &rustix::fs::Stat) -> bool {
        let Some(path) = self
            .path(stat.st_dev, stat.st_ino)
            .filter(|_| self.writable)
        else {
            return false;
        };
        let written = digest::build(file, stat).and_then(|bytes| {
            atomic::replace(&path, &bytes, DIGEST_MODE, Durability::Renamed).map_err(|e| e.source)
        });
        if let Err(err) = &written {
            tracing::debug!(error = %err, path = %path.display(), "a digest of the audit log not written");
        }
        written.is_ok()
    }

    /// Removes the digests of files that are gone (rotated out of the trail).
    fn prune(&self, sources: &[Source]) {
        let Some(dir) = &self.dir else { return };
        let keep: HashSet<PathBuf> = sources
            .iter()
            .filter_map(|s| self.path(s.dev, s.ino))
            .collect();
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "digest") && !keep.contains(&path) {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
}
