//! `gpupin release HOLDER`: give back one holder's GPUs, named as `gpupin status` shows
//! it (a container's name, the holder's id or the first 12 characters of it), or remove
//! an entry of the ledger's holders/ that is no readable record. A holder that still runs
//! is never released while it can use its GPUs: root's --force stops it first, as
//! `gpupin evict` does, and releases it once it is gone; a user's --force is refused (a
//! user ends their own with `gpupin evict`). A user who is not root releases their own
//! holders through `gpupin serve`.

use super::route::Route;
use gpupin::command::{
    Client, Config, EvictError, Evictor, LedgerError, Match, Released, Releaser, Request, evict,
};
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ReleaseArgs {
    /// The holder as `gpupin status` shows it: a container's name, or the holder's id
    /// (whole, or its first 12 characters); or the file name of an entry in the ledger's
    /// holders/ that an error named
    #[arg(value_name = "HOLDER")]
    pub id: OsString,
    /// Root only, for a holder that still runs: stop it first (as `gpupin evict` does:
    /// its engine, or SIGTERM then SIGKILL after 10s) and release its GPUs once it is gone
    #[arg(long)]
    pub force: bool,
    /// HOLDER is a whole holder id, never a name or a prefix (for scripts: the Slurm
    /// epilog's slurm-$SLURM_JOB_ID)
    #[arg(long)]
    pub exact: bool,
    /// A holder that is not there is no error: print so and exit 0 (for scripts)
    #[arg(long)]
    pub ignore_missing: bool,
}

pub fn run(config: &Config, args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    if Route::of_this_process() == Route::Daemon {
        // Only root writes the ledger; a user releases their own holders through the daemon.
        let id = args.id.to_string_lossy().into_owned();
        let request = Request::Release {
            id: id.clone(),
            force: args.force,
            exact: args.exact,
            ignore_missing: args.ignore_missing,
        };
        let reply = Client::connect(&config.client_socket())?.ask(&request)?;
        if reply.holder.is_none() {
            outln!("no holder {id:?}: nothing to release")?;
            return Ok(ExitCode::SUCCESS);
        }
        return said_by_daemon(&reply, "released {}: {}");
    }
    if args.force {
        return forced(config, args);
    }
    as_root(config, args, false)
}

/// Root's release through the ledger; `force`: only a claim no process has bound yet may
/// still be starting (a holder with a process is stopped first, by `forced`).
fn as_root(config: &Config, args: &ReleaseArgs, force: bool) -> anyhow::Result<ExitCode> {
    let by = Releaser {
        uid: 0,
        user: operator(),
        force,
        how: if args.exact {
            Match::Exact
        } else {
            Match::Shown
        },
        command: "release",
    };
    let released = match gpupin::command::open_ledger(config)?.release_named(&args.id, &by) {
        Ok(released) => released,
        Err(LedgerError::NoSuchHolder { given }) if args.ignore_missing => {
            outln!("no holder {given:?}: nothing to release")?;
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    match released {
        Released::Holder(r) => outln!("released {}: {}", r.display_name(), r.gpus.join(","))?,
        Released::Entry(path) => outln!("removed {path:?}")?,
        Released::Nothing => anyhow::bail!("{} holds nothing", args.id.to_string_lossy()),
        Released::Request(w) => outln!("cancelled {}: it no longer waits for GPUs", w.holder)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Root's `release --force`: the holder is stopped first and released once it is gone
/// (`jobs::evict`), so that its GPUs never go to the next request while it can use them;
/// a name no holder has may be an entry of holders/ that is no record.
fn forced(config: &Config, args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    let given = args.id.to_string_lossy();
    let by = Evictor {
        uid: 0,
        user: operator(),
        reason: None,
        how: if args.exact {
            Match::Exact
        } else {
            Match::Shown
        },
    };
    let grace = Duration::from_secs(10);
    match evict::evict(config, &given, &by, grace) {
        Ok(eviction) => {
            outln!("{}", eviction.summary(grace))?;
            Ok(ExitCode::SUCCESS)
        }
        // A queued request, an entry that is no record, or a claim no process has
        // bound yet: nothing to stop.
        Err(
            EvictError::Ledger(LedgerError::NoSuchHolder { .. }) | EvictError::NoProcess { .. },
        ) => as_root(config, args, true),
        Err(e) => Err(e.into()),
    }
}

/// Who releases as root, for the audit line: `root`, or `root (sudo by alice)`.
pub fn operator() -> String {
    match std::env::var("SUDO_USER") {
        Ok(user) if !user.is_empty() && user != "root" => format!("root (sudo by {user})"),
        _ => "root".into(),
    }
}

/// What `gpupin serve` did for a user's `release` or `evict`, as one line: a queued
/// request cancelled, else the holder and the GPUs it gave back (`done` names both, in
/// that order: `released {}: {}`).
pub fn said_by_daemon(reply: &gpupin::command::Reply, done: &str) -> anyhow::Result<ExitCode> {
    let holder = reply.holder.clone().unwrap_or_default();
    if reply.cancelled {
        outln!("cancelled {holder}: it no longer waits for GPUs")?;
        return Ok(ExitCode::SUCCESS);
    }
    let gpus: Vec<&str> = reply.gpus.iter().map(|g| g.uuid.as_str()).collect();
    outln!(
        "{}",
        done.replacen("{}", &holder, 1)
            .replacen("{}", &gpus.join(","), 1)
    )?;
    Ok(ExitCode::SUCCESS)
}
