//! A shared container's memory reservation as a limit the driver enforces on the
//! container's cgroup (`host::inventory::nvml_limits`), set once the container's process
//! holds its GPUs, where the machine is NVML's. The hook never loads NVML: the `gpupin`
//! beside it sets the limit in a process of its own (`admission::memory_limit`). The
//! record says whether it is enforced or accounting only. The limit ends with the
//! container's cgroup (the driver drops it when the cgroup goes: runc removes the cgroup
//! before poststop runs).

use super::HookError;
use crate::admission::memory_limit;
use crate::base::message::one_line;
use crate::input::config::Config;
use crate::model::holder::HolderId;
use crate::state::ledger::{Ledger, MemoryLimit, Record};

/// Sets the limit for `record`, bound to process `pid`, where it applies. On failure the
/// container's GPUs are released and the hook fails: the container must not run with a
/// reservation the driver could enforce and does not.
pub(super) fn memory(
    config: &Config,
    ledger: &Ledger,
    record: &Record,
    pid: i32,
) -> Result<(), HookError> {
    let Some(bytes) = memory_limit::reservation(record) else {
        return Ok(());
    };
    let set = || -> Result<Option<MemoryLimit>, String> {
        let inventory = config.load_inventory().map_err(|e| one_line(&e))?;
        // A simulated or file inventory has no driver to enforce it.
        if !crate::host::inventory::from_nvml(&inventory) {
            return Ok(None);
        }
        let cgroup = crate::host::confine::cgroup_dir_of(pid).map_err(|e| one_line(&e))?;
        memory_limit::set(&config.nvml, record, bytes, &cgroup)
            .map(Some)
            .map_err(|e| one_line(&e))
    };
    let holder = HolderId::new(&record.id).map_err(|_| HookError::MemoryLimit {
        id: record.id.clone(),
        reason: "not a holder id".into(),
    })?;
    match set() {
        Ok(None) => Ok(()),
        Ok(Some(limit)) => {
            tracing::debug!(container = %holder, limit = ?limit, bytes, "memory reservation");
            Ok(ledger.record_memory_limit(&holder, pid, limit)?)
        }
        Err(reason) => {
            let _ = ledger.release(&holder);
            Err(HookError::MemoryLimit {
                id: record.shown_name().to_string(),
                reason,
            })
        }
    }
}
