//! The daemon: a bounded number of connections, each served by a thread of its own for
//! one request (an exec waiting in the queue keeps its thread while it waits), and one
//! watcher thread for every job and hold of a process (`watch`), which releases the GPUs
//! the moment the process ends.
//!
//! What a caller may do is decided by who the kernel says it is (SO_PEERCRED), never by
//! what it sends: a job is bound only to a child of the caller that runs as the caller's
//! uid; a hold names only a process of the caller's; only root holds until release or for
//! someone else; a user releases only their own holders (`Ledger::release_for`).
//!
//! No caller can make it hang or run out of fds or threads: connections are bounded per
//! user and in all (`[serve]`), a request must arrive whole within `request_timeout`
//! (a deadline for the request, not for each read), a thread that cannot be started
//! refuses its connection, and watched holders are bounded per user.

use super::authorize::{self, HoldFor};
use super::peer::{self, Peer, Pinned};
use super::protocol::{self, Reply, Request};
use super::watch::Watcher;
use crate::base::message::one_line;
use crate::host::confine::JobCgroup;
use crate::host::users;
use crate::input::config::ServeSettings;
use crate::input::config::{Config, ConfigError};
use crate::input::request::Origin;
use crate::jobs::exec::{self, JobGrant};
use crate::jobs::hold::{self, Hold};
use crate::model::holder::HolderId;
use crate::state::audit::GpuRef;
use crate::state::ledger::lookup::Match;
use crate::state::ledger::{Ledger, LedgerError, Record, Released, Releaser, StillWanted};
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// How long a caller has to start its job after the GPUs were granted.
const BIND_TIMEOUT: Duration = Duration::from_secs(60);

/// What the daemon answers the `status` op with: `gpupin status --json`'s JSON, which the
/// report layer (above this one) makes, so the command that starts the daemon gives it.
pub type StatusReader = fn(&Config) -> Result<serde_json::Value, String>;

/// What every connection's thread shares.
struct Shared {
    /// Replaced whole on SIGHUP; a connection keeps the one it started with.
    config: RwLock<Arc<Config>>,
    watcher: Watcher,
    open: Mutex<Open>,
    status: StatusReader,
}

/// Without a status reader: the op is refused in one line.
fn no_status(_: &Config) -> Result<serde_json::Value, String> {
    Err("this gpupin serve gives no status: run gpupin status --json".into())
}

/// Open connections: in all, and by uid.
#[derive(Default)]
struct Open {
    total: u32,
    by_uid: HashMap<u32, u32>,
}

/// One admitted connection: counted until dropped.
struct Slot {
    shared: Arc<Shared>,
    uid: u32,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.shared.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_uid.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_uid.remove(&self.uid);
            }
        }
    }
}

impl Shared {
    fn new(config: Config, watcher: Watcher) -> Shared {
        Shared {
            config: RwLock::new(Arc::new(config)),
            watcher,
            open: Mutex::new(Open::default()),
            status: no_status,
        }
    }

    /// The config as it is now.
    fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// A slot for a connection of `uid`, or the one-line reason there is none. Root is
    /// not bounded: its connections are the Slurm prolog's and the admins'.
    fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, String> {
        let limits = self.config().serve;
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let mine = open.by_uid.get(&uid).copied().unwrap_or(0);
        if uid != 0 {
            if open.total >= limits.max_connections {
                return Err(format!(
                    "gpupin serve has {} connections open, its limit (serve.max_connections): try again shortly",
                    open.total
                ));
            }
            if mine >= limits.max_connections_per_user {
                return Err(format!(
                    "uid {uid} has {mine} connections open to gpupin serve, the limit (serve.max_connections_per_user): close some first"
                ));
            }
        }
        open.total += 1;
        open.by_uid.insert(uid, mine + 1);
        Ok(Slot {
            shared: Arc::clone(self),
            uid,
        })
    }
}

