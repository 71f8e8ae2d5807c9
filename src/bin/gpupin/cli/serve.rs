//! `gpupin serve`: the root daemon through which users who are not root run jobs on GPUs
//! (`gpupin exec`), hold and release them. Started by systemd's gpupin.socket, or by hand.
//! SIGHUP re-reads the config; SIGTERM (or Ctrl-C) stops it and removes the socket it made.

use anyhow::Context;
use gpupin::command::{Config, Reloaded, listen, one_line, serve};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ServeArgs {}

pub fn run(config: &Config, _args: &ServeArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        rustix::process::geteuid().is_root(),
        "gpupin serve must run as root: it allocates for other users and confines their jobs"
    );
    if config.confine != gpupin::command::Confine::Off {
        gpupin::command::require_caps()?;
    }
    // The ledger's directory first: the socket lives in it by default. What follows the
    // ledger (the GPU nodes' ACLs) is brought in line: a crashed daemon or a reboot may
    // have left it behind.
    gpupin::command::open_ledger(config)?.resync()?;
    let socket = config.socket_path();
    let (listener, ours) = match listen::from_systemd() {
        Some(l) => (l, false),
        None => {
            let l = listen::bind(config)
                .with_context(|| format!("listening on {}", socket.display()))?;
            (l, true)
        }
    };
    let from = if ours {
        ""
    } else {
        " (the socket systemd gave it)"
    };
    super::out::note(format_args!(
        "gpupin serve: listening on {}{from}, pid {}",
        socket.display(),
        std::process::id()
    ));
    let file = config
        .path
        .as_ref()
        .map_or("the defaults".to_string(), |p| p.display().to_string());
    let reloaded = move |outcome: &Reloaded| match outcome {
        Reloaded::Applied { kept } if kept.is_empty() => {
            super::out::note(format_args!("gpupin serve: reloaded {file}"));
        }
        Reloaded::Applied { kept } => super::out::note(format_args!(
            "gpupin serve: reloaded {file}; {} changed, which needs a restart (systemctl restart gpupin.service): kept as it was",
            kept.join(", ")
        )),
        Reloaded::Failed(err) => super::out::note(format_args!(
            "gpupin serve: not reloaded, the config it had stays: {}",
            one_line(err)
        )),
    };
    serve::run(config.clone(), listener, reloaded)?;
    // Stopped by SIGTERM or SIGINT. A socket systemd made is systemd's to remove.
    if ours {
        let _ = std::fs::remove_file(&socket);
    }
    super::out::note(format_args!("gpupin serve: stopped"));
    Ok(ExitCode::SUCCESS)
}
