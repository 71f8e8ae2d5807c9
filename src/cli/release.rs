//! `gpupin release ID`: release one holder's GPUs, whether or not it still runs.

use gpupin::config::Config;
use gpupin::ledger::{HolderId, Ledger};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// Holder id (container id) as `gpupin status` shows it
    pub id: String,
}

pub fn run(config: &Config, args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    let id = HolderId::new(&args.id)?;
    match Ledger::for_config(config)?.release(&id)? {
        Some(r) => println!("released {}: {}", r.id, r.gpus.join(",")),
        None => println!("{id} held nothing"),
    }
    Ok(ExitCode::SUCCESS)
}
