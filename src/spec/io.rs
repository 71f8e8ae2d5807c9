//! Reading and atomically rewriting a bundle's config.json.

use super::SpecError;
use serde_json::Value;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Mode of a config.json written where none existed (what containerd and runc spec use).
const NEW_FILE_MODE: u32 = 0o644;

/// Reads a bundle's config.json.
pub fn read(path: &Path) -> Result<Value, SpecError> {
    let text = fs::read(path).map_err(|source| SpecError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path)
}

/// Parses config.json bytes already read; `path` names the file in errors.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Value, SpecError> {
    serde_json::from_slice(bytes).map_err(|source| SpecError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Writes `spec` to `path` atomically (temp file in the same dir, fsync, rename).
///
/// The temp file gets the original's mode and owner, so a runtime that runs the
/// container as another user still reads it. A crash leaves either the old or the new
/// file, never a truncated one: the data is fsynced before the rename and the directory
/// after it, so the rename itself is durable.
pub fn write_atomic(path: &Path, spec: &Value) -> Result<(), SpecError> {
    let bytes = serde_json::to_vec(spec).map_err(|source| SpecError::Serialize {
        path: path.to_owned(),
        source,
    })?;
    let dir = parent_dir(path);
    let tmp = temp_path(path, &dir);
    let result = write_file(&tmp, path, &bytes)
        .and_then(|()| fs::rename(&tmp, path).map_err(|source| write_error(path, source)));
    if result.is_err() {
        // Best effort: the temp file is ours and useless after a failure.
        let _ = fs::remove_file(&tmp);
        return result;
    }
    File::open(&dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|source| write_error(&dir, source))
}

/// Writes and fsyncs `bytes` into a new file `tmp` with the mode and owner of `original`.
fn write_file(tmp: &Path, original: &Path, bytes: &[u8]) -> Result<(), SpecError> {
    let existing = match fs::metadata(original) {
        Ok(meta) => Some(meta),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(write_error(original, source)),
    };
    let mode = existing
        .as_ref()
        .map_or(NEW_FILE_MODE, |m| m.mode() & 0o7777);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .mode(0o600)
        .open(tmp)
        .map_err(|source| write_error(tmp, source))?;
    let io = (|| {
        file.write_all(bytes)?;
        if let Some(meta) = &existing {
            std::os::unix::fs::fchown(&file, Some(meta.uid()), Some(meta.gid()))?;
        }
        // fchmod after fchown: chown clears set-id bits, and umask does not apply here.
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        file.sync_all()
    })();
    io.map_err(|source| write_error(tmp, source))
}

fn parent_dir(path: &Path) -> PathBuf {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// A temp name unique within this process and across processes (pid), hidden (dot).
fn temp_path(path: &Path, dir: &Path) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name = path
        .file_name()
        .map_or_else(|| "config.json".into(), |n| n.to_string_lossy());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".{name}.gpupin-{}-{n}.tmp", std::process::id()))
}

fn write_error(path: &Path, source: std::io::Error) -> SpecError {
    SpecError::Write {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_key_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        let text = r#"{"z":1,"a":{"y":2,"b":3},"m":[1,2]}"#;
        fs::write(&path, text).unwrap();
        let spec = read(&path).unwrap();
        write_atomic(&path, &spec).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
    }

    #[test]
    fn rewrite_keeps_mode_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, "{}").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        write_atomic(&path, &json!({"a": 1})).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o640);
        assert_eq!(read(&path).unwrap(), json!({"a": 1}));
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn new_file_gets_default_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        write_atomic(&path, &json!({})).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, NEW_FILE_MODE);
    }

    #[test]
    fn malformed_json_names_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        fs::write(&path, "{\"a\":").unwrap();
        let err = read(&path).unwrap_err();
        assert!(matches!(err, SpecError::Parse { .. }));
        assert!(err.to_string().contains("config.json"), "{err}");
    }

    #[test]
    fn missing_file_is_a_read_error() {
        let err = read(Path::new("/nonexistent/config.json")).unwrap_err();
        assert!(matches!(err, SpecError::Read { .. }));
    }

    #[test]
    fn missing_dir_fails_without_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone/config.json");
        let err = write_atomic(&path, &json!({})).unwrap_err();
        assert!(matches!(err, SpecError::Write { .. }));
    }
}
