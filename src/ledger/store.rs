//! The lock directory on disk: checks on the directory itself, the flock, and atomic
//! record files.

use super::LedgerError;
use super::record::Record;
use crate::atomic::{self, Durability};
use rustix::fs::{FlockOperation, Mode, OFlags};
use std::fs::{self, File};
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub const LOCK_FILE: &str = "lock";
pub const HOLDERS_DIR: &str = "holders";
pub const CURSOR_FILE: &str = "cursor";
pub const AUDIT_FILE: &str = "audit.log";

/// Creates `dir` (0755) when missing, then refuses it when it is a symlink, not a
/// directory, writable by group or others, or owned by another non-root user: whoever can
/// write the ledger can hand out any GPU.
pub fn ensure_safe_dir(dir: &Path) -> Result<(), LedgerError> {
    if fs::symlink_metadata(dir).is_err() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|source| LedgerError::Io {
                action: "creating state dir",
                path: dir.to_path_buf(),
                source,
            })?;
    }
    check_safe_dir(dir)
}

pub fn check_safe_dir(dir: &Path) -> Result<(), LedgerError> {
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

/// An exclusive flock on `<dir>/lock`, released when dropped.
pub struct LockGuard {
    _fd: OwnedFd,
}

pub fn lock(dir: &Path) -> Result<LockGuard, LedgerError> {
    let path = dir.join(LOCK_FILE);
    let fd = rustix::fs::open(
        &path,
        OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| LedgerError::Io {
        action: "opening lock file",
        path: path.clone(),
        source: e.into(),
    })?;
    rustix::fs::flock(&fd, FlockOperation::LockExclusive).map_err(|e| LedgerError::Io {
        action: "locking",
        path,
        source: e.into(),
    })?;
    Ok(LockGuard { _fd: fd })
}

pub fn holders_dir(dir: &Path) -> PathBuf {
    dir.join(HOLDERS_DIR)
}

/// Every record, in id order. Temp files (leading `.`) are skipped; a file that does not
/// parse is an error, since skipping it could hand its GPUs out twice.
pub fn read_records(dir: &Path) -> Result<Vec<Record>, LedgerError> {
    let holders = holders_dir(dir);
    let entries = match fs::read_dir(&holders) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(LedgerError::Io {
                action: "listing",
                path: holders,
                source,
            });
        }
    };
    let mut records = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| LedgerError::Io {
            action: "listing",
            path: holders.clone(),
            source,
        })?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        records.push(read_record(&entry.path())?);
    }
    records.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(records)
}

fn read_record(path: &Path) -> Result<Record, LedgerError> {
    let text = fs::read_to_string(path).map_err(|source| LedgerError::Io {
        action: "reading record",
        path: path.to_path_buf(),
        source,
    })?;
    let corrupt = |reason: String| LedgerError::CorruptRecord {
        path: path.to_path_buf(),
        reason,
    };
    let record: Record = serde_json::from_str(&text).map_err(|e| corrupt(e.to_string()))?;
    // The file name is the key every release and reap uses; a record that disagrees with
    // its own name could never be released by id.
    if path.file_stem().and_then(|s| s.to_str()) != Some(record.id.as_str()) {
        return Err(corrupt(format!("it names holder {:?}", record.id)));
    }
    Ok(record)
}

/// Writes a record: temp file, fsync, rename, fsync of the directory, so that after a
/// crash a record is either whole or absent.
pub fn write_record(dir: &Path, file_name: &str, record: &Record) -> Result<(), LedgerError> {
    let holders = holders_dir(dir);
    if !holders.exists() {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&holders)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => Ok(()),
                _ => Err(e),
            })
            .map_err(|source| LedgerError::Io {
                action: "creating",
                path: holders.clone(),
                source,
            })?;
    }
    let mut text = serde_json::to_string_pretty(record).expect("records serialize");
    text.push('\n');
    write_atomic(&holders, file_name, text.as_bytes(), true)
}

pub fn remove_record(dir: &Path, file_name: &str) -> Result<bool, LedgerError> {
    let holders = holders_dir(dir);
    let path = holders.join(file_name);
    match fs::remove_file(&path) {
        Ok(()) => {
            sync_dir(&holders)?;
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

/// Writes `<dir>/<name>` through `atomic::write`; `durable` says whether a crash must not
/// lose it. Mode 0644 whatever the umask: a record must not be writable by others.
pub fn write_atomic(
    dir: &Path,
    name: &str,
    bytes: &[u8],
    durable: bool,
) -> Result<(), LedgerError> {
    let durability = if durable {
        Durability::Synced
    } else {
        Durability::Renamed
    };
    atomic::write(&dir.join(name), bytes, 0o644, durability).map_err(|e| LedgerError::Io {
        action: "writing",
        path: e.path,
        source: e.source,
    })
}

fn sync_dir(dir: &Path) -> Result<(), LedgerError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| LedgerError::Io {
            action: "syncing",
            path: dir.to_path_buf(),
            source,
        })
}

pub fn read_cursor(dir: &Path) -> usize {
    fs::read_to_string(dir.join(CURSOR_FILE))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The spread cursor is a hint, not an invariant: losing it in a crash only restarts the
/// rotation, so it is renamed into place without fsync.
pub fn write_cursor(dir: &Path, cursor: usize) -> Result<(), LedgerError> {
    write_atomic(dir, CURSOR_FILE, format!("{cursor}\n").as_bytes(), false)
}

/// Appends one line to the audit log. Best effort by design: an audit line must never be
/// the reason a container does not start, so failures are ignored.
pub fn audit(dir: &Path, line: &str) {
    use std::fs::OpenOptions;
    if let Ok(mut f) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(AUDIT_FILE))
    {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
        let _ = writeln!(f, "{stamp} {line}");
    }
}
