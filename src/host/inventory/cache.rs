//! The inventory cache in the state dir: `<state_dir>/inventory.json`, so a hook never pays
//! NVML's start-up cost (1-3 s per GPU without persistence mode).
//!
//! ```json
//! {"boot_id": "…", "source": "auto", "backend": "nvml", "inventory": { … file format … }}
//! ```
//! `source` is the configured source (`auto`, `nvml`, `procfs`), `backend` the one that
//! answered. The cache is used only when both the boot id
//! (/proc/sys/kernel/random/boot_id) and `source` match: GPUs, minors and majors can change
//! across reboots, and another source must probe again. Where GPUs are cut into MIG
//! instances, `boot_id` also names the MIG geometry (`procfs::mig_geometry`: which
//! compute instances the driver's capabilities tree shows), since an admin creates and
//! destroys instances without a reboot: a changed geometry is probed again, and an
//! instance that is gone is no longer in the inventory. An unreadable or invalid cache is
//! probed over. It is not written
//! - when the state dir does not exist: the ledger owns and creates it;
//! - when the boot id is unreadable: the cache could never be validated;
//! - when the inventory has no `/dev/nvidia-uvm`: the module is loaded on first CUDA use,
//!   and a copy without it would deny CUDA to every container until reboot.
//!
//! `load` ignores a failure to write (the cache only saves time); `refresh` reports it.
//! Writes are atomic: a temp file in the same dir, fsync, rename, fsync of the dir.

use super::{InventoryError, file, procfs};
use crate::base::atomic::{self, Durability};
use crate::base::safe_open::{self, Links};
use crate::model::gpu::Inventory;
use std::path::Path;

const FILE_NAME: &str = "inventory.json";
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Cached {
    boot_id: String,
    source: String,
    backend: String,
    inventory: serde_json::Value,
}

/// The inventory cached this boot for `source` (the configured source's name), else
/// `probe`'s answer, stored for the next caller.
pub(crate) fn load_or_probe(
    source: &str,
    state_dir: &Path,
    probe: impl FnOnce() -> Result<Inventory, InventoryError>,
) -> Result<Inventory, InventoryError> {
    load_or_probe_with(source, state_dir, boot_id().as_deref(), probe)
}

/// `probe`'s answer, stored for `source` whatever the cache held; a failure to store it
/// is reported.
pub(crate) fn probe_and_store(
    source: &str,
    state_dir: &Path,
    probe: impl FnOnce() -> Result<Inventory, InventoryError>,
) -> Result<Inventory, InventoryError> {
    probe_and_store_with(source, state_dir, boot_id().as_deref(), probe)
}

/// The boot id, with the MIG geometry after it where there is one (the module docs say why).
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string(BOOT_ID).ok()?;
    let id = Some(id.trim().to_string()).filter(|id| !id.is_empty())?;
    Some(with_geometry(id, &procfs::mig_geometry(Path::new("/proc"))))
}

/// Without MIG the stamp stays the bare boot id, so caches written before MIG stay valid.
fn with_geometry(boot_id: String, geometry: &str) -> String {
    match geometry.is_empty() {
        true => boot_id,
        false => format!("{boot_id} mig:{geometry}"),
    }
}

/// NVML first (it knows memory and NVLink), procfs when NVML cannot answer.
pub(super) fn probe_auto(
    nvml: impl FnOnce() -> Result<Inventory, InventoryError>,
    procfs: impl FnOnce() -> Result<Inventory, InventoryError>,
) -> Result<Inventory, InventoryError> {
    nvml().or_else(|nvml_err| {
        // A helper that cannot be started is a broken install, not a machine without
        // NVML: falling back would hide it behind a poorer inventory.
        // Nor is a GPU in MIG mode whose instances NVML cannot read: procfs may show it
        // whole (no GPU instance in its tree), and it would be handed out whole.
        if matches!(
            nvml_err,
            InventoryError::NvmlHelperStart { .. }
                | InventoryError::MigUnreadable { .. }
                | InventoryError::NvmlHelperMigUnreadable { .. }
        ) {
            return Err(nvml_err);
        }
        procfs().map_err(|procfs_err| InventoryError::NothingFound {
            nvml: crate::base::message::one_line(&nvml_err),
            procfs: crate::base::message::one_line(&procfs_err),
        })
    })
}

fn load_or_probe_with(
    source: &str,
    state_dir: &Path,
    boot_id: Option<&str>,
    probe: impl FnOnce() -> Result<Inventory, InventoryError>,
) -> Result<Inventory, InventoryError> {
    if let Some(inv) = boot_id.and_then(|id| read_cache(state_dir, id, source)) {
        tracing::debug!(source = %source, backend = ?inv.source, "inventory from the cache");
        return Ok(inv);
    }
    let inv = probe()?;
    // The cache only saves time; a full or read-only state dir must not stop a container.
    let stored = store(state_dir, boot_id, source, &inv);
    tracing::debug!(
        source = %source,
        backend = ?inv.source,
        cached = stored.is_ok(),
        "inventory probed"
    );
    Ok(inv)
}

