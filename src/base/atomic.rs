//! Replacing a file so that a reader (a runtime, dockerd reloading, another gpupin) sees
//! either the old or the new content, never half of it: a temp file beside it, written,
//! renamed over it. `Durability::Synced` also fsyncs the file and then the directory, for
//! files that must survive a crash of the machine (daemon.json, hooks.d files); bundle
//! specs and the ledger's files are only renamed (see `ledger::store::write_atomic`).

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

/// Writes `bytes` to `path` atomically. An existing regular file keeps its mode and owner
/// (a runtime running as another user must still read its spec); a new one, or one that
/// replaces a symlink or anything else, gets `new_mode`, whatever the umask. A symlink at
/// `path` is never consulted: the rename replaces the link itself.
pub fn write(
    path: &Path,
    bytes: &[u8],
    new_mode: u32,
    durability: Durability,
) -> Result<(), WriteError> {
    write_with(path, bytes, Perms::KeepOr(new_mode), durability)
}

/// As `write`, but the file always gets exactly `mode` and the writer as owner, whatever
/// stood at `path` before: for state files, whose old mode and owner are not to be trusted.
pub(crate) fn replace(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    durability: Durability,
) -> Result<(), WriteError> {
    write_with(path, bytes, Perms::Exactly(mode), durability)
}

/// The mode and owner a written file gets.
#[derive(Debug, Clone, Copy)]
enum Perms {
    /// Those of the regular file it replaces, else this mode and the writer.
    KeepOr(u32),
    /// This mode and the writer.
    Exactly(u32),
}

fn write_with(
    path: &Path,
    bytes: &[u8],
    perms: Perms,
    durability: Durability,
) -> Result<(), WriteError> {
    let dir = parent_dir(path);
    let tmp = temp_path(path, &dir);
    let result = write_temp(&tmp, path, bytes, perms, durability)
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

/// Writes `bytes` into the new file `tmp` with the mode and owner `perms` gives it.
fn write_temp(
    tmp: &Path,
    original: &Path,
    bytes: &[u8],
    perms: Perms,
    durability: Durability,
) -> Result<(), WriteError> {
    let (mode, existing) = match perms {
        Perms::Exactly(mode) => (mode, None),
        Perms::KeepOr(new_mode) => match kept(original)? {
            Some(meta) => (meta.mode() & 0o7777, Some(meta)),
            None => (new_mode, None),
        },
    };
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

/// The metadata of the regular file at `path`, by lstat: a symlink there would lend the
/// new file its target's mode and owner.
fn kept(path: &Path) -> Result<Option<fs::Metadata>, WriteError> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_file() => Ok(Some(meta)),
        Ok(_) => Ok(None),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(error(path, source)),
    }
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

/// The pid of the writer of a temp file `temp_path` named `name`, `None` when `name` is
/// not such a name: a writer killed between create and rename leaves its temp file
/// behind, and only its pid tells whether it may still be writing.
pub(crate) fn temp_writer(name: &str) -> Option<i32> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (_, tail) = inner.rsplit_once(".gpupin-")?;
    let (pid, n) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok().filter(|&p| p > 0)
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

    #[test]
    fn a_symlink_at_the_target_is_replaced_never_consulted() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, "theirs").unwrap();
        fs::set_permissions(&target, fs::Permissions::from_mode(0o666)).unwrap();
        let me = rustix::process::geteuid().as_raw();
        if me == 0 {
            std::os::unix::fs::chown(&target, Some(4242), Some(4242)).unwrap();
        }
        let path = dir.path().join("f");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        write(&path, b"ours", 0o644, Durability::Renamed).unwrap();
        let meta = fs::symlink_metadata(&path).unwrap();
        assert!(meta.is_file(), "the link itself is replaced");
        assert_eq!(meta.mode() & 0o7777, 0o644, "not the target's mode");
        assert_eq!(meta.uid(), me, "not the target's owner");
        assert_eq!(fs::read(&target).unwrap(), b"theirs");
    }

    #[test]
    fn replace_gives_exactly_the_mode_whatever_stood_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666)).unwrap();
        replace(&path, b"new", 0o644, Durability::Renamed).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o644);
        assert_eq!(fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn temp_names_tell_their_writer() {
        let dir = Path::new("/d");
        let tmp = temp_path(Path::new("/d/x.json"), dir);
        let name = tmp.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_writer(name), Some(std::process::id() as i32));
        assert_eq!(temp_writer(".x.json.gpupin-12-0.tmp"), Some(12));
        for other in [
            "x.json",
            ".x.json",
            ".x.gpupin-a-0.tmp",
            ".x.gpupin-0-0.tmp",
            ".x.gpupin-1-.tmp",
        ] {
            assert_eq!(temp_writer(other), None, "{other}");
        }
    }
}
