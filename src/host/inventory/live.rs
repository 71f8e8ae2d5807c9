//! Live figures (utilization, memory, temperature, power, and the processes on each GPU):
//! from NVML on a real machine, from the `live_file` named in the config otherwise (so a
//! simulated machine, and the tests, can vary them).
//!
//! Live file format, one entry per GPU, keyed by `uuid` or `index`:
//!
//! ```json
//! {"gpus": [{"uuid": "GPU-…", "utilization": 35, "memory_free": "20GiB",
//!            "temperature": 41, "power": 120,
//!            "processes": [{"pid": 4242, "used_memory": "2GiB"}]}]}
//! ```
//!
//! `memory_free` and `used_memory` take bytes or a size; `utilization` (percent), `temperature` (degrees Celsius),
//! `power` (watts), `processes` and each process's `used_memory` may be left out where
//! the source does not know them. `gpupin nvml live` prints this format by UUID, and the
//! NVML snapshot cache (`live_cache`) keeps it. Which source answers is `read_live`'s
//! (the inventory's front door), above this file, NVML and the cache.

use super::InventoryError;
use crate::base::safe_open::{self, Links};
use crate::model::gpu::Inventory;
use crate::model::live::{GpuProcess, Live};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

/// The NVML snapshot cache of an allocation: where, and how old a snapshot may be.
#[derive(Debug, Clone, Copy)]
pub struct Cache<'a> {
    pub state_dir: &'a Path,
    pub max_age: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LiveFile {
    gpus: Vec<Entry>,
}

/// One GPU's entry of the live file format.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Entry {
    uuid: Option<String>,
    index: Option<u32>,
    #[serde(default)]
    utilization: Option<u32>,
    memory_free: Value,
    #[serde(default)]
    temperature: Option<u32>,
    #[serde(default)]
    power: Option<u32>,
    #[serde(default)]
    processes: Option<Vec<ProcessEntry>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessEntry {
    pid: i64,
    #[serde(default)]
    used_memory: Value,
}

pub(super) fn from_file(path: &Path, inventory: &Inventory) -> Result<Vec<Live>, InventoryError> {
    // Named by the admin, so a link is followed; rewritten by whatever tracks the load, so
    // a FIFO there is refused rather than waited on.
    let text = safe_open::read(path, Links::Follow).map_err(|source| InventoryError::LiveRead {
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
    let file: LiveFile = serde_json::from_slice(text).map_err(|e| InventoryError::LiveInvalid {
        path: origin.to_path_buf(),
        reason: e.to_string(),
    })?;
    assign(&file.gpus, origin, inventory)
}

/// The entry of each GPU of `inventory`, by UUID or index, checked and converted.
pub(super) fn assign(
    entries: &[Entry],
    origin: &Path,
    inventory: &Inventory,
) -> Result<Vec<Live>, InventoryError> {
    let invalid = |reason: String| InventoryError::LiveInvalid {
        path: origin.to_path_buf(),
        reason,
    };
    inventory
        .gpus
        .iter()
        .map(|gpu| {
            let entry = entries
                .iter()
                .find(|e| {
                    e.uuid.as_deref() == Some(gpu.uuid.as_str()) || e.index == Some(gpu.index)
                })
                .ok_or_else(|| invalid(format!("no entry for GPU {} ({})", gpu.index, gpu.uuid)))?;
            convert(entry, gpu.index).map_err(invalid)
        })
        .collect()
}

fn convert(entry: &Entry, index: u32) -> Result<Live, String> {
    let memory_free = size(&entry.memory_free)
        .and_then(|m| m.ok_or_else(|| "expected bytes or a size such as 20GiB".to_string()))
        .map_err(|e| format!("memory_free of GPU {index}: {e}"))?;
    if let Some(utilization) = entry.utilization.filter(|&u| u > 100) {
        return Err(format!(
            "utilization of GPU {index} is {utilization}: expected 0-100"
        ));
    }
    let processes = match &entry.processes {
        None => None,
        Some(list) => Some(
            list.iter()
                .map(|p| process(p, index))
                .collect::<Result<Vec<_>, _>>()?,
        ),
    };
    Ok(Live {
        utilization: entry.utilization,
        memory_free,
        temperature: entry.temperature,
        power: entry.power,
        processes,
    })
}

fn process(entry: &ProcessEntry, index: u32) -> Result<GpuProcess, String> {
    let pid = i32::try_from(entry.pid)
        .ok()
        .filter(|&pid| pid > 0)
        .ok_or_else(|| {
            format!(
                "pid {} on GPU {index}: expected a process id above 0",
                entry.pid
            )
        })?;
    let used_memory = size(&entry.used_memory)
        .map_err(|e| format!("used_memory of pid {pid} on GPU {index}: {e}"))?;
    Ok(GpuProcess { pid, used_memory })
}

/// Bytes or a size (`20GiB`); `None` when left out.
fn size(value: &Value) -> Result<Option<u64>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_u64()
            .map(Some)
            .ok_or("expected whole bytes".to_string()),
        Value::String(s) => crate::base::units::parse_size(s).map(Some),
        _ => Err("expected bytes or a size such as 20GiB".to_string()),
    }
}

