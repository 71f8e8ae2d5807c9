//! Typed reads of spec fields that gpupin needs but never rewrites.

use super::{SpecError, type_name};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The host path of the container's root filesystem: `root.path`, relative to `bundle`
/// when not absolute (OCI runtime spec, config.md "Root").
pub(crate) fn rootfs_path(spec: &Value, bundle: &Path) -> Result<PathBuf, SpecError> {
    let path = match spec.get("root").and_then(|root| root.get("path")) {
        None | Some(Value::Null) => return Err(SpecError::Missing { field: "root.path" }),
        Some(Value::String(path)) if path.is_empty() => {
            return Err(SpecError::Missing { field: "root.path" });
        }
        Some(Value::String(path)) => Path::new(path),
        Some(other) => {
            return Err(SpecError::WrongType {
                field: "root.path",
                expected: "a string",
                found: type_name(other),
            });
        }
    };
    // Path::join keeps `path` as is when it is absolute.
    Ok(bundle.join(path))
}

/// `annotations` as a map; entries whose value is not a string are skipped (the spec
/// requires strings, and a malformed entry must not hide the valid ones).
pub(crate) fn annotations(spec: &Value) -> HashMap<String, String> {
    let Some(Value::Object(map)) = spec.get("annotations") else {
        return HashMap::new();
    };
    map.iter()
        .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn relative_root_is_joined_to_bundle() {
        let spec = json!({"root": {"path": "rootfs"}});
        let path = rootfs_path(&spec, Path::new("/run/b")).unwrap();
        assert_eq!(path, PathBuf::from("/run/b/rootfs"));
    }

    #[test]
    fn absolute_root_is_kept() {
        let spec = json!({"root": {"path": "/var/lib/x/merged"}});
        let path = rootfs_path(&spec, Path::new("/run/b")).unwrap();
        assert_eq!(path, PathBuf::from("/var/lib/x/merged"));
    }

    #[test]
    fn missing_or_mistyped_root_is_an_error() {
        let err = rootfs_path(&json!({}), Path::new("/b")).unwrap_err();
        assert!(matches!(err, SpecError::Missing { .. }));
        let err = rootfs_path(&json!({"root": {"path": 3}}), Path::new("/b")).unwrap_err();
        assert!(matches!(err, SpecError::WrongType { .. }));
    }

    #[test]
    fn annotations_skip_non_strings() {
        let spec = json!({"annotations": {"gpupin.count": "2", "n": 1, "o": {}}});
        let map = annotations(&spec);
        assert_eq!(map.len(), 1);
        assert_eq!(map["gpupin.count"], "2");
    }

    #[test]
    fn absent_annotations_are_empty() {
        assert!(annotations(&json!({"annotations": []})).is_empty());
        assert!(annotations(&json!({})).is_empty());
    }
}
