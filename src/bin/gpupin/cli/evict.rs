//! `gpupin evict HOLDER`: stop a holder that still runs (through its engine, or SIGTERM
//! then SIGKILL to its process and its job cgroup) and release its GPUs once it is gone.
//! Root evicts anyone's; a user their own, through `gpupin serve`, which does the
//! stopping as root.

use super::route::Route;
use gpupin::command::{Client, Config, EvictError, Evictor, LedgerError, Match, Request, evict};
use std::process::ExitCode;
use std::time::Duration;

#[derive(clap::Args)]
pub struct EvictArgs {
    /// The holder as `gpupin status` shows it: a container's name, or the holder's id
    /// (whole, or its first 12 characters)
    #[arg(value_name = "HOLDER")]
    pub holder: String,
    /// How long it may take to stop before it is killed (`docker stop -t`; a user's at
    /// most 60s)
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::flag::grace())]
    pub grace: Duration,
    /// Why, in one line (at most 200 characters): the audit log's evict line and the
    /// evicted job's stderr give it
    #[arg(long, value_name = "TEXT")]
    pub reason: Option<String>,
}

pub fn run(config: &Config, args: &EvictArgs) -> anyhow::Result<ExitCode> {
    if let Some(reason) = &args.reason {
        // Refused here too, before anything is stopped or sent.
        evict::check_reason(reason)?;
    }
    if Route::of_this_process() == Route::Daemon {
        let request = Request::Evict {
            id: args.holder.clone(),
            reason: args.reason.clone(),
            grace_secs: Some(args.grace.as_secs()),
        };
        let reply = Client::connect(&config.client_socket())?.ask(&request)?;
        // What the daemon did to stop it, as root's evict says it.
        let done = match &reply.stopped {
            Some(how) => format!("evicted {{}} ({how}); released {{}}"),
            None => "evicted {}; released {}".to_string(),
        };
        return super::release::said_by_daemon(&reply, &done);
    }
    let by = Evictor {
        uid: 0,
        user: super::release::operator(),
        reason: args.reason.clone(),
        how: Match::Shown,
    };
    let eviction = match evict::evict(config, &args.holder, &by, args.grace) {
        Ok(eviction) => eviction,
        Err(EvictError::Ledger(LedgerError::NoSuchHolder { .. })) => {
            let waiting = evict::cancel_queued(config, &args.holder, &by)?;
            outln!("cancelled {}: it no longer waits for GPUs", waiting.holder)?;
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e.into()),
    };
    outln!("{}", eviction.summary(args.grace))?;
    Ok(ExitCode::SUCCESS)
}
