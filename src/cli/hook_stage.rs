//! One hook stage from stdin to exit status, for `gpupin hook STAGE` and for the
//! `gpupin-hook` binary, which includes this file by path (next to `logging.rs`). Only
//! the precreate stage writes to stdout, and only the spec: podman parses it.

use gpupin::engines::hook::{self, Outcome, Stage};
use gpupin::host::inventory::NvmlAccess;
use gpupin::input::config::Config;
use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

/// What the runtime asked for.
pub struct StageArgs<'a> {
    /// `--config`, from the hook's arguments (runtimes give hooks an empty environment).
    pub config: Option<&'a Path>,
    pub stage: &'a str,
    /// `--refuse REASON`: fail with it whatever the state says (see `hook::precreate`).
    pub refuse: Option<&'a str>,
}

/// Runs the stage. `hook_exe` is the `gpupin-hook` binary written into specs edited at
/// precreate; `nvml` says where NVML runs if the stage needs it.
pub fn run(args: &StageArgs, hook_exe: &Path, nvml: NvmlAccess) -> anyhow::Result<ExitCode> {
    let stage: Stage = args.stage.parse()?;
    let mut state = Vec::new();
    std::io::stdin().read_to_end(&mut state)?;
    if let Some(reason) = args.refuse {
        return Err(hook::HookError::Precreate(reason.to_string()).into());
    }
    // The config, and so its `log` key, is loaded only for a container that asks for GPUs.
    let load_config = || -> Result<Config, gpupin::input::config::ConfigError> {
        let mut config = Config::discover(args.config)?;
        config.nvml = nvml;
        super::logging::init_from_config(&config);
        Ok(config)
    };
    match hook::run(stage, &state, hook_exe, load_config)? {
        Outcome::NoRequest | Outcome::Released(None) => {}
        Outcome::Spec { bytes, claim } => {
            if let Some(record) = claim {
                note(format_args!(
                    "gpupin: {} holds {}",
                    record.id,
                    record.gpus.join(",")
                ));
            }
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(&bytes)?;
            stdout.flush()?;
        }
        Outcome::Allocated(record) => {
            note(format_args!(
                "gpupin: {} holds {}",
                record.id,
                record.gpus.join(",")
            ));
        }
        Outcome::Bound(record) => {
            let pid = record.pid.unwrap_or_default();
            note(format_args!("gpupin: {} bound to pid {pid}", record.id));
        }
        Outcome::Released(Some(record)) => {
            note(format_args!(
                "gpupin: {} released {}",
                record.id,
                record.gpus.join(",")
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A line for the runtime's log (stderr); a failed write is not worth failing a hook for.
fn note(args: std::fmt::Arguments) {
    let _ = writeln!(std::io::stderr().lock(), "{args}");
}
