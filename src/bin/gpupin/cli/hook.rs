//! `gpupin hook STAGE`: the same hook as the `gpupin-hook` binary (both run
//! `engines::hook::stage`), kept for hooks.d files and specs written by an older gpupin,
//! and for trying a stage by hand.

use gpupin::command::{NvmlAccess, StageArgs, binaries, stage};
use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct HookArgs {
    /// OCI hook stage: precreate (podman), prestart, createRuntime or poststop
    pub stage: String,
    /// Fail with this reason whatever the state says: the hook a failed precreate adds,
    /// since podman does not show a precreate hook's own error
    #[arg(long, value_name = "REASON", hide = true)]
    pub refuse: Option<String>,
}

pub fn run(config_flag: Option<&Path>, args: &HookArgs) -> anyhow::Result<ExitCode> {
    let args = StageArgs {
        config: config_flag,
        stage: &args.stage,
        refuse: args.refuse.as_deref(),
    };
    // Specs edited at precreate get the lean hook binary beside this one.
    let hook_exe = binaries::beside(&std::env::current_exe()?, binaries::HOOK);
    let said = stage::run(
        &args,
        std::io::stdin().lock(),
        &hook_exe,
        NvmlAccess::InProcess,
    )?;
    said.write_to(std::io::stdout().lock(), std::io::stderr().lock())?;
    Ok(ExitCode::SUCCESS)
}