/// What a SIGHUP did.
#[derive(Debug)]
pub enum Reloaded {
    /// The file read; `kept` names the keys that need a restart and were left as they were.
    Applied { kept: Vec<&'static str> },
    /// The file did not read: the daemon goes on with the config it had.
    Failed(ConfigError),
}

/// Serves `listener` until SIGTERM or SIGINT (then returns, so that the caller removes a
/// socket it made) or until accept fails for good. On SIGHUP the config is read again
/// from its file; `reloaded` is told how that went. `status` answers the `status` op.
pub fn run(
    config: Config,
    listener: UnixListener,
    reloaded: impl Fn(&Reloaded) + Send + 'static,
    status: StatusReader,
) -> std::io::Result<()> {
    super::signals::block()?;
    let settings: ServeSettings = config.serve;
    let config_arc = Arc::new(config.clone());
    let watcher = Watcher::start(Arc::clone(&config_arc), settings.max_watched_per_user)?;
    watch_existing(&config, &watcher);
    let shared = Arc::new(Shared {
        status,
        ..Shared::new(config, watcher)
    });
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let shared = Arc::clone(&shared);
        let stopping = Arc::clone(&stopping);
        let listening = listener.as_raw_fd();
        std::thread::Builder::new()
            .name("gpupin-signals".into())
            .spawn(move || {
                while let Ok(super::signals::Asked::Reload) = super::signals::wait() {
                    reloaded(&reload(&shared));
                }
                stopping.store(true, Ordering::SeqCst);
                // Wakes the accept below: a shut-down listening socket fails it.
                // SAFETY: the listener outlives this thread's use of its fd (run returns
                // only after accept fails, and the process ends after that).
                let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(listening) };
                let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Both);
            })?;
    }
    {
        let shared = Arc::clone(&shared);
        let stopping = Arc::clone(&stopping);
        std::thread::Builder::new()
            .name("gpupin-idle".into())
            .spawn(move || super::idle::looks(|| shared.config(), &stopping))?;
    }
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return Ok(());
        }
        let stream = match stream {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Ok(peer) = peer::of(&stream) else {
            continue;
        };
        let slot = match shared.admit(peer.uid) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::info!(uid = peer.uid, pid = peer.pid, reason = %why, "connection refused");
                refuse(stream, &why);
                continue;
            }
        };
        // A second handle to answer through if no thread can be started for it.
        let spare = stream.try_clone();
        let started = std::thread::Builder::new()
            .name("gpupin-conn".into())
            .spawn(move || {
                let shared = Arc::clone(&slot.shared);
                if let Err(err) = serve_one(&shared, peer, stream) {
                    tracing::info!(error = %err, "connection ended with an error");
                }
                drop(slot);
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, uid = peer.uid, "no thread for a connection: refused");
            if let Ok(spare) = spare {
                refuse(
                    spare,
                    &format!(
                        "gpupin serve cannot take this request now ({}): try again shortly",
                        one_line(&e)
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Reads the config file again and puts it in place for the connections that come next.
/// Keys the daemon cannot change while it runs (where the ledger and the socket are, the
/// socket's group) keep their old values, and are named.
fn reload(shared: &Shared) -> Reloaded {
    let old = shared.config();
    let Some(path) = old.path.clone() else {
        return Reloaded::Applied { kept: Vec::new() };
    };
    let mut new = match Config::load(&path) {
        Ok(new) => new,
        Err(error) => return Reloaded::Failed(error),
    };
    new.nvml = old.nvml.clone();
    let mut kept = Vec::new();
    if new.state_dir != old.state_dir {
        new.state_dir = old.state_dir.clone();
        kept.push("state_dir");
    }
    if new.socket != old.socket {
        new.socket = old.socket.clone();
        kept.push("socket");
    }
    if new.socket_group != old.socket_group {
        new.socket_group = old.socket_group.clone();
        kept.push("socket_group");
    }
    *shared.config.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new);
    Reloaded::Applied { kept }
}

/// Answers a connection that is not served with `why`, without waiting on the caller.
fn refuse(stream: UnixStream, why: &str) {
    let _ = stream.set_nonblocking(true);
    let mut stream = stream;
    let _ = protocol::send(&mut stream, &Reply::refused(why));
}

/// Jobs and holds with a process that a daemon before this one bound: watched again, so
/// their GPUs go the moment they end.
fn watch_existing(config: &Config, watcher: &Watcher) {
    let Ok(ledger) = Ledger::open_read_only(&config.ledger_settings()) else {
        return;
    };
    for record in ledger.records().unwrap_or_default() {
        let (Some(pid), Ok(holder), Some(owner)) =
            (record.pid, HolderId::new(&record.id), record.owner.as_ref())
        else {
            continue;
        };
        if ledger.is_stale(&record) {
            continue;
        }
        // Pinned first, then compared with the record's start time: the pidfd is then the
        // job's own process, not one that took its pid since.
        let pinned = Pinned::open(pid).ok().filter(|_| {
            record
                .start_time
                .is_some_and(|started| crate::base::procinfo::is_alive(pid, started))
        });
        match pinned {
            Some(pinned) => {
                let _ = watcher.watch(owner.uid, holder, pinned, None, false);
            }
            // Its main process ended while no daemon watched, and the record is not stale:
            // its job's cgroup still has processes.
            None if !record.cgroups.is_empty() => watcher.check_later(owner.uid, holder, pid),
            None => {}
        }
    }
}

/// Reads a connection until a deadline: before each read the socket's timeout is set to
/// what is left, so that a caller sending a byte now and then still runs out of time.
struct Deadline {
    stream: Arc<UnixStream>,
    until: Instant,
    /// The whole time allowed, for the message.
    allowed: Duration,
}

impl Deadline {
    fn new(stream: Arc<UnixStream>, allowed: Duration) -> Deadline {
        Deadline {
            stream,
            until: Instant::now() + allowed,
            allowed,
        }
    }

    fn restart(&mut self, allowed: Duration) {
        self.until = Instant::now() + allowed;
        self.allowed = allowed;
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let timed_out = || {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the request did not arrive whole within {}",
                    humantime::format_duration(self.allowed)
                ),
            )
        };
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        self.stream.set_read_timeout(Some(left))?;
        match (&*self.stream).read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Err(timed_out())
            }
            other => other,
        }
    }
}

