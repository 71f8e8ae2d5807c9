//! `gpupin nvml inventory|live` (hidden): NVML's answers as JSON on stdout, for
//! gpupin-hook and gpupin-runtime, which never load NVML themselves
//! (`gpupin::host::inventory::nvml_helper` says why).

use gpupin::host::inventory::{self, nvml_helper};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct NvmlArgs {
    /// `inventory` (the inventory file format) or `live` (the live file format)
    pub question: String,
}

pub fn run(args: &NvmlArgs) -> anyhow::Result<ExitCode> {
    let answer = match args.question.as_str() {
        nvml_helper::INVENTORY => inventory::to_json(&inventory::nvml_probe_here()?),
        nvml_helper::LIVE => nvml_helper::live_json(&inventory::nvml_live_here()?),
        other => anyhow::bail!(
            "unknown NVML question {other:?}: expected {} or {}",
            nvml_helper::INVENTORY,
            nvml_helper::LIVE
        ),
    };
    outln!("{answer}")?;
    Ok(ExitCode::SUCCESS)
}
