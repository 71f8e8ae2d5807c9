//! `gpupin nvml inventory|live` (hidden): NVML's answers as JSON on stdout, for
//! gpupin-hook and gpupin-runtime, which never load NVML themselves
//! (`gpupin::host::inventory::nvml_helper` says why); and `gpupin nvml memory-limit
//! CGROUP BYTES|clear UUID...`, a driver-enforced memory limit set for a job's cgroup
//! by a process of its own (`nvml_helper::memory_limit`).

use gpupin::command::{inventory, nvml_helper};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct NvmlArgs {
    /// `inventory` (the inventory file format), `live` (the live file format) or
    /// `memory-limit`
    pub question: String,
    /// `memory-limit`'s: the cgroup, the bytes (or `clear`), the GPUs' UUIDs
    pub rest: Vec<String>,
}

pub fn run(args: &NvmlArgs) -> anyhow::Result<ExitCode> {
    let answer = match args.question.as_str() {
        nvml_helper::INVENTORY => match inventory::nvml_probe_here() {
            Ok(inv) => inventory::to_json(&inv),
            // Its own status, so the asking binary does not fall back to procfs, which
            // may show that GPU whole.
            Err(err @ inventory::InventoryError::MigUnreadable { .. }) => {
                super::out::note(format_args!("gpupin: {}", gpupin::command::one_line(&err)));
                return Ok(ExitCode::from(nvml_helper::MIG_UNREADABLE_STATUS));
            }
            Err(err) => return Err(err.into()),
        },
        nvml_helper::LIVE => nvml_helper::live_json(&inventory::nvml_live_here()?),
        nvml_helper::MEMORY_LIMIT => nvml_helper::memory_limit_here(&args.rest)?,
        other => anyhow::bail!(
            "unknown NVML question {other:?}: expected {}, {} or {}",
            nvml_helper::INVENTORY,
            nvml_helper::LIVE,
            nvml_helper::MEMORY_LIMIT
        ),
    };
    outln!("{answer}")?;
    Ok(ExitCode::SUCCESS)
}