fn probe_and_store_with(
    source: &str,
    state_dir: &Path,
    boot_id: Option<&str>,
    probe: impl FnOnce() -> Result<Inventory, InventoryError>,
) -> Result<Inventory, InventoryError> {
    let inv = probe()?;
    store(state_dir, boot_id, source, &inv)?;
    Ok(inv)
}

/// The cached inventory when it was stored this boot for this source.
fn read_cache(state_dir: &Path, boot_id: &str, source: &str) -> Option<Inventory> {
    let path = state_dir.join(FILE_NAME);
    // In the state dir: never through a link, never a FIFO.
    let text = safe_open::read_to_string(&path, Links::Refuse).ok()?;
    let cached: Cached = serde_json::from_str(&text).ok()?;
    if cached.boot_id != boot_id || cached.source != source {
        return None;
    }
    let mut inv = file::from_value(cached.inventory, &path).ok()?;
    inv.source = cached.backend;
    Some(inv)
}

fn store(
    state_dir: &Path,
    boot_id: Option<&str>,
    source: &str,
    inv: &Inventory,
) -> Result<(), InventoryError> {
    let Some(boot_id) = boot_id else {
        return Ok(());
    };
    let has_uvm = inv.control_nodes.iter().any(|n| n.path == super::UVM_NODE);
    if !state_dir.is_dir() || !has_uvm {
        return Ok(());
    }
    let cached = Cached {
        boot_id: boot_id.to_string(),
        source: source.to_string(),
        backend: inv.source.clone(),
        inventory: file::to_value(inv),
    };
    let path = state_dir.join(FILE_NAME);
    write_atomically(&path, &file::pretty(&cached))
        .map_err(|source| InventoryError::CacheWrite { path, source })
}

