//! `gpupin evict HOLDER`: stop a holder that still runs (through its engine, or SIGTERM
//! then SIGKILL to its process) and release its GPUs once it is gone. Root only.

use gpupin::input::config::Config;
use gpupin::jobs::evict::{self, Stopped};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct EvictArgs {
    /// The holder as `gpupin status` shows it: a container's name, or the holder's id
    /// (whole, or its first 12 characters)
    #[arg(value_name = "HOLDER")]
    pub holder: String,
    /// How long it may take to stop before it is killed (`docker stop -t`)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::flag::grace())]
    pub grace: Duration,
}

pub fn run(config: &Config, args: &EvictArgs) -> anyhow::Result<ExitCode> {
    if !rustix::process::geteuid().is_root() {
        anyhow::bail!(
            "gpupin evict stops other people's work: run it as root (sudo gpupin evict {}); to end your own holder, stop it or use gpupin release",
            args.holder
        );
    }
    let by = super::release::operator();
    let eviction = evict::evict(config, &args.holder, &by, args.grace)?;
    let record = &eviction.record;
    let how = match &eviction.stopped {
        Stopped::WasNotRunning => "it was not running".to_string(),
        Stopped::ByEngine(command) => format!("stopped with {command}"),
        Stopped::BySignal { killed: false } => "stopped with SIGTERM".to_string(),
        Stopped::BySignal { killed: true } => {
            format!(
                "killed: still running {}s after SIGTERM",
                args.grace.as_secs()
            )
        }
    };
    outln!(
        "evicted {} ({how}); released {}",
        record.display_name(),
        record.gpus.join(",")
    )?;
    Ok(ExitCode::SUCCESS)
}
