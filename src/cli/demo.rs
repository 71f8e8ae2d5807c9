//! `gpupin demo`.
use gpupin::config::Config;
use std::path::Path;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Simulated machine to run on
    #[arg(long, default_value = "sim:nvswitch8")]
    pub machine: String,
}

pub fn run(
    _config: &Config,
    _config_path: Option<&Path>,
    _args: &DemoArgs,
) -> anyhow::Result<ExitCode> {
    anyhow::bail!("demo: not yet")
}