/// 0644: hooks running as other users read the cache too.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    atomic::write(path, text.as_bytes(), 0o644, Durability::Synced).map_err(|e| e.source)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::inventory::sim;
    use std::cell::Cell;
    use std::os::unix::fs::PermissionsExt;

    fn machine(source: &str) -> Inventory {
        let mut inv = sim::machine("pcie8").unwrap();
        inv.source = source.to_string();
        inv
    }

    /// A probe that counts its calls.
    fn counting<'a>(
        calls: &'a Cell<u32>,
        inv: &'a Inventory,
    ) -> impl FnOnce() -> Result<Inventory, InventoryError> + 'a {
        move || {
            calls.set(calls.get() + 1);
            Ok(inv.clone())
        }
    }

    #[test]
    fn second_load_reads_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let (calls, inv) = (Cell::new(0), machine("nvml"));
        let auto = "auto";
        let first = load_or_probe_with(auto, dir.path(), Some("b1"), counting(&calls, &inv));
        assert_eq!(first.unwrap(), inv);
        let second = load_or_probe_with(auto, dir.path(), Some("b1"), counting(&calls, &inv));
        assert_eq!(second.unwrap(), inv);
        assert_eq!(calls.get(), 1);
        let text = std::fs::read_to_string(dir.path().join(FILE_NAME)).unwrap();
        assert!(text.contains(r#""backend": "nvml""#), "{text}");
    }

    #[test]
    fn new_boot_or_other_source_probes_again() {
        let dir = tempfile::tempdir().unwrap();
        let (calls, inv) = (Cell::new(0), machine("procfs"));
        let procfs = "procfs";
        load_or_probe_with(procfs, dir.path(), Some("b1"), counting(&calls, &inv)).unwrap();
        load_or_probe_with(procfs, dir.path(), Some("b2"), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 2);
        let nvml = "nvml";
        load_or_probe_with(nvml, dir.path(), Some("b2"), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 3);
        // The last probe replaced the cache: nvml on b2 is now cached.
        load_or_probe_with(nvml, dir.path(), Some("b2"), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 3);
    }

    #[test]
    fn a_new_mig_geometry_probes_again() {
        let dir = tempfile::tempdir().unwrap();
        let proc = dir.path().join("proc");
        let caps = proc.join("driver/nvidia/capabilities/gpu0/mig");
        let stamp = || with_geometry("b1".into(), &procfs::mig_geometry(&proc));
        assert_eq!(stamp(), "b1");
        std::fs::create_dir_all(caps.join("gi1/ci0")).unwrap();
        assert_eq!(stamp(), "b1 mig:gpu0/gi1/ci0");
        let (calls, inv) = (Cell::new(0), machine("procfs"));
        let procfs = "procfs";
        let first = stamp();
        load_or_probe_with(procfs, dir.path(), Some(&first), counting(&calls, &inv)).unwrap();
        load_or_probe_with(procfs, dir.path(), Some(&stamp()), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 1);
        // An admin destroys GI 1 and creates GI 2 with two compute instances.
        std::fs::remove_dir_all(caps.join("gi1")).unwrap();
        std::fs::create_dir_all(caps.join("gi2/ci0")).unwrap();
        std::fs::create_dir_all(caps.join("gi2/ci1")).unwrap();
        assert_eq!(stamp(), "b1 mig:gpu0/gi2/ci0,gpu0/gi2/ci1");
        load_or_probe_with(procfs, dir.path(), Some(&stamp()), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn corrupt_cache_is_probed_over() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE_NAME), "{not json").unwrap();
        let (calls, inv) = (Cell::new(0), machine("nvml"));
        let nvml = "nvml";
        load_or_probe_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv)).unwrap();
        load_or_probe_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 1);
    }

    #[test]
    fn refresh_always_probes_and_writes_mode_0644() {
        let dir = tempfile::tempdir().unwrap();
        let (calls, inv) = (Cell::new(0), machine("nvml"));
        let nvml = "nvml";
        probe_and_store_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv)).unwrap();
        probe_and_store_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv)).unwrap();
        assert_eq!(calls.get(), 2);
        let meta = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "temp files left behind: {names:?}");
    }

    #[test]
    fn missing_state_dir_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("gpupin");
        let (calls, inv) = (Cell::new(0), machine("nvml"));
        let nvml = "nvml";
        probe_and_store_with(nvml, &state, Some("b1"), counting(&calls, &inv)).unwrap();
        load_or_probe_with(nvml, &state, Some("b1"), counting(&calls, &inv)).unwrap();
        assert!(!state.exists());
        assert_eq!(calls.get(), 2);
    }

    #[test]
    fn not_cached_without_uvm_or_boot_id() {
        let dir = tempfile::tempdir().unwrap();
        let mut no_uvm = machine("procfs");
        no_uvm
            .control_nodes
            .retain(|n| !n.path.starts_with("/dev/nvidia-uvm"));
        let calls = Cell::new(0);
        let procfs = "procfs";
        load_or_probe_with(procfs, dir.path(), Some("b1"), counting(&calls, &no_uvm)).unwrap();
        let inv = machine("procfs");
        load_or_probe_with(procfs, dir.path(), None, counting(&calls, &inv)).unwrap();
        assert!(!dir.path().join(FILE_NAME).exists());
    }

    #[test]
    fn write_failure_fails_refresh_only() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the cache file should be makes the rename fail.
        std::fs::create_dir(dir.path().join(FILE_NAME)).unwrap();
        std::fs::write(dir.path().join(FILE_NAME).join("x"), "").unwrap();
        let (calls, inv) = (Cell::new(0), machine("nvml"));
        let nvml = "nvml";
        assert!(load_or_probe_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv)).is_ok());
        let err = probe_and_store_with(nvml, dir.path(), Some("b1"), counting(&calls, &inv));
        let err = err.unwrap_err().to_string();
        assert!(
            err.starts_with("writing inventory cache") && err.contains(FILE_NAME),
            "{err}"
        );
    }

    #[test]
    fn auto_falls_back_to_procfs_then_names_both_failures() {
        let procfs_inv = machine("procfs");
        let nvml_down = || {
            Err(InventoryError::NvmlUnavailable {
                source: nvml_wrapper::error::NvmlError::Uninitialized,
            })
        };
        let found = probe_auto(nvml_down, || Ok(procfs_inv.clone())).unwrap();
        assert_eq!(found.source, "procfs");
        let procfs_down = || {
            Err(InventoryError::NoGpusInProcfs {
                root: "/proc/driver/nvidia/gpus".into(),
            })
        };
        let err = probe_auto(nvml_down, procfs_down).unwrap_err().to_string();
        assert!(
            err.contains("not first initialized") && err.contains("/proc/driver/nvidia/gpus"),
            "{err}"
        );
        assert!(err.contains("sim:nvswitch8"), "{err}");
    }

    /// A GPU in MIG mode whose instances NVML cannot read is not a machine without NVML:
    /// procfs would show that GPU whole where its capabilities tree has no GPU instance,
    /// and it would be handed out whole. (Seen to fail before the fix: auto fell back.)
    #[test]
    fn auto_never_falls_back_when_nvml_cannot_read_mig_instances() {
        let procfs_inv = machine("procfs");
        let unreadable = || {
            Err(InventoryError::MigUnreadable {
                gpu: 0,
                uuid: "GPU-0".into(),
                source: Box::new(InventoryError::Nvml {
                    what: "uuid of MIG device 0:1".into(),
                    source: nvml_wrapper::error::NvmlError::Unknown,
                }),
            })
        };
        let err = probe_auto(unreadable, || Ok(procfs_inv.clone())).unwrap_err();
        assert!(matches!(err, InventoryError::MigUnreadable { .. }), "{err}");
        let through_helper = || {
            Err(InventoryError::NvmlHelperMigUnreadable {
                exe: "/usr/bin/gpupin".into(),
                reason: "GPU 0 (GPU-0) is in MIG mode but its instances cannot be read".into(),
            })
        };
        let err = probe_auto(through_helper, || Ok(procfs_inv.clone())).unwrap_err();
        assert!(
            matches!(err, InventoryError::NvmlHelperMigUnreadable { .. }),
            "{err}"
        );
    }
}
