//! The daemon: one thread a connection, and for each job or hold of a process one thread
//! that waits on its pidfd and releases the GPUs the moment it ends.
//!
//! What a caller may do is decided by who the kernel says it is (SO_PEERCRED), never by
//! what it sends: a job is bound only to a child of the caller that runs as the caller's
//! uid; a hold names only a process of the caller's; only root holds until release or for
//! someone else; a user releases only their own holders (`Ledger::release_for`).

use super::peer::{self, Peer, Pinned};
use super::protocol::{self, Reply, Request};
use crate::audit::GpuRef;
use crate::config::Config;
use crate::confine::JobCgroup;
use crate::exec::{self, JobGrant};
use crate::hold::{self, Hold};
use crate::ledger::{HolderId, Ledger, Record};
use crate::message::one_line;
use crate::users;
use std::io::BufReader;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

/// How long a caller has to start its job after the GPUs were granted.
const BIND_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a caller may take to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `listener` until accept fails.
pub fn run(config: Config, listener: UnixListener) -> std::io::Result<()> {
    let config = Arc::new(config);
    watch_existing(&config);
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let config = Arc::clone(&config);
        std::thread::spawn(move || {
            if let Err(err) = serve_one(&config, stream) {
                tracing::info!(error = %err, "connection ended with an error");
            }
        });
    }
    Ok(())
}

/// Jobs and holds with a process that a daemon before this one bound: watched again, so
/// their GPUs go the moment they end.
fn watch_existing(config: &Arc<Config>) {
    let Ok(ledger) = Ledger::read_only_for_config(config) else {
        return;
    };
    for record in ledger.records().unwrap_or_default() {
        let (Some(pid), Ok(holder)) = (record.pid, HolderId::new(&record.id)) else {
            continue;
        };
        if record.owner.is_none() || ledger.is_stale(&record) {
            continue;
        }
        if let Ok(pinned) = Pinned::open(pid) {
            let config = Arc::clone(config);
            std::thread::spawn(move || release_at_exit(&config, holder, pinned, None));
        }
    }
}

fn serve_one(config: &Config, stream: UnixStream) -> std::io::Result<()> {
    let peer = peer::of(&stream)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    let mut input = BufReader::new(stream.try_clone()?);
    let mut output = stream;
    let request = match protocol::receive::<Request>(&mut input) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()),
        Err(e) => {
            let reply = Reply::refused(format!("unreadable request: {}", one_line(&e)));
            return protocol::send(&mut output, &reply);
        }
    };
    tracing::debug!(pid = peer.pid, uid = peer.uid, request = ?request, "request");
    match request {
        Request::Exec { request, name } => {
            exec_job(config, peer, &request, name, &mut input, &mut output)
        }
        Request::Hold {
            id,
            devices,
            by_minor,
            pid,
            until_release,
            user,
            within,
        } => {
            let asked = HoldAsked {
                id,
                devices,
                by_minor,
                pid,
                until_release,
                user,
                within,
            };
            let id = asked.id.clone();
            let outcome = hold_for(config, peer, asked).map(|(record, pinned)| {
                if let (Some(pinned), Ok(holder)) = (pinned, HolderId::new(&record.id)) {
                    let config = config.clone();
                    std::thread::spawn(move || release_at_exit(&config, holder, pinned, None));
                }
                record
            });
            protocol::send(&mut output, &reply_for(config, peer, &id, outcome))
        }
        Request::Release { id } => {
            let outcome = release_for(config, peer, &id);
            protocol::send(&mut output, &reply_for(config, peer, &id, outcome))
        }
        Request::Bind { .. } => {
            protocol::send(&mut output, &Reply::refused("bind without an exec first"))
        }
    }
}

fn granted(record: &Record) -> Reply {
    Reply {
        holder: Some(record.id.clone()),
        gpus: GpuRef::of_record(record),
        ..Reply::default()
    }
}

/// The reply to a hold or release: what it did, or why not (a refusal of who may do what
/// is audited here).
fn reply_for(config: &Config, peer: Peer, id: &str, outcome: Result<Record, Refusal>) -> Reply {
    match outcome {
        Ok(record) => granted(&record),
        Err(Refusal::Denied(e)) => {
            audit_refusal(config, peer, id, &e);
            Reply::refused(e)
        }
        Err(Refusal::Failed(e)) => Reply::refused(e),
    }
}

/// `gpupin exec` of a user: GPUs for the caller, then for the child it names.
fn exec_job(
    config: &Config,
    peer: Peer,
    pairs: &[(String, String)],
    name: Option<String>,
    input: &mut BufReader<UnixStream>,
    output: &mut UnixStream,
) -> std::io::Result<()> {
    let grant = match grant_job(config, peer, pairs, name) {
        Ok(grant) => grant,
        Err(e) => return protocol::send(output, &Reply::refused(e)),
    };
    let reply = Reply {
        env: grant.env.clone(),
        ..granted(&grant.record)
    };
    if protocol::send(output, &reply).is_err() {
        exec::abandon(config, &grant);
        return Ok(());
    }
    input.get_ref().set_read_timeout(Some(BIND_TIMEOUT))?;
    let job = match protocol::receive::<Request>(input) {
        Ok(Some(Request::Bind { pid })) => pid,
        // The caller went away, or never started its job: its GPUs go back now.
        _ => {
            exec::abandon(config, &grant);
            return Ok(());
        }
    };
    match bind_job(config, peer, &grant, job) {
        Ok((pinned, cgroup)) => {
            protocol::send(output, &granted(&grant.record))?;
            release_at_exit(config, grant.holder, pinned, cgroup);
            Ok(())
        }
        Err(e) => {
            audit_refusal(config, peer, grant.holder.as_str(), &e);
            exec::abandon(config, &grant);
            protocol::send(output, &Reply::refused(e))
        }
    }
}

