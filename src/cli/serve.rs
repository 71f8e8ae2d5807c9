//! `gpupin serve`: the root daemon through which users who are not root run jobs on GPUs
//! (`gpupin exec`), hold and release them. Started by systemd's gpupin.socket, or by hand.

use anyhow::Context;
use gpupin::input::config::Config;
use gpupin::jobs::serve::{listen, server};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn run(config: &Config, _args: &ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "gpupin serve must run as root: it allocates for other users and confines their jobs"
    );
    if config.confine != gpupin::host::confine::Confine::Off {
        gpupin::host::confine::require_caps()?;
    }
    // The ledger's directory first: the socket lives in it by default.
    gpupin::state::open_ledger(config)?;
    let listener = match listen::from_systemd() {
        Some(l) => l,
        None => listen::bind(config)
            .with_context(|| format!("listening on {}", config.socket_path().display()))?,
    };
    tracing::info!(socket = ?config.socket_path(), "serving");
    server::run(config.clone(), listener)?;
    Ok(ExitCode::SUCCESS)
}
