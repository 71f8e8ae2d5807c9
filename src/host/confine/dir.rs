//! A job's cgroup directory: made (a leftover of the same name replaced when empty),
//! written to, entered and removed. cgroupfs has no symlinks and no FIFOs, but every open
//! is still no-follow: the paths come from text another process could shape.

use super::ConfineError;
use std::fs::{DirBuilder, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// `gpupin-<name>`, refusing anything but a holder id's characters (no `/`, no
/// whitespace) so that the name can neither leave the parent cgroup nor be mistaken for
/// a cgroup interface file.
pub(super) fn leaf_name(name: &str) -> Result<String, ConfineError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if name.is_empty() || !name.chars().all(valid) {
        return Err(ConfineError::InvalidName {
            name: name.to_owned(),
        });
    }
    Ok(format!("gpupin-{name}"))
}

/// Makes `<parent>/<leaf>`. A leftover (a crash between confine and remove) is removed
/// and made anew, never reused as it is: its old deny entries or BPF programs would
/// outlive the job they were for. rmdir refuses (EBUSY) while processes are in it.
pub(super) fn create(parent: &Path, leaf: &str) -> Result<PathBuf, ConfineError> {
    let dir = parent.join(leaf);
    let mkdir = || DirBuilder::new().mode(0o755).create(&dir);
    match mkdir() {
        Err(err) if err.kind() == ErrorKind::AlreadyExists => {
            match std::fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(err) if err.raw_os_error() == Some(libc::EBUSY) => {
                    return Err(ConfineError::InUse { path: dir });
                }
                Err(source) => return Err(ConfineError::Remove { path: dir, source }),
            }
            tracing::info!(path = %dir.display(), "replaced an empty leftover job cgroup");
            mkdir()
        }
        made => made,
    }
    .map_err(|source| ConfineError::Mkdir {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// Writes `value` to the cgroup file `dir/file` in one write(2): cgroupfs takes each
/// write as one command (one rule, one pid).
pub(super) fn write(dir: &Path, file: &str, value: &str) -> Result<(), ConfineError> {
    let path = dir.join(file);
    let error = |source| ConfineError::Write {
        path: path.clone(),
        value: value.to_owned(),
        source,
    };
    let mut opened = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .map_err(error)?;
    match opened.write(value.as_bytes()) {
        Ok(n) if n == value.len() => Ok(()),
        Ok(_) => Err(error(ErrorKind::WriteZero.into())),
        Err(source) => Err(error(source)),
    }
}

/// Moves the whole process `pid` (all its threads) into `dir`.
pub(super) fn move_pid(dir: &Path, pid: i32) -> Result<(), ConfineError> {
    write(dir, "cgroup.procs", &pid.to_string())
}

/// rmdir; a cgroup already gone is no error.
pub(super) fn remove(dir: &Path) -> Result<(), ConfineError> {
    match std::fs::remove_dir(dir) {
        Err(err) if err.kind() != ErrorKind::NotFound => Err(ConfineError::Remove {
            path: dir.to_owned(),
            source: err,
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_make_leaf_names_and_nothing_else_does() {
        assert_eq!(leaf_name("job-1.a_b").unwrap(), "gpupin-job-1.a_b");
        for bad in ["", "../x", "a/b", "a b", "a\nb", "é"] {
            let err = leaf_name(bad).unwrap_err();
            assert!(
                matches!(err, ConfineError::InvalidName { .. }),
                "{bad:?}: {err}"
            );
        }
    }
}
