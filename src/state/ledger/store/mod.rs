//! The lock directory on disk: checks on the directory and its subdirectories, the flock,
//! and the files. Nothing here follows a symlink or opens a FIFO: whoever could plant one
//! would otherwise steer root's writes or stall every container start under the lock.

pub(in crate::state::ledger) mod entry;
pub(in crate::state::ledger) mod failures;
pub(in crate::state::ledger) mod fences;
pub(in crate::state::ledger) mod index;

use super::LedgerError;
use super::record::Record;
use crate::base::atomic::{self, Durability};
use crate::base::procinfo;
use crate::base::safe_open::{self, Links};
use entry::Entry;
use rustix::fs::{FlockOperation, Mode, OFlags};
use std::fs::{self, File};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub(super) const LOCK_FILE: &str = "lock";
pub(super) const HOLDERS_DIR: &str = "holders";
pub(super) const CURSOR_FILE: &str = "cursor";

/// Directories: everyone may read the ledger (`gpupin status`), only its owner write it.
const DIR_MODE: u32 = 0o755;
/// Records, the cursor, queue tickets and queue-seq.
pub(super) const FILE_MODE: u32 = 0o644;
/// Only the ledger's writer may take the lock: a reader holding it would stall every start.
const LOCK_MODE: u32 = 0o600;

/// Creates `dir` (0755 whatever the umask) when missing, then refuses it when it is a
/// symlink, not a directory, writable by group or others, or owned by another non-root
/// user: whoever can write the ledger can hand out any GPU.
pub(super) fn ensure_safe_dir(dir: &Path) -> Result<(), LedgerError> {
    if fs::symlink_metadata(dir).is_err() {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(parent)
                .map_err(|source| LedgerError::Io {
                    action: "creating state dir",
                    path: parent.to_path_buf(),
                    source,
                })?;
        }
        match make_dir(dir) {
            // Another gpupin made it first: the checks below judge it all the same.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            other => other.map_err(|source| LedgerError::Io {
                action: "creating state dir",
                path: dir.to_path_buf(),
                source,
            })?,
        }
    }
    check_safe_dir(dir)
}

pub(super) fn check_safe_dir(dir: &Path) -> Result<(), LedgerError> {
    let unsafe_dir = |reason: &'static str| LedgerError::UnsafeStateDir {
        path: dir.to_path_buf(),
        reason,
    };
    let meta = fs::symlink_metadata(dir).map_err(|source| LedgerError::Io {
        action: "inspecting state dir",
        path: dir.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(unsafe_dir("it is a symlink"));
    }
    if !meta.is_dir() {
        return Err(unsafe_dir("it is not a directory"));
    }
    if meta.permissions().mode() & 0o022 != 0 {
        return Err(unsafe_dir("it is writable by group or others"));
    }
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me && meta.uid() != 0 {
        return Err(unsafe_dir("it is owned by another user"));
    }
    Ok(())
}

/// `<dir>/<name>`, created (0755) when missing and held to the state dir's rules: a
/// subdirectory anyone can write lets anyone forge its entries.
pub(super) fn ensure_subdir(dir: &Path, name: &str) -> Result<PathBuf, LedgerError> {
    let path = dir.join(name);
    match make_dir(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(LedgerError::Io {
                action: "creating",
                path,
                source,
            });
        }
    }
    check_safe_dir(&path)?;
    Ok(path)
}

/// `<dir>/<name>` when it exists and passes the state dir's checks; `None` when missing.
pub(super) fn existing_subdir(dir: &Path, name: &str) -> Result<Option<PathBuf>, LedgerError> {
    let path = dir.join(name);
    match fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => check_safe_dir(&path).map(|()| Some(path)),
    }
}

/// mkdir (which never follows a final symlink: one there is EEXIST), then fchmod through
/// a no-follow handle, since mkdir's mode passes through the umask.
fn make_dir(path: &Path) -> std::io::Result<()> {
    fs::DirBuilder::new().mode(DIR_MODE).create(path)?;
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(DIR_MODE))?;
    Ok(())
}