/// Whether the caller at the other end of `stream` still listens: no hangup yet.
fn still_open(stream: &UnixStream) -> bool {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(stream, PollFlags::RDHUP)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    match rustix::event::poll(&mut fds, Some(&zero)) {
        Ok(0) => true,
        Ok(_) => !fds[0]
            .revents()
            .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
        Err(_) => true,
    }
}

fn serve_one(shared: &Shared, peer: Peer, stream: UnixStream) -> std::io::Result<()> {
    let config = shared.config();
    let config = &*config;
    let stream = Arc::new(stream);
    // Answers must not block the thread on a caller that reads nothing.
    stream.set_write_timeout(Some(config.serve.request_timeout))?;
    let mut input = BufReader::new(Deadline::new(
        Arc::clone(&stream),
        config.serve.request_timeout,
    ));
    let mut output = &*stream;
    let request = match protocol::receive_request(&mut input) {
        Ok(Some(r)) => r,
        Ok(None) => return Ok(()),
        Err(why) => return protocol::send(&mut output, &Reply::refused(why)),
    };
    tracing::debug!(pid = peer.pid, uid = peer.uid, request = ?request.without_keys(), "request");
    match request {
        Request::Exec { request, name } => exec_job(shared, peer, &request, name, &mut input),
        Request::Hold {
            id,
            devices,
            by_minor,
            pid,
            until_release,
            user,
            within,
            count,
            mig,
            reason,
            for_secs,
            request,
        } => {
            let asked = HoldAsked {
                id,
                devices,
                by_minor,
                pid,
                until_release,
                user,
                within,
                count,
                mig,
                reason,
                for_secs,
                request,
            };
            let id = asked.id.clone();
            let outcome = hold_for(shared, peer, asked, Some(&stream));
            let env = outcome
                .as_ref()
                .map(|r| hold_env(config, r))
                .unwrap_or_default();
            let reply = Reply {
                env,
                ..reply_for(config, peer, &id, outcome)
            };
            protocol::send(&mut output, &reply)
        }
        Request::Release {
            id,
            force,
            exact,
            ignore_missing,
        } => {
            let how = if exact { Match::Exact } else { Match::Shown };
            let reply = match release_named_for(config, peer, &id, force, how) {
                Err(LedgerError::NoSuchHolder { .. }) if ignore_missing => Reply::default(),
                Ok(Released::Request(waiting)) => cancelled(&waiting),
                released => reply_for(config, peer, &id, refusal_of(&id, released)),
            };
            protocol::send(&mut output, &reply)
        }
        Request::Evict {
            id,
            reason,
            grace_secs,
        } => {
            let reply = match evict_for(config, peer, &id, reason, grace_secs) {
                Ok(reply) => reply,
                Err(refusal) => reply_for(config, peer, &id, Err(refusal)),
            };
            protocol::send(&mut output, &reply)
        }
        Request::Key { id } => {
            let outcome = key_for(config, peer, &id);
            let key = outcome.as_ref().ok().map(|(_, key)| key.clone());
            let reply = Reply {
                key,
                ..reply_for(config, peer, &id, outcome.map(|(record, _)| record))
            };
            protocol::send(&mut output, &reply)
        }
        Request::Bind { .. } => {
            protocol::send(&mut output, &Reply::refused("bind without an exec first"))
        }
        Request::Hello => {
            let reply = Reply {
                version: Some(env!("CARGO_PKG_VERSION").to_string()),
                ..Reply::default()
            };
            protocol::send(&mut output, &reply)
        }
        Request::Status => {
            let reply = match (shared.status)(config) {
                Ok(status) => Reply {
                    status: Some(status),
                    ..Reply::default()
                },
                Err(why) => Reply::refused(why),
            };
            protocol::send(&mut output, &reply)
        }
    }
}

/// The environment that tells a held process's CUDA which GPUs are its own, as a job's
/// (`exec::job_env`): the Python client sets it in the process that holds them.
fn hold_env(config: &Config, record: &Record) -> Vec<(String, String)> {
    match crate::host::inventory::load(&config.inventory, &config.state_dir, &config.nvml) {
        Ok(inventory) => exec::job_env(&inventory, record, config.cuda_visible_devices),
        Err(_) => Vec::new(),
    }
}

/// The reply to a release or evict that cancelled a queued request.
fn cancelled(waiting: &crate::state::ledger::Waiting) -> Reply {
    Reply {
        holder: Some(waiting.holder.clone()),
        cancelled: true,
        ..Reply::default()
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
        return protocol::send(&mut output, &Reply::refused(one_line(&e)));
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
        Err(e) => return protocol::send(&mut output, &Reply::refused(e)),
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
            .map_err(|e| one_line(&e))
    });
    match bound {
        Ok(()) => {
            let _ = protocol::send(&mut output, &granted(&grant.record));
            Ok(())
        }
        Err(e) => {
            audit_refusal(config, peer, grant.holder.as_str(), &e);
            exec::abandon(config, &grant);
            protocol::send(&mut output, &Reply::refused(e))
        }
    }
}