/// GPUs by UUID with their figures in the live file format: what `gpupin nvml live`
/// prints and the snapshot cache keeps.
pub(super) fn entries_json(gpus: &[(String, Live)]) -> Vec<Value> {
    gpus.iter()
        .map(|(uuid, live)| {
            let processes = live.processes.as_ref().map(|list| {
                list.iter()
                    .map(|p| json!({"pid": p.pid, "used_memory": p.used_memory}))
                    .collect::<Vec<_>>()
            });
            json!({
                "uuid": uuid,
                "utilization": live.utilization,
                "memory_free": live.memory_free,
                "temperature": live.temperature,
                "power": live.power,
                "processes": processes,
            })
        })
        .collect()
}

/// The live file format for `gpus`, by UUID.
pub(crate) fn to_json(gpus: &[(String, Live)]) -> String {
    json!({ "gpus": entries_json(gpus) }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::inventory::NvmlAccess;
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
        let live = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(2),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            live[0],
            Live {
                utilization: Some(5),
                memory_free: 1024,
                ..Live::default()
            }
        );
        assert_eq!(
            live[1],
            Live {
                utilization: Some(80),
                memory_free: 10 << 30,
                ..Live::default()
            }
        );
    }

    #[test]
    fn missing_gpu_and_bad_values_are_named() {
        let f = write(r#"{"gpus": [{"index": 0, "utilization": 5, "memory_free": 1}]}"#);
        let err = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(2),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("no entry for GPU 1"), "{err}");
        let f = write(r#"{"gpus": [{"index": 0, "utilization": 500, "memory_free": 1}]}"#);
        let err = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(1),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("utilization of GPU 0 is 500"), "{err}");
    }

    #[test]
    fn errors_name_the_live_file_not_the_inventory() {
        let f = write("{");
        let err = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(1),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("invalid live file "), "{err}");
        assert!(err.contains(&f.path().display().to_string()), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("live.json");
        let err = crate::host::inventory::read_live(
            Some(&missing),
            &machine(1),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("reading live file "), "{err}");
    }

    #[test]
    fn a_fifo_as_live_file_is_refused_without_blocking() {
        let (_dir, path) = crate::host::inventory::file::tests::fifo("live.json");
        let err = crate::host::inventory::file::tests::within_5s(move || {
            crate::host::inventory::read_live(
                Some(&path),
                &machine(1),
                &NvmlAccess::InProcess,
                None,
            )
            .unwrap_err()
        });
        let line = crate::base::message::one_line(&err);
        assert!(line.starts_with("reading live file "), "{line}");
        assert!(line.contains("FIFO"), "{line}");
    }

    #[test]
    fn temperature_power_and_processes_are_read_where_given() {
        let f = write(
            r#"{"gpus": [{"index": 0, "utilization": 5, "memory_free": 1, "temperature": 41,
                          "power": 120, "processes": [{"pid": 4242, "used_memory": "2GiB"},
                                                      {"pid": 77}]},
                         {"index": 1, "utilization": 0, "memory_free": 1, "processes": []}]}"#,
        );
        let live = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(2),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(live[0].temperature, Some(41));
        assert_eq!(live[0].power, Some(120));
        assert_eq!(
            live[0].processes,
            Some(vec![
                GpuProcess {
                    pid: 4242,
                    used_memory: Some(2 << 30)
                },
                GpuProcess {
                    pid: 77,
                    used_memory: None
                }
            ])
        );
        assert_eq!(live[1].processes, Some(vec![]));
        assert_eq!(live[1].temperature, None);
    }

    #[test]
    fn a_gpu_without_processes_key_has_them_unknown() {
        let f = write(r#"{"gpus": [{"index": 0, "utilization": 5, "memory_free": 1}]}"#);
        let live = crate::host::inventory::read_live(
            Some(f.path()),
            &machine(1),
            &NvmlAccess::InProcess,
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(live[0].processes, None);
    }

    #[test]
    fn bad_pids_and_process_memory_are_named() {
        for (process, wanted) in [
            (
                r#"{"pid": 0}"#,
                "pid 0 on GPU 0: expected a process id above 0",
            ),
            (r#"{"pid": -4}"#, "pid -4 on GPU 0"),
            (r#"{"pid": 4294967296}"#, "pid 4294967296 on GPU 0"),
            (
                r#"{"pid": 5, "used_memory": "2 gigs"}"#,
                "used_memory of pid 5 on GPU 0",
            ),
            (r#"{"pid": 5, "user": "bob"}"#, "unknown field `user`"),
        ] {
            let f = write(&format!(
                r#"{{"gpus": [{{"index": 0, "utilization": 5, "memory_free": 1, "processes": [{process}]}}]}}"#
            ));
            let err = crate::host::inventory::read_live(
                Some(f.path()),
                &machine(1),
                &NvmlAccess::InProcess,
                None,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(wanted), "{process}: {err}");
        }
    }

    #[test]
    fn the_json_written_reads_back_the_same() {
        let inv = machine(2);
        let figures = vec![
            Live {
                utilization: Some(7),
                memory_free: 3 << 30,
                temperature: Some(50),
                power: Some(300),
                processes: Some(vec![GpuProcess {
                    pid: 9,
                    used_memory: Some(1 << 20),
                }]),
            },
            Live::default(),
        ];
        let by_uuid: Vec<(String, Live)> = inv
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .zip(figures.clone())
            .collect();
        let text = to_json(&by_uuid);
        let back = from_text(text.as_bytes(), Path::new("x"), &inv).unwrap();
        assert_eq!(back, figures);
    }

    #[test]
    fn no_source_means_no_figures() {
        assert_eq!(
            crate::host::inventory::read_live(None, &machine(2), &NvmlAccess::InProcess, None)
                .unwrap(),
            None
        );
    }
}
