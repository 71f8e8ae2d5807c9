//! Reading daemon.json, keeping a backup of it and replacing it atomically.

use crate::base::atomic::{self, Durability};
use std::fs;
use std::path::{Path, PathBuf};

/// Appended to the file's name for the copy taken before each change gpupin makes.
/// One fixed name, overwritten by the next change: it always undoes the last change,
/// and repeated installs do not pile up copies.
pub(crate) const BACKUP_SUFFIX: &str = ".gpupin-backup";
/// Mode of a daemon.json gpupin creates (what Docker's packages ship).
const NEW_FILE_MODE: u32 = 0o644;

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file's text; `None` when it does not exist.
pub fn read(path: &Path) -> Result<Option<String>, FileError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(FileError::Read {
            path: path.to_owned(),
            source,
        }),
    }
}

/// Where the backup of `path` goes.
pub(crate) fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(BACKUP_SUFFIX);
    PathBuf::from(name)
}

/// Copies an existing `path` to its backup, then replaces it with `text`. Returns the
/// backup's path, `None` when there was no file to back up.
pub fn replace_with_backup(path: &Path, text: &str) -> Result<Option<PathBuf>, FileError> {
    let backup = if path.exists() {
        let backup = backup_path(path);
        fs::copy(path, &backup).map_err(|source| write_error(&backup, source))?;
        Some(backup)
    } else {
        None
    };
    write_atomic(path, text)?;
    Ok(backup)
}

/// Through `atomic::write`: dockerd reloading at any moment reads either the old or the
/// new file, never half of one.
fn write_atomic(path: &Path, text: &str) -> Result<(), FileError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|source| write_error(dir, source))?;
    }
    atomic::write(path, text.as_bytes(), NEW_FILE_MODE, Durability::Synced)
        .map_err(|e| write_error(&e.path, e.source))
}

fn write_error(path: &Path, source: std::io::Error) -> FileError {
    FileError::Write {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn missing_file_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("daemon.json")).unwrap(), None);
    }

    #[test]
    fn replace_keeps_the_previous_text_and_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("daemon.json");
        fs::write(&path, "{\"a\":1}").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let backup = replace_with_backup(&path, "{}\n").unwrap().unwrap();
        assert_eq!(backup, dir.path().join("daemon.json.gpupin-backup"));
        assert_eq!(fs::read_to_string(&backup).unwrap(), "{\"a\":1}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}\n");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn replace_creates_a_missing_file_and_its_directory_without_backup() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docker/daemon.json");
        assert_eq!(replace_with_backup(&path, "{}\n").unwrap(), None);
        assert_eq!(fs::read_to_string(&path).unwrap(), "{}\n");
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
    }
}