/// An audit line for a request the daemon itself refused (who may do what); refusals of
/// the allocation are written by `grant::allocate`.
fn audit_refusal(config: &Config, peer: Peer, holder: &str, reason: &str) {
    if let Ok(ledger) = crate::state::open_ledger(config) {
        let user = users::owner_of(peer.uid).ok().map(|o| o.user);
        ledger.audit(&crate::state::audit::Event {
            uid: Some(peer.uid),
            user,
            pid: Some(peer.pid),
            code: Some("not_yours".into()),
            ..crate::state::audit::Event::new(crate::state::audit::EventKind::Refuse, holder)
                .because(reason)
        });
    }
}

fn grant_job(
    config: &Config,
    peer: Peer,
    pairs: &[(String, String)],
    name: Option<String>,
    still_wanted: StillWanted,
) -> Result<JobGrant, String> {
    let owner = users::owner_of(peer.uid).map_err(|e| one_line(&e))?;
    let (request, holder) =
        exec::job_request(pairs, name.as_deref(), peer.pid).map_err(|e| one_line(&e))?;
    exec::grant_while(
        config,
        holder,
        &request,
        owner,
        peer.pid,
        "serve",
        Some(still_wanted),
    )
    .map_err(|e| one_line(&e))
}

/// The child the caller started takes the GPUs, once it is shown to be the caller's.
fn bind_job(
    config: &Config,
    peer: Peer,
    grant: &JobGrant,
    job: i32,
) -> Result<(Pinned, Option<JobCgroup>), String> {
    let pinned = Pinned::open(job).map_err(|e| format!("pid {job}: {}", one_line(&e)))?;
    if !authorize::started_by(peer, pinned.parent_and_owner()) {
        return Err(format!(
            "pid {job} is not a process the caller (pid {}) started as uid {}",
            peer.pid, peer.uid
        ));
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

struct HoldAsked {
    id: String,
    devices: String,
    by_minor: bool,
    pid: Option<i32>,
    until_release: bool,
    user: Option<String>,
    within: Option<String>,
    count: Option<u32>,
    mig: Option<String>,
    reason: Option<String>,
    for_secs: Option<u64>,
    /// The whole request as `gpupin pick`'s keys, instead of `devices` and `count`.
    request: Vec<(String, String)>,
}

/// A hold for the caller; one with a process is watched, so that it goes when the
/// process ends. `caller`: the connection, whose hang-up ends a wait in the queue.
fn hold_for(
    shared: &Shared,
    peer: Peer,
    asked: HoldAsked,
    caller: Option<&Arc<UnixStream>>,
) -> Result<Record, Refusal> {
    let config = shared.config();
    let config = &*config;
    let me = users::owner_of(peer.uid).map_err(|e| Refusal::Failed(one_line(&e)))?;
    let owner = match authorize::hold_for(peer, &me.user, asked.user.as_deref())
        .map_err(Refusal::Denied)?
    {
        HoldFor::Named(name) => {
            users::owner_named(name).map_err(|e| Refusal::Failed(one_line(&e)))?
        }
        HoldFor::Caller => me,
    };
    authorize::may_hold_without_process(peer, asked.until_release, asked.pid)
        .map_err(Refusal::Denied)?;
    let request = match asked.request.is_empty() {
        true => None,
        false if asked.count.is_some() || !asked.devices.trim().is_empty() => {
            return Err(Refusal::Failed(
                "a hold gives request keys, or devices or count, not both".into(),
            ));
        }
        false => {
            let pairs: Vec<(&str, &str)> = asked
                .request
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let parsed = crate::input::request::from_pairs(&pairs, Origin::Cli)
                .map_err(|e| Refusal::Failed(one_line(&e)))?;
            Some(parsed.ok_or_else(|| {
                Refusal::Failed("the request keys ask for no GPUs: give gpupin.count".into())
            })?)
        }
    };
    let pinned = match asked.pid {
        Some(pid) => {
            let pinned = Pinned::open(pid)
                .map_err(|e| Refusal::Failed(format!("pid {pid}: {}", one_line(&e))))?;
            authorize::may_pin(peer, pid, pinned.parent_and_owner()).map_err(Refusal::Denied)?;
            Some(pinned)
        }
        None => None,
    };
    if pinned.is_some() {
        shared
            .watcher
            .admits(peer.uid, &asked.id, asked.pid)
            .map_err(|e| Refusal::Failed(one_line(&e)))?;
    }
    let hold = Hold {
        id: HolderId::new(&asked.id).map_err(|e| Refusal::Failed(one_line(&e)))?,
        devices: asked.devices,
        by_minor: asked.by_minor,
        pid: asked.pid,
        until_release: asked.until_release,
        limited: authorize::limited(peer),
        owner,
        within: asked.within,
        count: asked.count,
        mig: asked.mig,
        reason: asked.reason,
        expires_at: asked
            .for_secs
            .map(|secs| crate::state::ledger::unix_now().saturating_add(secs)),
        // A wait comes among the request keys, which `hold_with` is given.
        wait: None,
    };
    // A wait in the queue ends when the caller hangs up or its process ends.
    let still_wanted = match (caller, &pinned) {
        (Some(caller), Some(pinned)) => {
            let caller = Arc::clone(caller);
            let fd = pinned
                .fd
                .try_clone()
                .map_err(|e| Refusal::Failed(one_line(&e)))?;
            let process = Pinned {
                pid: pinned.pid,
                fd,
            };
            Some(StillWanted(Arc::new(move || {
                still_open(&caller) && process.alive()
            })))
        }
        _ => None,
    };
    // A refused allocation is audited by grant::allocate.
    let record = hold::hold_with(config, &hold, request, still_wanted, "serve")
        .map_err(|e| Refusal::Failed(one_line(&e)))?;
    if let (Some(pinned), Ok(holder)) = (pinned, HolderId::new(&record.id)) {
        let pid = pinned.pid;
        if let Err(why) = still_the_pinned(&pinned, &record) {
            if let Ok(ledger) = crate::state::open_ledger(config) {
                let _ = ledger.release_job(&holder, pid);
            }
            return Err(Refusal::Failed(why));
        }
        if let Err(e) = shared
            .watcher
            .watch(peer.uid, holder.clone(), pinned, None, true)
        {
            // Another request of the caller's took the last watch meanwhile: nothing
            // would release this hold at its process's end, so it goes now.
            if let Ok(ledger) = crate::state::open_ledger(config) {
                let _ = ledger.release_job(&holder, pid);
            }
            return Err(Refusal::Failed(one_line(&e)));
        }
    }
    Ok(record)
}

/// Whether the process `record` names is still the one pinned when the hold was asked
/// for: it ran when the record was written (the record's start time is of a live
/// process) and the pidfd says it runs now. A process that ended in between, its pid
/// taken by another since, must not have the hold: the ledger would take that other
/// process for the holder (same pid, a start time of a live process), and nothing would
/// watch it.
fn still_the_pinned(pinned: &Pinned, record: &Record) -> Result<(), String> {
    let now = crate::base::procinfo::start_time(pinned.pid);
    if authorize::still_the_process(record.start_time, now, pinned.alive()) {
        return Ok(());
    }
    Err(format!(
        "pid {} ended before its hold was recorded: nothing is held (hold again with a running process)",
        pinned.pid
    ))
}

/// Why the daemon said no: the caller may not do this (audited here), or it could not be
/// done (a bad value, a refused allocation, which grant audits).
#[derive(Debug)]
enum Refusal {
    Denied(String),
    Failed(String),
}

/// The key to `id`, `HOLDER:KEY`, for its owner or root: whoever holds it may let others
/// in (a container of theirs, a colleague's job), and no one else may.
fn key_for(config: &Config, peer: Peer, id: &str) -> Result<(Record, String), Refusal> {
    let holder = HolderId::new(id).map_err(|e| Refusal::Failed(one_line(&e)))?;
    let ledger = crate::state::open_ledger(config).map_err(|e| Refusal::Failed(one_line(&e)))?;
    match ledger.key(&holder) {
        Ok(Some((record, key))) => {
            authorize::may_have_key(peer, &record).map_err(Refusal::Denied)?;
            let key = format!("{}:{key}", record.id);
            Ok((record, key))
        }
        Ok(None) => Err(Refusal::Failed(format!(
            "no running holder {id} (see gpupin status)"
        ))),
        Err(e) => Err(Refusal::Failed(one_line(&e))),
    }
}

/// A user's `gpupin release`: `Ledger::release_named` among their own holders, by the
/// name status shows, as themselves.
fn release_named_for(
    config: &Config,
    peer: Peer,
    id: &str,
    force: bool,
    how: Match,
) -> Result<Released, LedgerError> {
    let ledger = crate::state::open_ledger(config)?;
    let user = crate::host::users::owner_of(peer.uid)
        .map(|o| o.user)
        .unwrap_or_else(|_| format!("uid {}", peer.uid));
    let by = Releaser {
        uid: peer.uid,
        user,
        force,
        how,
        command: "release",
    };
    ledger.release_named(std::ffi::OsStr::new(id), &by)
}

/// A user's `gpupin evict`: one of their own holders, stopped by the daemon as root
/// (`jobs::evict`), or a queued request of theirs, cancelled; naming another's is a
/// refusal the audit log keeps.
fn evict_for(
    config: &Config,
    peer: Peer,
    id: &str,
    reason: Option<String>,
    grace_secs: Option<u64>,
) -> Result<Reply, Refusal> {
    use crate::jobs::evict::{self, EvictError, Evictor};
    let user = users::owner_of(peer.uid)
        .map(|o| o.user)
        .unwrap_or_else(|_| format!("uid {}", peer.uid));
    let grace = Duration::from_secs(grace_secs.unwrap_or(10)).min(evict::MAX_USER_GRACE);
    let by = Evictor {
        uid: peer.uid,
        user,
        reason,
        how: Match::Shown,
    };
    let outcome = match evict::evict(config, id, &by, grace) {
        Ok(eviction) => Ok(Reply {
            stopped: Some(eviction.how(grace)),
            ..granted(&eviction.record)
        }),
        Err(EvictError::Ledger(LedgerError::NoSuchHolder { .. })) => {
            evict::cancel_queued(config, id, &by).map(|w| cancelled(&w))
        }
        Err(e) => Err(e),
    };
    outcome.map_err(|e| match e {
        EvictError::NotYours { .. } | EvictError::Ledger(LedgerError::NotYourRequest { .. }) => {
            Refusal::Denied(one_line(&e))
        }
        e => Refusal::Failed(one_line(&e)),
    })
}

/// A release's outcome as the reply says it: taking another's holder is a refusal the
/// audit log keeps, anything else a failure.
fn refusal_of(id: &str, released: Result<Released, LedgerError>) -> Result<Record, Refusal> {
    match released {
        Ok(Released::Holder(record)) => Ok(*record),
        Ok(_) => Err(Refusal::Failed(format!("{id} holds nothing"))),
        Err(e) if authorize::is_denial(&e) => Err(Refusal::Denied(one_line(&e))),
        Err(e) => Err(Refusal::Failed(one_line(&e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A user's `gpupin release` as the daemon answers it: among their own holders, by the name status shows.
    fn release_for(
        config: &Config,
        peer: Peer,
        id: &str,
        force: bool,
        how: Match,
    ) -> Result<Record, Refusal> {
        refusal_of(id, release_named_for(config, peer, id, force, how))
    }
    use crate::model::holder::Owner;
    use std::io::{BufRead, Write};
    use std::os::unix::process::CommandExt;

    /// nobody, a user every Debian system has: `users::owner_of` must find the caller.
    const NOBODY: u32 = 65534;

    /// A daemon's shared state on a ledger of 8 simulated GPUs in `dir`, without a socket.
    fn daemon(dir: &std::path::Path, serve: ServeSettings) -> Arc<Shared> {
        let config = Config {
            serve,
            ..crate::input::config::testing::sim8_in(dir)
        };
        let watcher = Watcher::start(Arc::new(config.clone()), serve.max_watched_per_user).unwrap();
        Arc::new(Shared::new(config, watcher))
    }

    /// A caller as SO_PEERCRED gives it: this process, as `uid`.
    fn caller(uid: u32) -> Peer {
        Peer {
            pid: std::process::id() as i32,
            uid,
        }
    }

    /// Root's hold of GPU `devices` for alice (uid 1001), until released.
    fn alices_hold(config: &Config, id: &str, devices: &str) -> Record {
        let alice = Owner {
            uid: 1001,
            user: "alice".into(),
            groups: vec![],
        };
        hold::testing::for_owner(config, id, devices, alice, None)
    }

    #[track_caller]
    fn denied<T: std::fmt::Debug>(outcome: Result<T, Refusal>) -> String {
        match outcome {
            Err(Refusal::Denied(why)) => why,
            other => panic!("not denied: {other:?}"),
        }
    }

    #[track_caller]
    fn failed<T: std::fmt::Debug>(outcome: Result<T, Refusal>) -> String {
        match outcome {
            Err(Refusal::Failed(why)) => why,
            other => panic!("not failed: {other:?}"),
        }
    }

    /// The refusals audited so far (in their own log beside audit.log), as JSON.
    fn refusals(dir: &std::path::Path) -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.join("audit.refusals.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn connections_are_bounded_in_all_and_per_user_and_a_closed_one_frees_its_slot() {
        let tmp = tempfile::tempdir().unwrap();
        let settings = ServeSettings {
            max_connections: 4,
            max_connections_per_user: 2,
            ..ServeSettings::default()
        };
        let shared = daemon(tmp.path(), settings);
        let per_user = "uid 1001 has 2 connections open to gpupin serve, the limit (serve.max_connections_per_user): close some first";
        let a1 = shared.admit(1001).unwrap();
        let a2 = shared.admit(1001).unwrap();
        assert_eq!(shared.admit(1001).err().unwrap(), per_user);
        let b1 = shared.admit(1002).unwrap();
        let c1 = shared.admit(1003).unwrap();
        assert_eq!(
            shared.admit(1004).err().unwrap(),
            "gpupin serve has 4 connections open, its limit (serve.max_connections): try again shortly"
        );
        // Root's are the Slurm prolog's and the admins': never refused.
        let roots: Vec<Slot> = (0..3).map(|_| shared.admit(0).unwrap()).collect();
        drop(roots);
        drop(c1);
        drop(a1);
        // With one of alice's closed, she has one more, and then she is at her bound again.
        let a3 = shared.admit(1001).unwrap();
        assert_eq!(shared.admit(1001).err().unwrap(), per_user);
        drop((a2, a3, b1));
        let open = shared.open.lock().unwrap();
        assert_eq!((open.total, open.by_uid.len()), (0, 0));
    }

    #[test]
    fn only_a_holders_owner_or_root_has_its_key() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let config = &*config;
        alices_hold(config, "res", "0");
        let (record, key) = key_for(config, caller(1001), "res").unwrap();
        assert_eq!(record.id, "res");
        assert_eq!(key.len(), "res:".len() + 32, "{key}");
        assert!(key.starts_with("res:"), "{key}");
        assert_eq!(key_for(config, caller(0), "res").unwrap().1, key);
        assert_eq!(
            denied(key_for(config, caller(1002), "res")),
            "holder res is alice's: only its owner or root may have its key"
        );
        assert_eq!(
            failed(key_for(config, caller(1001), "gone")),
            "no running holder gone (see gpupin status)"
        );
    }

    #[test]
    fn a_user_releases_only_their_own_holder_and_a_refusal_is_audited() {
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        let config = &*config;
        alices_hold(config, "res", "0");
        let nobody = caller(NOBODY);
        let outcome = release_for(config, nobody, "res", false, Match::Shown);
        let reply = reply_for(config, nobody, "res", outcome);
        let why = "holder res is alice's, not nobody's: only alice or root may release it";
        assert_eq!(reply.error.as_deref(), Some(why));
        assert_eq!(reply.holder, None);
        let refusal = refusals(tmp.path())
            .into_iter()
            .find(|l| l["holder"] == "res")
            .expect("the refusal is audited");
        assert_eq!(refusal["event"], "refuse");
        assert_eq!(refusal["holder"], "res");
        assert_eq!(refusal["uid"], NOBODY);
        assert_eq!(refusal["user"], "nobody");
        assert_eq!(refusal["pid"], std::process::id());
        assert_eq!(refusal["code"], "not_yours");
        assert_eq!(refusal["reason"], why);
        // Still held; its owner releases it, and then it holds nothing.
        let reply = reply_for(
            config,
            caller(1001),
            "res",
            release_for(config, caller(1001), "res", false, Match::Shown),
        );
        assert_eq!((reply.error, reply.holder), (None, Some("res".to_string())));
        assert_eq!(reply.gpus.len(), 1);
        let gone = "no holder \"res\": give a name or id as gpupin status shows it (an id may be cut to its first 12 characters)";
        let outcome = release_for(config, caller(1001), "res", false, Match::Shown);
        assert_eq!(failed(outcome), gone);
        // A request that could not be done is no refusal of who may do what.
        let reply = reply_for(
            config,
            caller(1001),
            "res",
            release_for(config, caller(1001), "res", false, Match::Shown),
        );
        assert_eq!(reply.error.as_deref(), Some(gone));
        assert_eq!(refusals(tmp.path()).len(), 1);
    }

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
            err,
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

    /// A process running as nobody, for as long as the test needs it.
    fn nobodys_process() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .uid(NOBODY)
            .gid(NOBODY)
            .spawn()
            .unwrap()
    }

    #[test]
    fn a_user_holds_only_for_themselves_with_a_process_of_their_own() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: starting a process as nobody needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let mut limited = (*shared.config()).clone();
        limited.limits.max_gpus_per_user = Some(2);
        *shared.config.write().unwrap() = Arc::new(limited);
        let mut theirs = nobodys_process();
        let mut roots = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ask = |id: &str, devices: &str, pid: Option<u32>, user: Option<&str>| HoldAsked {
            id: id.into(),
            devices: devices.into(),
            by_minor: false,
            pid: pid.map(|p| p as i32),
            until_release: false,
            user: user.map(String::from),
            within: None,
            count: None,
            mig: None,
            reason: None,
            for_secs: None,
            request: Vec::new(),
        };
        let nobody = caller(NOBODY);
        let by_name = hold_for(
            &shared,
            nobody,
            ask("h1", "1", Some(theirs.id()), Some("nobody")),
            None,
        );
        let record = by_name.unwrap();
        assert_eq!(record.owner.as_ref().map(|o| o.uid), Some(NOBODY));
        assert_eq!(record.pid, Some(theirs.id() as i32));
        let by_uid = hold_for(
            &shared,
            nobody,
            ask("h2", "2", Some(theirs.id()), Some("65534")),
            None,
        );
        assert_eq!(by_uid.unwrap().owner.unwrap().user, "nobody");
        // Their limit applies to them (2 GPUs): not to root's holds for them below.
        assert!(
            failed(hold_for(
                &shared,
                nobody,
                ask("h3", "3", Some(theirs.id()), None),
                None,
            ))
            .ends_with("(limits.max_gpus_per_user)")
        );
        assert_eq!(
            denied(hold_for(
                &shared,
                nobody,
                ask("h4", "4", Some(theirs.id()), Some("root")),
                None,
            )),
            "only root may hold GPUs for another user (root)"
        );
        let until_release = HoldAsked {
            until_release: true,
            ..ask("h5", "5", None, None)
        };
        assert_eq!(
            denied(hold_for(&shared, nobody, until_release, None)),
            "only root may hold GPUs until released: give --pid with a process of yours"
        );
        assert_eq!(
            denied(hold_for(
                &shared,
                nobody,
                ask("h6", "6", Some(roots.id()), None),
                None,
            )),
            format!("pid {} is not a process of uid {NOBODY}", roots.id())
        );
        // Root holds for anyone, with anyone's process or until released.
        let root = caller(0);
        let for_nobody = hold_for(
            &shared,
            root,
            ask("r1", "3", Some(theirs.id()), Some("nobody")),
            None,
        );
        assert_eq!(for_nobody.unwrap().owner.unwrap().uid, NOBODY);
        let until_release = HoldAsked {
            until_release: true,
            ..ask("r2", "4", None, Some("nobody"))
        };
        assert_eq!(
            hold_for(&shared, root, until_release, None)
                .unwrap()
                .owner
                .unwrap()
                .uid,
            NOBODY
        );
        let ledger = Ledger::open(&shared.config().ledger_settings()).unwrap();
        let mut held: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        held.sort();
        assert_eq!(held, ["h1", "h2", "r1", "r2"]);
        for child in [&mut theirs, &mut roots] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// A process that ended while its hold waited in the queue, its pid taken since by
    /// another process of the same user: the hold is not that other process's. Before the
    /// record was checked against the pidfd, the reply said it was held (for the recycled
    /// pid, until the watcher saw the pidfd end).
    #[test]
    fn a_hold_never_passes_to_a_process_that_took_its_pid() {
        if !rustix::process::geteuid().is_root() {
            // With CI=true an end-to-end check must run, never skip.
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "recycling a pid (ns_last_pid) needs root"
            );
            eprintln!("skipped: recycling a pid (ns_last_pid) needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        hold::testing::roots(&config, "full", "0,1,2,3,4,5,6,7");
        let mut first = nobodys_process();
        let pid = first.id() as i32;
        let asked = HoldAsked {
            id: "py".into(),
            devices: String::new(),
            by_minor: false,
            pid: Some(pid),
            until_release: false,
            user: None,
            within: None,
            count: None,
            mig: None,
            reason: None,
            for_secs: None,
            request: vec![
                ("gpupin.count".into(), "1".into()),
                ("gpupin.wait".into(), "2m".into()),
            ],
        };
        let waiting = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || hold_for(&shared, caller(NOBODY), asked, None))
        };
        let ledger = Ledger::open(&config.ledger_settings()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while ledger.waiting().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the hold never queued");
            std::thread::sleep(Duration::from_millis(20));
        }
        first.kill().unwrap();
        first.wait().unwrap();
        let mut second = recycled(pid);
        ledger.release(&HolderId::new("full").unwrap()).unwrap();
        let outcome = waiting.join().unwrap();
        if let Some(second) = second.as_mut() {
            second.kill().unwrap();
            second.wait().unwrap();
        }
        assert_eq!(
            failed(outcome),
            format!(
                "pid {pid} ended before its hold was recorded: nothing is held (hold again with a running process)"
            )
        );
        let held: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert!(held.is_empty(), "{held:?}");
        assert!(
            second.is_some(),
            "the pid was never taken again: the test showed less"
        );
    }

    /// Nobody's process with `pid`, made by setting the kernel's last pid just below it
    /// (other processes may take it first: a few tries).
    fn recycled(pid: i32) -> Option<std::process::Child> {
        for _ in 0..50 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
            let mut child = nobodys_process();
            if child.id() as i32 == pid {
                return Some(child);
            }
            child.kill().unwrap();
            child.wait().unwrap();
        }
        None
    }

    #[test]
    fn a_caller_sending_a_byte_now_and_then_still_runs_out_of_time() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = Arc::clone(&done);
        // A byte every 50 ms, never a whole line, for up to 20 s.
        let slow = std::thread::spawn(move || {
            let mut theirs = theirs;
            for _ in 0..400 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) || theirs.write_all(b" ").is_err()
                {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let mut input = BufReader::new(Deadline::new(Arc::new(ours), Duration::from_millis(400)));
        let mut line = Vec::new();
        let err = input.read_until(b'\n', &mut line).unwrap_err();
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert_eq!(
            err.to_string(),
            "the request did not arrive whole within 400ms"
        );
        assert!(!line.is_empty(), "bytes kept coming: {line:?}");
        slow.join().unwrap();
    }

    #[test]
    fn a_restarted_deadline_counts_from_the_restart() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut input = Deadline::new(Arc::new(ours), Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(50));
        (&theirs).write_all(b"x").unwrap();
        let mut byte = [0u8; 1];
        // Over, though a byte is there: the request did not come in time.
        let err = input.read(&mut byte).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        // The bind after a grant has its own time, from the grant on.
        input.restart(Duration::from_secs(60));
        assert_eq!(input.read(&mut byte).unwrap(), 1);
        assert_eq!(&byte, b"x");
    }

    #[test]
    fn a_read_that_fails_is_not_called_a_timeout() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        // The caller goes away with bytes of ours unread: the kernel resets the connection.
        (&ours).write_all(b"unread").unwrap();
        drop(theirs);
        let mut input = Deadline::new(Arc::new(ours), Duration::from_secs(60));
        let err = input.read(&mut [0u8; 16]).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    }

    #[test]
    fn a_connection_is_still_wanted_until_the_caller_hangs_up() {
        let (ours, theirs) = UnixStream::pair().unwrap();
        assert!(still_open(&ours));
        (&theirs).write_all(b"early bytes are no hang-up").unwrap();
        assert!(still_open(&ours));
        drop(theirs);
        assert!(!still_open(&ours));
    }
}
