//! `mounts`: bind mounts a CDI spec adds (the driver's libraries, binaries, firmware).
//! The merge follows the CDI reference (container-device-interface, pkg/cdi
//! container-edits.go): a mount replaces any other at its destination, then every mount
//! is stable-sorted by the depth of its destination, so `/usr/lib` comes before a file
//! inside it whatever order the edits came in.

use super::SpecError;
use super::edit::array_at;
use serde_json::Value;

/// Adds `mounts` (OCI mount objects with a `destination`) to `spec.mounts`, each
/// replacing one already at its destination; then sorts by depth. Idempotent. No mounts:
/// the spec is left as it was, its order included.
pub(crate) fn add_mounts(spec: &mut Value, mounts: &[Value]) -> Result<(), SpecError> {
    if mounts.is_empty() {
        return Ok(());
    }
    let list = array_at(spec, &["mounts"], "mounts")?;
    for mount in mounts {
        let destination = mount.get("destination").and_then(Value::as_str).map(clean);
        list.retain(|m| m.get("destination").and_then(Value::as_str).map(clean) != destination);
        list.push(mount.clone());
    }
    // Stable: mounts at one depth keep their order (Docker's /dev before /dev/pts).
    list.sort_by_key(|m| {
        m.get("destination")
            .and_then(Value::as_str)
            .map_or(0, depth)
    });
    Ok(())
}

/// A destination without repeated or trailing slashes and `.` components, as Go's
/// `filepath.Clean` has it for the paths specs carry (`..` is left alone: no spec
/// writer produces it, and resolving it here would not make the runtime agree).
fn clean(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    match (path.starts_with('/'), parts.is_empty()) {
        (true, _) => format!("/{}", parts.join("/")),
        (false, true) => ".".into(),
        (false, false) => parts.join("/"),
    }
}

/// The number of separators in the cleaned path: the CDI reference's sort key.
fn depth(path: &str) -> usize {
    clean(path).matches('/').count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bind(destination: &str, source: &str) -> Value {
        json!({"destination": destination, "source": source, "options": ["ro", "rbind"]})
    }

    fn destinations(spec: &Value) -> Vec<&str> {
        spec["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_mount_replaces_the_one_at_its_destination_and_all_sort_by_depth() {
        let mut spec = json!({"mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts"},
            bind("/usr/bin/nvidia-smi/", "/image/nvidia-smi"),
            {"destination": "/sys", "type": "sysfs", "source": "sysfs"},
        ]});
        let added = [
            bind(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/root/libcuda.so.1",
            ),
            bind("/usr/bin/nvidia-smi", "/root/nvidia-smi"),
        ];
        add_mounts(&mut spec, &added).unwrap();
        assert_eq!(
            destinations(&spec),
            [
                "/proc",
                "/dev",
                "/sys",
                "/dev/pts",
                "/usr/bin/nvidia-smi",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            ]
        );
        assert_eq!(spec["mounts"][4]["source"], "/root/nvidia-smi");
        let once = spec.clone();
        add_mounts(&mut spec, &added).unwrap();
        assert_eq!(spec, once);
    }

    #[test]
    fn no_mounts_leave_the_spec_alone() {
        let mut spec = json!({"mounts": [bind("/a/b", "/x"), bind("/a", "/y")]});
        let before = spec.clone();
        add_mounts(&mut spec, &[]).unwrap();
        assert_eq!(spec, before);
        let mut none = json!({});
        add_mounts(&mut none, &[]).unwrap();
        assert_eq!(none, json!({}));
    }

    #[test]
    fn clean_drops_repeated_and_trailing_slashes() {
        assert_eq!(clean("//usr//lib/./x/"), "/usr/lib/x");
        assert_eq!(clean("/"), "/");
        assert_eq!(depth("/usr/lib/"), 2);
    }
}
