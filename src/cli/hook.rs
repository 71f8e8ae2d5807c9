//! `gpupin hook STAGE`: reads the OCI state on stdin. Nothing goes to stdout: a runtime
//! may read it (podman's precreate stage does).

use gpupin::config::Config;
use gpupin::hook::{self, Outcome, Stage};
use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct HookArgs {
    /// OCI hook stage: prestart, createRuntime or poststop
    pub stage: String,
}

pub fn run(config_flag: Option<&Path>, args: &HookArgs) -> anyhow::Result<ExitCode> {
    let stage: Stage = args.stage.parse()?;
    let mut state = Vec::new();
    std::io::stdin().read_to_end(&mut state)?;
    match hook::run(stage, &state, || Config::discover(config_flag))? {
        Outcome::NoRequest | Outcome::Released(None) => {}
        Outcome::Allocated(record) => {
            eprintln!("gpupin: {} holds {}", record.id, record.gpus.join(","));
        }
        Outcome::Bound(record) => {
            let pid = record.pid.unwrap_or_default();
            eprintln!("gpupin: {} bound to pid {pid}", record.id);
        }
        Outcome::Released(Some(record)) => {
            eprintln!("gpupin: {} released {}", record.id, record.gpus.join(","));
        }
    }
    Ok(ExitCode::SUCCESS)
}
