//! `exec`: a user's `gpupin exec`. GPUs for the caller first (waiting in the queue while
//! the caller listens), then, on the same connection, `bind`: the child the caller
//! started and holds at its gate takes them, is confined and watched.

use super::super::authorize;
use super::super::connections::{Deadline, Shared, still_open};
use super::super::error::ServeError;
use super::super::peer::{Peer, Pinned};
use super::super::protocol::{self, Reply, Request};
use super::granted;
use crate::host::confine::JobCgroup;
use crate::host::users;
use crate::input::config::Config;
use crate::jobs::exec::{self, JobGrant};
use crate::state::ledger::StillWanted;
use std::io::BufReader;
use std::sync::Arc;
use std::time::Duration;

/// How long a caller has to start its job after the GPUs were granted.
const BIND_TIMEOUT: Duration = Duration::from_secs(60);

/// `gpupin exec` of a user: GPUs for the caller, then for the child it names.
pub(in crate::jobs::serve) fn answer(
    shared: &Shared,
    peer: Peer,
    pairs: &[(String, String)],
    name: Option<String>,
    input: &mut BufReader<Deadline>,
) -> std::io::Result<()> {
    let config = shared.config();
    let config = &*config;
    let stream = Arc::clone(&input.get_ref().stream);
    let mut output = &*stream;
    // Before anything is held: a job the watcher could not take would have to go again.
    if let Err(e) = shared.watcher.admits(peer.uid, "", None) {
        return protocol::send(&mut output, &ServeError::from(e).reply(config, peer, ""));
    }
    // A wait in the queue ends when the caller hangs up or its process ends (a child
    // may have inherited the socket), not only when the daemon dies.
    let caller = Arc::clone(&stream);
    let started = crate::base::procinfo::start_time(peer.pid);
    let still_wanted = StillWanted(Arc::new(move || {
        still_open(&caller) && started.is_some_and(|s| crate::base::procinfo::is_alive(peer.pid, s))
    }));
    let grant = match grant_job(config, peer, pairs, name, still_wanted) {
        Ok(grant) => grant,
        Err(e) => return protocol::send(&mut output, &e.reply(config, peer, "")),
    };
    let reply = Reply {
        env: grant.env.clone(),
        ..granted(&grant.record)
    };
    if protocol::send(&mut output, &reply).is_err() {
        exec::abandon(config, &grant);
        return Ok(());
    }
    input.get_mut().restart(BIND_TIMEOUT);
    let job = match protocol::receive_request(input) {
        Ok(Some(Request::Bind { pid })) => pid,
        // The caller went away, or never started its job: its GPUs go back now.
        _ => {
            exec::abandon(config, &grant);
            return Ok(());
        }
    };
    let bound = bind_job(config, peer, &grant, job).and_then(|(pinned, cgroup)| {
        shared
            .watcher
            .watch(peer.uid, grant.holder.clone(), pinned, cgroup, true)
            // Not started yet (it waits at its gate): it goes with its GPUs below.
            .map_err(ServeError::from)
    });
    match bound {
        Ok(()) => {
            let _ = protocol::send(&mut output, &granted(&grant.record));
            Ok(())
        }
        Err(e) => {
            // Whatever kept it from its GPUs, a job not bound is a refusal the audit log
            // keeps.
            let reply =
                ServeError::NotBound(Box::new(e)).reply(config, peer, grant.holder.as_str());
            exec::abandon(config, &grant);
            protocol::send(&mut output, &reply)
        }
    }
}

fn grant_job(
    config: &Config,
    peer: Peer,
    pairs: &[(String, String)],
    name: Option<String>,
    still_wanted: StillWanted,
) -> Result<JobGrant, ServeError> {
    let owner = users::owner_of(peer.uid)?;
    let (request, holder) = exec::job_request(pairs, name.as_deref(), peer.pid)?;
    Ok(exec::grant_while(
        config,
        holder,
        &request,
        owner,
        peer.pid,
        "serve",
        Some(still_wanted),
    )?)
}

/// The child the caller started takes the GPUs, once it is shown to be the caller's.
fn bind_job(
    config: &Config,
    peer: Peer,
    grant: &JobGrant,
    job: i32,
) -> Result<(Pinned, Option<JobCgroup>), ServeError> {
    let pinned = Pinned::open(job).map_err(|source| ServeError::Pin { pid: job, source })?;
    if !authorize::started_by(peer, pinned.parent_and_owner()) {
        return Err(ServeError::NotStartedByCaller {
            pid: job,
            caller: peer.pid,
            uid: peer.uid,
        });
    }
    let cgroup = exec::start(
        config,
        grant,
        peer.pid,
        job,
        std::os::fd::AsFd::as_fd(&pinned.fd),
    )?;
    Ok((pinned, cgroup))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{caller, daemon, nobodys_process};
    use crate::model::holder::Owner;

    #[test]
    fn a_process_the_caller_did_not_start_as_itself_takes_no_gpus() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: starting a process as nobody needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let config = &*config;
        let me = caller(0);
        let pairs = [("gpupin.count".to_string(), "1".to_string())];
        let (request, holder) = exec::job_request(&pairs, Some("j1"), me.pid).unwrap();
        let root = Owner {
            uid: 0,
            user: "root".into(),
            groups: vec![],
        };
        let grant =
            exec::grant_while(config, holder, &request, root, me.pid, "serve", None).unwrap();
        // The caller's own child, but running as nobody: not a job the caller started.
        let mut other = nobodys_process();
        let pid = other.id() as i32;
        let outcome = bind_job(config, me, &grant, pid);
        other.kill().unwrap();
        other.wait().unwrap();
        let Err(err) = outcome else {
            panic!("nobody's process took the caller's GPUs");
        };
        assert_eq!(
            err.to_string(),
            format!(
                "pid {pid} is not a process the caller (pid {}) started as uid 0",
                me.pid
            )
        );
        let ledger = crate::state::open_ledger(config).unwrap();
        let records = ledger.records().unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(
            records[0].pid,
            Some(me.pid),
            "the GPUs stay with the caller"
        );
    }
}
