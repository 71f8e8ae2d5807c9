//! Replacing a file so that a reader (a runtime, dockerd reloading, another gpupin) sees
//! either the old or the new content, never half of it: a temp file beside it, written and
//! fsynced, renamed over it, then the directory fsynced so the rename itself is durable.
//! Used for bundle specs, daemon.json, hooks.d files and the ledger's records.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

#[derive(Debug, thiserror::Error)]
#[error("writing {path}")]
pub struct WriteError {
    /// The path that failed: the temp file, the target or its directory.
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// How much a write must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsync of the file before the rename and of the directory after it.
    Synced,
    /// Rename only: for hints whose loss in a crash costs nothing (the spread cursor).
    Renamed,
}

/// Writes `bytes` to `path` atomically. An existing file keeps its mode and owner (a
/// runtime running as another user must still read its spec); a new one gets `new_mode`,
/// whatever the umask. The temp file is removed again on failure.
pub fn write(
    path: &Path,
    bytes: &[u8],
    new_mode: u32,
    durability: Durability,
) -> Result<(), WriteError> {
    let dir = parent_dir(path);
    let tmp = temp_path(path, &dir);
    let result = write_temp(&tmp, path, bytes, new_mode, durability)
        .and_then(|()| fs::rename(&tmp, path).map_err(|source| error(path, source)));
    if result.is_err() {
        // Best effort: the temp file is ours and useless after a failure.
        let _ = fs::remove_file(&tmp);
        return result;
    }
    if durability == Durability::Synced {
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| error(&dir, source))?;
    }
    Ok(())
}

/// Writes `bytes` into the new file `tmp` with the mode and owner `original` has, or
/// `new_mode` when it does not exist yet.
fn write_temp(
    tmp: &Path,
    original: &Path,
    bytes: &[u8],
    new_mode: u32,
    durability: Durability,
) -> Result<(), WriteError> {
    let existing = match fs::metadata(original) {
        Ok(meta) => Some(meta),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(error(original, source)),
    };
    let mode = existing.as_ref().map_or(new_mode, |m| m.mode() & 0o7777);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(tmp)
        .map_err(|source| error(tmp, source))?;
    let io = (|| {
        file.write_all(bytes)?;
        if let Some(meta) = &existing {
            std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))?;
        }
        // fchmod after fchown: chown clears set-id bits, and umask does not apply here.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        if durability == Durability::Synced {
            file.sync_all()?;
        }
        Ok(())
    })();
    io.map_err(|source| error(tmp, source))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// A temp name unique within this process (counter) and across processes (pid), hidden
/// (leading dot) so that directory scans skip it.
fn temp_path(path: &Path, dir: &Path) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.gpupin-{}-{n}.tmp", std::process::id()))
}

fn error(path: &Path, source: std::io::Error) -> WriteError {
    WriteError {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_file_gets_the_mode_despite_the_umask_and_no_temp_remains() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        write(&path, b"one", 0o644, Durability::Synced).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
        assert_eq!(fs::read(&path).unwrap(), b"one");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn rewrite_keeps_the_existing_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write(&path, b"new", 0o644, Durability::Renamed).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn failure_names_the_path_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("f");
        let err = write(&path, b"x", 0o644, Durability::Synced).unwrap_err();
        assert!(
            err.path.starts_with(dir.path().join("missing-dir")),
            "{err}"
        );
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