/// An exclusive flock on `<dir>/lock`, released when dropped.
pub(super) struct LockGuard {
    _file: File,
}

pub(super) fn lock(dir: &Path) -> Result<LockGuard, LedgerError> {
    let path = dir.join(LOCK_FILE);
    let file = safe_open::open_read_write(&path, LOCK_MODE).map_err(|source| LedgerError::Io {
        action: "opening lock file",
        path: path.clone(),
        source,
    })?;
    rustix::fs::flock(&file, FlockOperation::LockExclusive).map_err(|e| LedgerError::Io {
        action: "locking",
        path,
        source: e.into(),
    })?;
    Ok(LockGuard { _file: file })
}

pub(super) fn holders_dir(dir: &Path) -> PathBuf {
    dir.join(HOLDERS_DIR)
}

/// What `holders/` holds, sorted out.
#[derive(Debug, Default)]
pub(super) struct Scan {
    /// Every record that reads, in id order.
    pub records: Vec<Record>,
    /// Entries that cannot be anyone's record (`entry::Entry::Stray`), with why.
    pub stray: Vec<(PathBuf, &'static str)>,
    /// Records that do not read (`CorruptRecord`): they may hold GPUs nobody can name.
    pub corrupt: Vec<LedgerError>,
    /// Temp files of writers, with their pid.
    pub temps: Vec<(PathBuf, i32)>,
    /// Records that do not read and were last written before this boot: a crash can
    /// leave a record half written (they are not fsynced), and none can hold GPUs now.
    pub leftovers: Vec<PathBuf>,
}

/// Reads every entry of `holders/` without following or blocking on any.
pub(super) fn scan_holders(dir: &Path) -> Result<Scan, LedgerError> {
    let mut scan = Scan::default();
    let Some(holders) = existing_subdir(dir, HOLDERS_DIR)? else {
        return Ok(scan);
    };
    // The records are opened relative to the directory (checked just now, and opened
    // without following a link): its path is walked once, not once per record.
    let holders_fd = rustix::fs::open(
        &holders,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| LedgerError::Io {
        action: "opening",
        path: holders.clone(),
        source: e.into(),
    })?;
    for (path, kind) in list(&holders)? {
        match entry::classify(path.file_name().unwrap_or_default(), kind) {
            Entry::Record => match read_listed_in(Some(holders_fd.as_fd()), &path) {
                Ok(Some(record)) => scan.records.push(record),
                Ok(None) => {}
                Err(LedgerError::CorruptRecord { .. }) if written_before_boot(&path) => {
                    scan.leftovers.push(path)
                }
                Err(err @ LedgerError::CorruptRecord { .. }) => scan.corrupt.push(err),
                Err(err) => return Err(err),
            },
            Entry::Stray(reason) => scan.stray.push((path, reason)),
            Entry::Temp(pid) => scan.temps.push((path, pid)),
            Entry::Other => {}
        }
    }
    scan.records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(scan)
}

/// The record of holder `id`, read alone (its file name says where, so nothing else of
/// `holders/` is listed or read); `None` when it has none.
pub(super) fn read_holder(
    dir: &Path,
    id: &crate::model::holder::HolderId,
) -> Result<Option<Record>, LedgerError> {
    let Some(holders) = existing_subdir(dir, HOLDERS_DIR)? else {
        return Ok(None);
    };
    read_listed(&holders.join(id.file_name()))
}

/// A record a listing named; `None` when it is gone by now. Read without the lock
/// (`gpupin status`), a record can be released between the listing and the read: gone,
/// not broken. Under the lock nothing is removed meanwhile.
fn read_listed(path: &Path) -> Result<Option<Record>, LedgerError> {
    read_listed_in(None, path)
}

/// `read_listed`, opened in `dir` (the directory `path` names) where it is given.
fn read_listed_in(dir: Option<BorrowedFd<'_>>, path: &Path) -> Result<Option<Record>, LedgerError> {
    match read_record_in(dir, path) {
        Ok(record) => Ok(Some(record)),
        Err(LedgerError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(None)
        }
        Err(err) => Err(err),
    }
}

fn written_before_boot(path: &Path) -> bool {
    let modified = fs::symlink_metadata(path).map(|m| m.mtime());
    match (modified, crate::base::procinfo::boot_time()) {
        (Ok(modified), Some(boot)) => modified < boot as i64,
        _ => false,
    }
}

/// Every record, in id order. An entry that is not a readable record is an error, since
/// skipping it could hand its GPUs out twice; the error says how to clear it.
pub(super) fn read_records(dir: &Path) -> Result<Vec<Record>, LedgerError> {
    let scan = scan_holders(dir)?;
    if let Some((path, reason)) = scan.stray.into_iter().next() {
        return Err(LedgerError::StrayEntry { path, reason });
    }
    if let Some(err) = scan.corrupt.into_iter().next() {
        return Err(err);
    }
    Ok(scan.records)
}

/// The entries of `dir` with their file types (as lstat sees them), in name order.
pub(super) fn list(dir: &Path) -> Result<Vec<(PathBuf, fs::FileType)>, LedgerError> {
    let listing = |source| LedgerError::Io {
        action: "listing",
        path: dir.to_path_buf(),
        source,
    };
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir).map_err(listing)? {
        let entry = entry.map_err(listing)?;
        // DirEntry::file_type does not follow a symlink.
        let kind = entry.file_type().map_err(listing)?;
        entries.push((entry.file_name(), entry.path(), kind));
    }
    // By name, as bytes, taken once from each entry: one directory, so the names alone
    // order it, and parsing paths at every comparison cost more than the listing.
    entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    Ok(entries
        .into_iter()
        .map(|(_, path, kind)| (path, kind))
        .collect())
}