/// An audit line for a request the daemon itself refused (who may do what); refusals of
/// the allocation are written by `grant::allocate`.
fn audit_refusal(config: &Config, peer: Peer, holder: &str, reason: &str) {
    if let Ok(ledger) = Ledger::for_config(config) {
        let user = users::owner_of(peer.uid).ok().map(|o| o.user);
        ledger.audit(&crate::audit::Event {
            uid: Some(peer.uid),
            user,
            pid: Some(peer.pid),
            code: Some("not_yours".into()),
            ..crate::audit::Event::new(crate::audit::EventKind::Refuse, holder).because(reason)
        });
    }
}

fn grant_job(
    config: &Config,
    peer: Peer,
    pairs: &[(String, String)],
    name: Option<String>,
) -> Result<JobGrant, String> {
    let owner = users::owner_of(peer.uid).map_err(|e| one_line(&e))?;
    let (request, holder) =
        exec::job_request(pairs, name.as_deref(), peer.pid).map_err(|e| one_line(&e))?;
    exec::grant(config, holder, &request, owner, peer.pid, "serve").map_err(|e| one_line(&e))
}

/// The child the caller started takes the GPUs, once it is shown to be the caller's.
fn bind_job(
    config: &Config,
    peer: Peer,
    grant: &JobGrant,
    job: i32,
) -> Result<(Pinned, Option<JobCgroup>), String> {
    let pinned = Pinned::open(job).map_err(|e| format!("pid {job}: {}", one_line(&e)))?;
    match pinned.parent_and_owner() {
        Some((parent, uid)) if parent == peer.pid && uid == peer.uid => {}
        _ => {
            return Err(format!(
                "pid {job} is not a process the caller (pid {}) started as uid {}",
                peer.pid, peer.uid
            ));
        }
    }
    let cgroup = exec::start(
        config,
        grant,
        peer.pid,
        job,
        std::os::fd::AsFd::as_fd(&pinned.fd),
    )
    .map_err(|e| one_line(&e))?;
    Ok((pinned, cgroup))
}

/// Blocks until `pinned` ends, then releases `holder` (if it is still that process's).
fn release_at_exit(config: &Config, holder: HolderId, pinned: Pinned, cgroup: Option<JobCgroup>) {
    pinned.wait_exit();
    tracing::debug!(holder = %holder, pid = pinned.pid, "the holder's process ended");
    // A job is over when its cgroup is empty (`leftovers`).
    while exec::finish(config, &holder, pinned.pid, cgroup.as_ref()) == exec::Finished::Leftovers {
        std::thread::sleep(exec::LEFTOVERS_POLL);
    }
}

struct HoldAsked {
    id: String,
    devices: String,
    by_minor: bool,
    pid: Option<i32>,
    until_release: bool,
    user: Option<String>,
    within: Option<String>,
}

fn hold_for(
    config: &Config,
    peer: Peer,
    asked: HoldAsked,
) -> Result<(Record, Option<Pinned>), Refusal> {
    let me = users::owner_of(peer.uid).map_err(|e| Refusal::Failed(one_line(&e)))?;
    let root = peer.uid == 0;
    let owner = match &asked.user {
        Some(name) if root => {
            users::owner_named(name).map_err(|e| Refusal::Failed(one_line(&e)))?
        }
        Some(name) if name != &me.user && name != &peer.uid.to_string() => {
            return Err(Refusal::Denied(format!(
                "only root may hold GPUs for another user ({name})"
            )));
        }
        _ => me,
    };
    if asked.until_release && !root {
        return Err(Refusal::Denied(
            "only root may hold GPUs until released: give --pid with a process of yours".into(),
        ));
    }
    let pinned = match asked.pid {
        Some(pid) => {
            let pinned = Pinned::open(pid)
                .map_err(|e| Refusal::Failed(format!("pid {pid}: {}", one_line(&e))))?;
            match pinned.parent_and_owner() {
                Some((_, uid)) if root || uid == peer.uid => Some(pinned),
                _ => {
                    return Err(Refusal::Denied(format!(
                        "pid {pid} is not a process of uid {}",
                        peer.uid
                    )));
                }
            }
        }
        None => None,
    };
    let hold = Hold {
        id: HolderId::new(&asked.id).map_err(|e| Refusal::Failed(one_line(&e)))?,
        devices: asked.devices,
        by_minor: asked.by_minor,
        pid: asked.pid,
        until_release: asked.until_release,
        limited: !root,
        owner,
        within: asked.within,
    };
    // A refused allocation is audited by grant::allocate.
    let record = hold::hold(config, &hold, "serve").map_err(|e| Refusal::Failed(one_line(&e)))?;
    Ok((record, pinned))
}

/// Why the daemon said no: the caller may not do this (audited here), or it could not be
/// done (a bad value, a refused allocation, which grant audits).
enum Refusal {
    Denied(String),
    Failed(String),
}

fn release_for(config: &Config, peer: Peer, id: &str) -> Result<Record, Refusal> {
    let holder = HolderId::new(id).map_err(|e| Refusal::Failed(one_line(&e)))?;
    let ledger = Ledger::for_config(config).map_err(|e| Refusal::Failed(one_line(&e)))?;
    match ledger.release_for(&holder, peer.uid) {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(Refusal::Failed(format!("{id} holds nothing"))),
        Err(e @ crate::ledger::LedgerError::NotYours { .. }) => Err(Refusal::Denied(one_line(&e))),
        Err(e) => Err(Refusal::Failed(one_line(&e))),
    }
}
