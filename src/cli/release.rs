//! `gpupin release NAME`: release one holder's GPUs, whether or not it still runs, or
//! remove an entry of the ledger's holders/ that is no readable record.

use gpupin::config::Config;
use gpupin::ledger::{Ledger, Released};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// Holder id (container id) as `gpupin status` shows it, or the file name of an
    /// entry in the ledger's holders/ that an error named
    pub id: OsString,
}

pub fn run(config: &Config, args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    match Ledger::for_config(config)?.release_entry(&args.id)? {
        Released::Holder(r) => println!("released {}: {}", r.id, r.gpus.join(",")),
        Released::Entry(path) => println!("removed {path:?}"),
        Released::Nothing => println!("{} held nothing", args.id.to_string_lossy().escape_debug()),
    }
    Ok(ExitCode::SUCCESS)
}
