//! The daemon's loop: a bounded number of connections, each served by a thread of its own
//! for one request (an exec waiting in the queue keeps its thread while it waits), and one
//! watcher thread for every job and hold of a process (`watch`), which releases the GPUs
//! the moment the process ends. A thread that cannot be started refuses its connection.

use super::connections::{Reloaded, Shared};
use super::peer::{self, Pinned};
use super::protocol::{self, Reply};
use super::watch::Watcher;
use crate::base::message::one_line;
use crate::input::config::{Config, ServeSettings};
use crate::model::holder::HolderId;
use crate::state::ledger::Ledger;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Serves `listener` until SIGTERM or SIGINT (then returns, so that the caller removes a
/// socket it made) or until accept fails for good. On SIGHUP the config is read again
/// from its file; `reloaded` is told how that went.
pub fn run(
    config: Config,
    listener: UnixListener,
    reloaded: impl Fn(&Reloaded) + Send + 'static,
) -> std::io::Result<()> {
    super::signals::block()?;
    let settings: ServeSettings = config.serve;
    let config_arc = Arc::new(config.clone());
    let watcher = Watcher::start(Arc::clone(&config_arc), settings.max_watched_per_user)?;
    watch_existing(&config, &watcher);
    let shared = Arc::new(Shared::new(config, watcher));
    let stopping = Arc::new(AtomicBool::new(false));
    {
        let shared = Arc::clone(&shared);
        let stopping = Arc::clone(&stopping);
        let listening = listener.as_raw_fd();
        std::thread::Builder::new()
            .name("gpupin-signals".into())
            .spawn(move || {
                while let Ok(super::signals::Asked::Reload) = super::signals::wait() {
                    reloaded(&super::connections::reload(&shared));
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
    {
        let shared = Arc::clone(&shared);
        let stopping = Arc::clone(&stopping);
        std::thread::Builder::new()
            .name("gpupin-health".into())
            .spawn(move || {
                super::health::watch(|| shared.config(), &stopping, &shared.health_pause)
            })?;
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
                if let Err(err) = super::dispatch::serve_one(&shared, peer, stream) {
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
