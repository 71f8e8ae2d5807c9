//! `gpupin hook STAGE`: reads the OCI state (precreate: the spec) on stdin. Only the
//! precreate stage writes to stdout, and only the spec: podman parses it.

use super::out::note;
use gpupin::config::Config;
use gpupin::hook::{self, Outcome, Stage};
use std::io::{Read, Write};
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
    let stage: Stage = args.stage.parse()?;
    let mut state = Vec::new();
    std::io::stdin().read_to_end(&mut state)?;
    if let Some(reason) = &args.refuse {
        return Err(hook::HookError::Precreate(reason.clone()).into());
    }
    let exe = std::env::current_exe()?;
    // The config, and so its `log` key, is loaded only for a container that asks for GPUs.
    let load_config = || -> Result<Config, gpupin::config::ConfigError> {
        let config = Config::discover(config_flag)?;
        super::logging::init_from_config(&config);
        Ok(config)
    };
    match hook::run(stage, &state, &exe, load_config)? {
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
