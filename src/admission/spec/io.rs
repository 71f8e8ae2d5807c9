//! Reading and atomically rewriting a bundle's config.json.

use super::SpecError;
use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use serde_json::Value;
use std::path::Path;

/// Mode of a config.json written where none existed (what containerd and runc spec use).
const NEW_FILE_MODE: u32 = 0o644;

/// Reads a bundle's config.json: a regular file, never through a symlink, never a FIFO
/// (the bundle may be a hostile one).
pub(crate) fn read(path: &Path) -> Result<Value, SpecError> {
    let text = safe_open::read(path, Links::Refuse).map_err(|source| SpecError::Read {
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

/// Writes `spec` to `path` atomically (temp file in the same dir, rename).
///
/// The temp file gets the original's mode and owner, so a runtime that runs the
/// container as another user still reads it. The runtime reads either the old or the new
/// file, never half of one. No fsync: a bundle does not outlive the host's next boot
/// (containerd and runc keep them under /run), and a container whose start a crash cut
/// short is created again from a fresh bundle.
pub(crate) fn write_atomic(path: &Path, spec: &Value) -> Result<(), SpecError> {
    let bytes = serde_json::to_vec(spec).map_err(|source| SpecError::Serialize {
        path: path.to_owned(),
        source,
    })?;
    atomic::write(path, &bytes, NEW_FILE_MODE, Durability::Renamed).map_err(|e| SpecError::Write {
        path: e.path,
        source: e.source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

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
