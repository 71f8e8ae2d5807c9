//! Live figures (utilization, free memory), read only when a policy or filter needs them:
//! from NVML on a real machine, from the `live_file` named in the config otherwise (so a
//! simulated machine, and the tests, can vary them).
//!
//! Live file format: `{"gpus": [{"uuid": "GPU-…", "utilization": 35, "memory_free": "20GiB"}]}`,
//! one entry per GPU, keyed by `uuid` or `index`; `memory_free` takes bytes or a size.

use super::{Inventory, InventoryError, NvmlAccess};
use crate::regular::{self, Links};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// What a GPU is doing now: NVML on a real machine, the `live_file` for simulated ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Live {
    /// GPU utilization, percent.
    pub utilization: u32,
    /// Free memory in bytes.
    pub memory_free: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiveFile {
    gpus: Vec<LiveEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiveEntry {
    uuid: Option<String>,
    index: Option<u32>,
    utilization: u32,
    memory_free: Value,
}

/// Live figures per position in `inventory.gpus`: from `live_file` when configured, else
/// NVML when the inventory came from it, else `None` (policies then fall back).
/// `nvml` says where NVML runs.
pub fn read(
    live_file: Option<&Path>,
    inventory: &Inventory,
    nvml: &NvmlAccess,
) -> Result<Option<Vec<Live>>, InventoryError> {
    if let Some(path) = live_file {
        return from_file(path, inventory).map(Some);
    }
    if inventory.source == "nvml" {
        return super::nvml::live(inventory, nvml).map(Some);
    }
    Ok(None)
}

fn from_file(path: &Path, inventory: &Inventory) -> Result<Vec<Live>, InventoryError> {
    // Named by the admin, so a link is followed; rewritten by whatever tracks the load, so
    // a FIFO there is refused rather than waited on.
    let text = regular::read(path, Links::Follow).map_err(|source| InventoryError::LiveRead {
        path: path.to_path_buf(),
        source,
    })?;
    from_text(&text, path, inventory)
}

/// The figures in `text` (the live file format) for each GPU of `inventory`; `origin`
/// names where the text came from in errors.
pub(super) fn from_text(
    text: &[u8],
    origin: &Path,
    inventory: &Inventory,
) -> Result<Vec<Live>, InventoryError> {
    let invalid = |reason: String| InventoryError::LiveInvalid {
        path: origin.to_path_buf(),
        reason,
    };
    let file: LiveFile = serde_json::from_slice(text).map_err(|e| invalid(e.to_string()))?;
    inventory
        .gpus
        .iter()
        .map(|gpu| {
            let entry = file
                .gpus
                .iter()
                .find(|e| {
                    e.uuid.as_deref() == Some(gpu.uuid.as_str()) || e.index == Some(gpu.index)
                })
                .ok_or_else(|| invalid(format!("no entry for GPU {} ({})", gpu.index, gpu.uuid)))?;
            let memory_free = match &entry.memory_free {
                Value::Number(n) => n.as_u64().ok_or("expected whole bytes".to_string()),
                Value::String(s) => crate::units::parse_size(s),
                _ => Err("expected bytes or a size such as 20GiB".to_string()),
            }
            .map_err(|e| invalid(format!("memory_free of GPU {}: {e}", gpu.index)))?;
            if entry.utilization > 100 {
                return Err(invalid(format!(
                    "utilization of GPU {} is {}: expected 0-100",
                    gpu.index, entry.utilization
                )));
            }
            Ok(Live {
                utilization: entry.utilization,
                memory_free,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    fn write(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn reads_by_uuid_or_index() {
        let f = write(
            r#"{"gpus": [{"uuid": "GPU-test-1", "utilization": 80, "memory_free": "10GiB"},
                         {"index": 0, "utilization": 5, "memory_free": 1024}]}"#,
        );
        let live = read(Some(f.path()), &machine(2), &NvmlAccess::InProcess)
            .unwrap()
            .unwrap();
        assert_eq!(
            live[0],
            Live {
                utilization: 5,
                memory_free: 1024
            }
        );
        assert_eq!(
            live[1],
            Live {
                utilization: 80,
                memory_free: 10 << 30
            }
        );
    }

    #[test]
    fn missing_gpu_and_bad_values_are_named() {
        let f = write(r#"{"gpus": [{"index": 0, "utilization": 5, "memory_free": 1}]}"#);
        let err = read(Some(f.path()), &machine(2), &NvmlAccess::InProcess)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no entry for GPU 1"), "{err}");
        let f = write(r#"{"gpus": [{"index": 0, "utilization": 500, "memory_free": 1}]}"#);
        let err = read(Some(f.path()), &machine(1), &NvmlAccess::InProcess)
            .unwrap_err()
            .to_string();
        assert!(err.contains("utilization of GPU 0 is 500"), "{err}");
    }

    #[test]
    fn errors_name_the_live_file_not_the_inventory() {
        let f = write("{");
        let err = read(Some(f.path()), &machine(1), &NvmlAccess::InProcess)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("invalid live file "), "{err}");
        assert!(err.contains(&f.path().display().to_string()), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("live.json");
        let err = read(Some(&missing), &machine(1), &NvmlAccess::InProcess)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("reading live file "), "{err}");
    }

    #[test]
    fn a_fifo_as_live_file_is_refused_without_blocking() {
        let (_dir, path) = crate::inventory::file::tests::fifo("live.json");
        let err = crate::inventory::file::tests::within_5s(move || {
            read(Some(&path), &machine(1), &NvmlAccess::InProcess).unwrap_err()
        });
        let line = crate::message::one_line(&err);
        assert!(line.starts_with("reading live file "), "{line}");
        assert!(line.contains("FIFO"), "{line}");
    }

    #[test]
    fn no_source_means_no_figures() {
        assert_eq!(
            read(None, &machine(2), &NvmlAccess::InProcess).unwrap(),
            None
        );
    }
}