/// A record's text, from a regular file that only its owner can write and whose owner is
/// root or gpupin's own user, as every record gpupin writes is: a record anyone else could
/// have written (planted while the directory was open, or chowned away since) could hand
/// out any GPU, and is refused like a corrupt one.
fn read_trusted(dir: Option<BorrowedFd<'_>>, path: &Path) -> std::io::Result<String> {
    // The stat that called it regular is the one judged: no second look at the file.
    let (file, stat) = match dir {
        Some(dir) => safe_open::open_at_with_stat(dir, path.file_name().unwrap_or_default())?,
        None => safe_open::open_with_stat(path, Links::Refuse)?,
    };
    let untrusted = |reason: String| std::io::Error::new(std::io::ErrorKind::InvalidData, reason);
    safe_open::written_by_us(&stat).map_err(untrusted)?;
    let bytes = safe_open::read_file(file, stat.st_size as u64)?;
    String::from_utf8(bytes).map_err(|_| untrusted("not UTF-8 text".into()))
}

pub(super) fn read_record(path: &Path) -> Result<Record, LedgerError> {
    read_record_in(None, path)
}

/// `read_record`, opened in `dir` (the directory `path` names) where it is given.
fn read_record_in(dir: Option<BorrowedFd<'_>>, path: &Path) -> Result<Record, LedgerError> {
    let corrupt = |reason: String| LedgerError::CorruptRecord {
        path: path.to_path_buf(),
        reason,
    };
    let text = read_trusted(dir, path).map_err(|source| {
        match source.kind() {
            // Not a regular file after all, too large, not text: unreadable as a record.
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::InvalidData => {
                corrupt(source.to_string())
            }
            _ => LedgerError::Io {
                action: "reading record",
                path: path.to_path_buf(),
                source,
            },
        }
    })?;
    let record: Record = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    // The file name is the key every release and reap uses; a record that disagrees with
    // its own name could never be released by id.
    if path.file_stem().and_then(|s| s.to_str()) != Some(record.id.as_str()) {
        return Err(corrupt(format!("it names holder {:?}", record.id)));
    }
    Ok(record)
}

