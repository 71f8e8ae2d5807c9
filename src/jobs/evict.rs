//! `gpupin evict HOLDER`: an operator ends a holder that still runs, then its GPUs are
//! released once it is gone. A container of Docker or podman is stopped by its engine
//! (`docker stop`, so that a restart policy does not start it again); any other holder
//! with a process (runc, containerd, a `gpupin exec` job, a hold bound to a pid) gets
//! SIGTERM, and SIGKILL after the grace, through a pidfd, with the processes of its job
//! cgroups. The audit log gets an `evict` line naming who evicted whom before the stop,
//! and the release after it.

use crate::input::config::Config;
use crate::state::ledger::lookup::{self, Match};
use crate::state::ledger::{Ledger, LedgerError, Record, Released, Releaser};
use rustix::process::Signal;
use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How long past the grace the holder may take to be gone (its engine's cleanup, the
/// hook's release) before evict gives up.
const SETTLE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvictError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error(
        "{name} has no process gpupin can stop (a hold without one ends with gpupin release {name})"
    )]
    NoProcess { name: String },
    #[error(
        "{name} still runs {waited}s after it was told to stop ({how}); its GPUs stay held: look at pid {pid}"
    )]
    StillRuns {
        name: String,
        how: String,
        waited: u64,
        pid: i32,
    },
}

/// How the holder was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It no longer ran: only released.
    WasNotRunning,
    /// `docker stop -t 10 NAME` and the like.
    ByEngine(String),
    /// SIGTERM, and SIGKILL when it outlived the grace.
    BySignal { killed: bool },
}

#[derive(Debug)]
pub struct Eviction {
    pub record: Record,
    pub stopped: Stopped,
}

/// Stops the holder `given` names (as `gpupin status` shows it) and releases it; `by`
/// is who asks, for the audit line (root: evict is root's).
pub fn evict(
    config: &Config,
    given: &str,
    by: &str,
    grace: Duration,
) -> Result<Eviction, EvictError> {
    let ledger = crate::state::open_ledger(config)?;
    let records = ledger.records()?;
    let record = lookup::the_one(&records, given, Match::Shown)?.clone();
    let name = record.display_name().to_string();
    if !record.runs(SystemTime::now(), ledger.unbound_grace()) {
        release(&ledger, &record, by)?;
        return Ok(Eviction {
            record,
            stopped: Stopped::WasNotRunning,
        });
    }
    let Some(pid) = record.pid else {
        return Err(EvictError::NoProcess { name });
    };
    let engine_stop = engine_stop(&record, grace);
    let how = engine_stop
        .as_ref()
        .map_or("SIGTERM, then SIGKILL".to_string(), |c| c.join(" "));
    ledger.audit_eviction(&record, &format!("gpupin evict by {by}: {how}"));
    let stopped = match engine_stop.filter(|argv| run(argv)) {
        Some(argv) => Stopped::ByEngine(argv.join(" ")),
        None => Stopped::BySignal {
            killed: terminate(&ledger, &record, pid, grace),
        },
    };
    if !gone(&ledger, &record, grace + SETTLE)? {
        return Err(EvictError::StillRuns {
            name,
            how,
            waited: (grace + SETTLE).as_secs(),
            pid,
        });
    }
    release(&ledger, &record, by)?;
    Ok(Eviction { record, stopped })
}

/// `docker stop -t SECONDS ID` for a Docker or podman container when its CLI is there.
fn engine_stop(record: &Record, grace: Duration) -> Option<Vec<String>> {
    let engine = record.container.as_ref()?.engine.as_deref()?;
    if !matches!(engine, "docker" | "podman") {
        return None;
    }
    Some(vec![
        engine.to_string(),
        "stop".into(),
        "-t".into(),
        grace.as_secs().to_string(),
        record.id.clone(),
    ])
}

/// Runs `argv`; whether it succeeded.
fn run(argv: &[String]) -> bool {
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGTERM to the holder's process (and its job cgroups), SIGKILL after `grace` if it
/// still runs; whether SIGKILL was needed. The process is pinned by a pidfd and checked
/// against the record's start time, so a pid reused since is never signalled.
fn terminate(ledger: &Ledger, record: &Record, pid: i32, grace: Duration) -> bool {
    let pinned = rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
        .filter(|_| {
            record
                .start_time
                .is_some_and(|s| crate::base::procinfo::is_alive(pid, s))
        });
    let send = |signal: Signal| {
        if let Some(fd) = &pinned {
            let _ = rustix::process::pidfd_send_signal(fd, signal);
        }
        for cgroup in &record.cgroups {
            let _ = crate::host::confine::signal(cgroup, signal);
        }
    };
    send(Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !still_runs(ledger, record) {
            return false;
        }
        std::thread::sleep(POLL);
    }
    send(Signal::KILL);
    for cgroup in &record.cgroups {
        let _ = crate::host::confine::kill(cgroup);
    }
    true
}

/// Whether the holder's record is still there and running.
fn still_runs(ledger: &Ledger, record: &Record) -> bool {
    ledger.records().is_ok_and(|records| {
        records
            .iter()
            .any(|r| same(r, record) && r.runs(SystemTime::now(), ledger.unbound_grace()))
    })
}

/// Waits up to `wait` for the holder to stop running (its record gone, or stale).
fn gone(ledger: &Ledger, record: &Record, wait: Duration) -> Result<bool, LedgerError> {
    let deadline = Instant::now() + wait;
    loop {
        if !still_runs(ledger, record) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(POLL);
    }
}

/// The same holder, not one made again under its name since.
fn same(a: &Record, b: &Record) -> bool {
    a.id == b.id && a.created_at == b.created_at && a.salt == b.salt
}

/// Releases the holder if its record is still there (its engine may have released it).
fn release(ledger: &Ledger, record: &Record, by: &str) -> Result<(), LedgerError> {
    if !ledger.records()?.iter().any(|r| same(r, record)) {
        return Ok(());
    }
    let releaser = Releaser {
        uid: 0,
        user: by.to_string(),
        force: false,
        how: Match::Exact,
        command: "evict",
    };
    match ledger.release_named(OsStr::new(&record.id), &releaser) {
        Ok(Released::Holder(_) | Released::Entry(_) | Released::Nothing) => Ok(()),
        // Released by its engine between the look and the release.
        Err(LedgerError::NoSuchHolder { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}
