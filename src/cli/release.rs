//! `gpupin release NAME`: release one holder's GPUs, whether or not it still runs, or
//! remove an entry of the ledger's holders/ that is no readable record. A user who is not
//! root releases their own holders through `gpupin serve`.

use gpupin::input::config::Config;
use gpupin::jobs::serve::{Client, Request};
use gpupin::state::ledger::Released;
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// Holder id (container id) as `gpupin status` shows it, or the file name of an
    /// entry in the ledger's holders/ that an error named
    pub id: OsString,
}

pub fn run(config: &Config, args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    if !rustix::process::geteuid().is_root() {
        // Only root writes the ledger; a user releases their own holders through the daemon.
        let id = args.id.to_string_lossy().into_owned();
        let reply = Client::connect(&config.socket_path())?.ask(&Request::Release { id })?;
        let gpus: Vec<&str> = reply.gpus.iter().map(|g| g.uuid.as_str()).collect();
        outln!(
            "released {}: {}",
            reply.holder.unwrap_or_default(),
            gpus.join(",")
        )?;
        return Ok(ExitCode::SUCCESS);
    }
    match gpupin::state::open_ledger(config)?.release_entry(&args.id)? {
        Released::Holder(r) => outln!("released {}: {}", r.id, r.gpus.join(","))?,
        Released::Entry(path) => outln!("removed {path:?}")?,
        Released::Nothing => outln!("{} held nothing", args.id.to_string_lossy().escape_debug())?,
    }
    Ok(ExitCode::SUCCESS)
}