/// Writes a record: temp file, rename (see `write_atomic` for why without fsync). The
/// index (`index`), where it is the records' own, follows. Caller holds the lock.
pub(super) fn write_record(
    dir: &Path,
    file_name: &str,
    record: &Record,
) -> Result<(), LedgerError> {
    let holders = ensure_subdir(dir, HOLDERS_DIR)?;
    let mut text = serde_json::to_string_pretty(record).expect("records serialize");
    text.push('\n');
    let index = index::before_change(dir, file_name);
    write_atomic(&holders, file_name, text.as_bytes())?;
    index::after_change(dir, index, Some(record));
    Ok(())
}

/// Removes a record; the index follows, as for `write_record`. `false`: there was none.
pub(super) fn remove_record(dir: &Path, file_name: &str) -> Result<bool, LedgerError> {
    let holders = holders_dir(dir);
    let path = holders.join(file_name);
    let index = index::before_change(dir, file_name);
    match fs::remove_file(&path) {
        Ok(()) => {
            index::after_change(dir, index, None);
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(LedgerError::Io {
            action: "removing record",
            path,
            source,
        }),
    }
}

/// Removes the entry at `path` whatever it is, without following it: a directory with
/// all it holds (`remove_dir_all` does not follow links inside), anything else unlinked.
pub(super) fn remove_entry(path: &Path, kind: fs::FileType) -> Result<(), LedgerError> {
    let removed = if kind.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    };
    removed.map_err(|source| LedgerError::Io {
        action: "removing",
        path: path.to_path_buf(),
        source,
    })
}

/// Removes the temp files in `dir` whose writer is gone (killed between create and
/// rename); returns their paths. A live writer's file is left to it.
pub(super) fn remove_dead_temps(dir: &Path) -> Result<Vec<PathBuf>, LedgerError> {
    let mut removed = Vec::new();
    for (path, kind) in list(dir)? {
        let name = path.file_name().unwrap_or_default();
        let Some(pid) = name.to_str().and_then(atomic::temp_writer) else {
            continue;
        };
        if procinfo::start_time(pid).is_none() {
            remove_entry(&path, kind)?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Writes `<dir>/<name>` through `atomic::replace`. Mode 0644 and this user as owner,
/// whatever the umask and whatever stood there: a state file must not be writable by
/// others, nor take a planted link's target's.
///
/// Renamed, never fsynced: every state file matters only while the processes it names
/// live, and none of them survives a crash of the machine. Readers see a whole file or
/// the old one either way (rename is atomic); a file a crash left half written is from
/// an earlier boot, which the readers recognise (`Record::from_an_earlier_boot`,
/// `Scan::leftovers`, a ticket's dead pid, the cursor as a hint).
pub(super) fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), LedgerError> {
    atomic::replace(&dir.join(name), bytes, FILE_MODE, Durability::Renamed).map_err(|e| {
        LedgerError::Io {
            action: "writing",
            path: e.path,
            source: e.source,
        }
    })
}

/// A small number from a state file (the cursor, queue-seq); `None` when it is missing,
/// not a regular file or not a number.
pub(super) fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    safe_open::read_to_string(path, Links::Refuse)
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

pub(super) fn read_cursor(dir: &Path) -> usize {
    read_number(&dir.join(CURSOR_FILE)).unwrap_or(0)
}

/// The spread cursor is a hint, not an invariant: losing it in a crash only restarts the
/// rotation, so it is renamed into place without fsync.
pub(super) fn write_cursor(dir: &Path, cursor: usize) -> Result<(), LedgerError> {
    write_atomic(dir, CURSOR_FILE, format!("{cursor}\n").as_bytes())
}

/// `name` for an audit line: as it is when it is plain, else escaped, so that no name
/// can start a forged line.
pub(super) fn audit_name(name: &[u8]) -> String {
    if name.iter().all(|b| b.is_ascii_graphic()) {
        String::from_utf8_lossy(name).into_owned()
    } else {
        format!("{:?}", std::ffi::OsStr::from_bytes(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_released_after_the_listing_is_gone_not_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        let gone = tmp.path().join("c1.json");
        assert!(matches!(read_listed(&gone), Ok(None)));
        std::fs::write(&gone, "{").unwrap();
        assert!(matches!(
            read_listed(&gone),
            Err(LedgerError::CorruptRecord { .. })
        ));
    }
}
