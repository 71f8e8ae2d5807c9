//! `gpupin queue`: the requests waiting for GPUs (`gpupin.wait`, `exec --wait`), in the
//! order they will be served, with whose each is, what it asked for and how long it has
//! waited. A container waiting shows as Created in `docker ps`; here it has its name.

use gpupin::command::{Config, Ledger};
use std::process::ExitCode;
use std::time::SystemTime;

#[derive(clap::Args)]
pub struct QueueArgs {
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

pub fn run(config: &Config, args: &QueueArgs) -> anyhow::Result<ExitCode> {
    let waiting = Ledger::open_read_only(&config.ledger_settings())?.waiting()?;
    let now = SystemTime::now();
    if args.json {
        outln!("{:#}", gpupin::command::queue_json(&waiting, now))?;
    } else if waiting.is_empty() {
        outln!("no request waits for GPUs")?;
    } else {
        out!("{}", gpupin::command::queue_table(&waiting, now, false))?;
    }
    Ok(ExitCode::SUCCESS)
}
