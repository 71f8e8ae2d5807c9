//! A shared holder's memory reservation as the limit the driver enforces on the holder's
//! own cgroup (`host::inventory::nvml_limits`), for the two ways a holder gets a cgroup of
//! its own: an exec'd job (`jobs::exec`) and a container (`engines::hook`). The limit is
//! set by `gpupin nvml memory-limit`, a process of its own (`nvml_helper::memory_limit`):
//! the hook never loads NVML, and a job's waiter must not share its signals with NVML's
//! threads. The caller finds the cgroup, and writes down what came of it
//! (`Ledger::record_memory_limit`).

use crate::host::inventory::nvml_limits::Enforced;
use crate::host::inventory::{InventoryError, NvmlAccess, nvml_helper};
use crate::input::request::Share;
use crate::state::ledger::{MemoryLimit, Record};
use std::path::{Path, PathBuf};

/// The bytes `record` reserves on each of its GPUs, where it is a shared holder with a
/// reservation: what a limit would be. `None`: nothing to limit.
pub(crate) fn reservation(record: &Record) -> Option<u64> {
    match (record.request.share, record.request.reserve) {
        (Share::Shared, Some(bytes)) => Some(bytes),
        _ => None,
    }
}

/// Limits what `cgroup` may allocate on each of `record`'s whole GPUs to `bytes`:
/// `Enforced`, or `AccountingOnly` where the driver has no per-cgroup limits.
pub(crate) fn set(
    nvml: &NvmlAccess,
    record: &Record,
    bytes: u64,
    cgroup: &Path,
) -> Result<MemoryLimit, InventoryError> {
    let enforced =
        nvml_helper::memory_limit(&helper(nvml)?, &whole_gpus(record), cgroup, Some(bytes))?;
    Ok(match enforced {
        Enforced::Yes => MemoryLimit::Enforced,
        Enforced::Unsupported => MemoryLimit::AccountingOnly,
    })
}

/// Clears the limit on `cgroup` where `record` says one was set (before the cgroup goes;
/// the driver drops it with the cgroup too).
pub(crate) fn clear(
    nvml: &NvmlAccess,
    record: &Record,
    cgroup: &Path,
) -> Result<(), InventoryError> {
    if record.memory_limit != Some(MemoryLimit::Enforced) {
        return Ok(());
    }
    nvml_helper::memory_limit(&helper(nvml)?, &whole_gpus(record), cgroup, None).map(|_| ())
}

/// The `gpupin` that answers `gpupin nvml`: the one beside a static binary, else this one
/// (`gpupin exec`, `gpupin serve`, `gpupin hook`).
fn helper(nvml: &NvmlAccess) -> Result<PathBuf, InventoryError> {
    match nvml {
        NvmlAccess::Helper(exe) => Ok(exe.clone()),
        NvmlAccess::InProcess => {
            std::env::current_exe().map_err(|source| InventoryError::NvmlHelperStart {
                exe: PathBuf::from("gpupin"),
                source,
            })
        }
    }
}

/// The UUIDs of a record's whole GPUs: the driver's limits take no MIG handle.
fn whole_gpus(record: &Record) -> Vec<&str> {
    record
        .gpus
        .iter()
        .map(String::as_str)
        .filter(|u| !u.starts_with("MIG-"))
        .collect()
}
