//! `gpupin key HOLDER`: the key that lets a container, or another user's job, take GPUs
//! from inside a holder (`gpupin.within=HOLDER:KEY`, `GPUPIN_WITHIN`, `--key-file`). Root
//! reads it from the ledger; a user asks `gpupin serve`, which gives it for their own
//! holders only.

use super::route::Route;
use gpupin::command::{Client, Config, HolderId, Request};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct KeyArgs {
    /// The holder id, as `gpupin status` shows it
    pub id: String,
}

pub fn run(config: &Config, args: &KeyArgs) -> anyhow::Result<ExitCode> {
    let holder = HolderId::new(&args.id)?;
    if Route::of_this_process() == Route::Daemon {
        // Only root reads the node's secret; the daemon gives a user their own holders' keys.
        let reply = Client::connect(&config.client_socket())?.ask(&Request::Key {
            id: holder.to_string(),
        })?;
        outln!("{}", reply.key.unwrap_or_default())?;
        return Ok(ExitCode::SUCCESS);
    }
    match gpupin::command::open_ledger(config)?.key(&holder)? {
        Some((record, key)) => outln!("{}:{key}", record.id)?,
        None => {
            anyhow::bail!("gpupin key {holder}: no running holder {holder} (see gpupin status)")
        }
    }
    Ok(ExitCode::SUCCESS)
}
