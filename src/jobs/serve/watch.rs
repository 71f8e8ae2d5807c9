//! The daemon's one watcher of processes: a single thread polls the pidfds of every job
//! and held process at once, and releases a holder when its process ends. One pidfd a
//! process, however many holders it has; a holder asked again for the same process is
//! watched once; one user has at most `max_per_user` holders watched, so that no caller
//! can make the daemon open fds or threads without bound.

use super::peer::Pinned;
use crate::host::confine::JobCgroup;
use crate::input::config::Config;
use crate::jobs::exec;
use crate::model::holder::HolderId;
use rustix::event::{PollFd, PollFlags, Timespec};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a holder whose release must be checked again waits before the next check.
const CHECK_AGAIN: Duration = exec::LEFTOVERS_POLL;

/// What a release step says of a holder whose process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Check {
    /// Released (or nothing was left to release).
    Done,
    /// Not over yet (processes left in its cgroup, `leftovers`): look again later.
    Again,
}

/// The release step for a holder whose process ended: a job is over when its cgroup is
/// empty (`exec::finish`).
fn finish(config: &Config, holder: &HolderId, pid: i32, cgroup: Option<&JobCgroup>) -> Check {
    match exec::finish(config, holder, pid, cgroup) {
        exec::Finished::Released => Check::Done,
        exec::Finished::Leftovers => Check::Again,
    }
}

#[derive(Debug, thiserror::Error)]
pub(super) enum WatchError {
    #[error(
        "uid {uid} has {watched} holders with a process watched by gpupin serve; the limit is {limit} (serve.max_watched_per_user): release some first"
    )]
    TooMany {
        uid: u32,
        watched: usize,
        limit: u32,
    },
}

/// One holder of a watched process.
struct Holding {
    holder: HolderId,
    uid: u32,
    cgroup: Option<JobCgroup>,
}

/// A process and the holders that end with it.
struct Watched {
    pinned: Pinned,
    holders: Vec<Holding>,
}

/// A holder whose process ended and whose release must be checked again.
struct Pending {
    pid: i32,
    holding: Holding,
    at: Instant,
}

#[derive(Default)]
struct State {
    procs: Vec<Watched>,
    pending: Vec<Pending>,
}

impl State {
    fn watched_of(&self, uid: u32) -> usize {
        let live = self
            .procs
            .iter()
            .flat_map(|w| &w.holders)
            .filter(|h| h.uid == uid)
            .count();
        live + self.pending.iter().filter(|p| p.holding.uid == uid).count()
    }

    /// Forgets the holds that are no longer this process's in the ledger (released by
    /// hand, or by root's `gpupin release`): they would count against their user's bound
    /// until the process ends. Jobs (with a cgroup) stay until their process ends. The
    /// watching thread drops a process left without holders (only it closes pidfds).
    fn prune(&mut self, config: &Config) {
        let Ok(ledger) = crate::state::ledger::Ledger::open_read_only(&config.ledger_settings())
        else {
            return;
        };
        let Ok(records) = ledger.records() else {
            return;
        };
        for w in &mut self.procs {
            let pid = w.pinned.pid;
            w.holders.retain(|h| {
                h.cgroup.is_some()
                    || records
                        .iter()
                        .any(|r| r.id == h.holder.as_str() && r.pid == Some(pid))
            });
        }
    }

    /// The running process `pid` among the watched ones (a watched pid whose process
    /// ended may have been reused by the one asked about).
    fn find(&mut self, pid: i32) -> Option<&mut Watched> {
        self.procs
            .iter_mut()
            .find(|w| w.pinned.pid == pid && w.pinned.alive())
    }
}

/// The handle the connections use; the thread runs as long as the daemon.
#[derive(Clone)]
pub(super) struct Watcher {
    state: Arc<Mutex<State>>,
    config: Arc<Config>,
    /// The write end of the pipe that wakes the thread when a process is added.
    wake: Arc<OwnedFd>,
    max_per_user: u32,
}

impl Watcher {
    /// Starts the watching thread. An error: the thread could not be started.
    pub(super) fn start(config: Arc<Config>, max_per_user: u32) -> std::io::Result<Watcher> {
        use rustix::pipe::{PipeFlags, pipe_with};
        let (read, write) = pipe_with(PipeFlags::CLOEXEC | PipeFlags::NONBLOCK)?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let watching = Arc::clone(&config);
        std::thread::Builder::new()
            .name("gpupin-watch".into())
            .spawn(move || run(&watching, &shared, &read))?;
        Ok(Watcher {
            state,
            config,
            wake: Arc::new(write),
            max_per_user,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `uid` may have one more holder watched, unless `holder` of process `pid`
    /// is watched already (asked again).
    pub(super) fn admits(
        &self,
        uid: u32,
        holder: &str,
        pid: Option<i32>,
    ) -> Result<(), WatchError> {
        let mut state = self.lock();
        if let Some(pid) = pid
            && state
                .find(pid)
                .is_some_and(|w| w.holders.iter().any(|h| h.holder.as_str() == holder))
        {
            return Ok(());
        }
        let watched = self.count_of(&mut state, uid);
        if uid != 0 && watched >= self.max_per_user as usize {
            return Err(WatchError::TooMany {
                uid,
                watched,
                limit: self.max_per_user,
            });
        }
        Ok(())
    }

    /// Releases `holder` (of `uid`) when `pinned` ends. Holders of root, and those a
    /// daemon before this one bound (`bounded` false), are not counted against a bound.
    /// A holder whose process ended while no daemon watched it, but whose job left
    /// processes in its cgroup: checked from now on as one whose process just ended, so
    /// that `leftovers = "kill"` kills them and the GPUs go once the cgroup is empty.
    pub(super) fn check_later(&self, uid: u32, holder: HolderId, pid: i32) {
        self.lock().pending.push(Pending {
            pid,
            holding: Holding {
                holder,
                uid,
                cgroup: None,
            },
            at: Instant::now(),
        });
    }

    pub(super) fn watch(
        &self,
        uid: u32,
        holder: HolderId,
        pinned: Pinned,
        cgroup: Option<JobCgroup>,
        bounded: bool,
    ) -> Result<(), WatchError> {
        let mut state = self.lock();
        let holding = Holding {
            holder,
            uid,
            cgroup,
        };
        // The same holder again (a repeated hold): watched once; this pidfd goes.
        if let Some(w) = state.find(pinned.pid)
            && w.holders.iter().any(|h| h.holder == holding.holder)
        {
            return Ok(());
        }
        let watched = match bounded && uid != 0 {
            true => self.count_of(&mut state, uid),
            false => 0,
        };
        if bounded && uid != 0 && watched >= self.max_per_user as usize {
            return Err(WatchError::TooMany {
                uid,
                watched,
                limit: self.max_per_user,
            });
        }
        match state.find(pinned.pid) {
            // The process has a pidfd here already: the new one is closed.
            Some(w) => w.holders.push(holding),
            None => state.procs.push(Watched {
                pinned,
                holders: vec![holding],
            }),
        }
        drop(state);
        // A full pipe wakes the thread as well as one more byte would.
        let _ = rustix::io::write(&*self.wake, &[1]);
        Ok(())
    }

    /// How many holders of `uid` are watched; at the bound, after forgetting those the
    /// ledger no longer gives their process.
    fn count_of(&self, state: &mut State, uid: u32) -> usize {
        let watched = state.watched_of(uid);
        if watched < self.max_per_user as usize {
            return watched;
        }
        state.prune(&self.config);
        // Processes left without holders are closed by the watching thread.
        let _ = rustix::io::write(&*self.wake, &[1]);
        state.watched_of(uid)
    }

    /// How many processes are watched (pidfds open), for tests and logs.
    #[cfg(test)]
    fn processes(&self) -> usize {
        self.lock().procs.len()
    }
}

/// The watching thread: polls every pidfd and the wake pipe, releases the holders of
/// each process that ended, and checks again the holders whose release said so.
fn run(config: &Config, state: &Mutex<State>, wake: &OwnedFd) {
    let lock = || state.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let (fds, next) = {
            let s = lock();
            let fds: Vec<i32> = s.procs.iter().map(|w| w.pinned.fd.as_raw_fd()).collect();
            (fds, s.pending.iter().map(|p| p.at).min())
        };
        // SAFETY: only this thread removes processes (and so closes their pidfds), after
        // this poll returned; `watch` only adds.
        let borrowed: Vec<BorrowedFd<'_>> = fds
            .iter()
            .map(|&fd| unsafe { BorrowedFd::borrow_raw(fd) })
            .collect();
        let mut polled: Vec<PollFd<'_>> = std::iter::once(wake.as_fd())
            .chain(borrowed.iter().copied())
            .map(|fd| PollFd::from_borrowed_fd(fd, PollFlags::IN))
            .collect();
        let timeout = next.map(|at| {
            let left = at.saturating_duration_since(Instant::now());
            Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        if let Err(e) = rustix::event::poll(&mut polled, timeout.as_ref())
            && e != rustix::io::Errno::INTR
        {
            tracing::warn!(error = %e, "polling the watched processes");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut drain = [0u8; 256];
        while matches!(rustix::io::read(wake, &mut drain), Ok(n) if n > 0) {}
        drop(polled);
        // The processes that ended, and the pending checks that are due.
        let (ended, due) = {
            let mut s = lock();
            // Ended, or left without holders (`prune`): their pidfds close here.
            let (gone, running): (Vec<Watched>, Vec<Watched>) = std::mem::take(&mut s.procs)
                .into_iter()
                .partition(|w| w.holders.is_empty() || !w.pinned.alive());
            s.procs = running;
            let now = Instant::now();
            let (due, later): (Vec<Pending>, Vec<Pending>) = std::mem::take(&mut s.pending)
                .into_iter()
                .partition(|p| p.at <= now);
            s.pending = later;
            (gone, due)
        };
        let mut again = Vec::new();
        for w in ended {
            let pid = w.pinned.pid;
            tracing::debug!(pid, holders = w.holders.len(), "a watched process ended");
            for holding in w.holders {
                again.extend(release(config, pid, holding));
            }
        }
        for p in due {
            again.extend(release(config, p.pid, p.holding));
        }
        if !again.is_empty() {
            lock().pending.extend(again);
        }
    }
}

fn release(config: &Config, pid: i32, holding: Holding) -> Option<Pending> {
    match finish(config, &holding.holder, pid, holding.cgroup.as_ref()) {
        Check::Done => None,
        Check::Again => Some(Pending {
            pid,
            holding,
            at: Instant::now() + CHECK_AGAIN,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{GpuRequest, Origin, Selection};
    use crate::model::holder::HolderKind;
    use crate::state::ledger::{HolderMeta, Machine};

    fn sleeper() -> std::process::Child {
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap()
    }

    fn id(s: &str) -> HolderId {
        HolderId::new(s).unwrap()
    }

    #[test]
    fn one_pidfd_a_process_a_repeated_holder_watched_once_and_a_bound_per_user() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            state_dir: tmp.path().join("state"),
            ..Config::default()
        };
        let ledger = crate::state::open_ledger(&config).unwrap();
        let w = Watcher::start(Arc::new(config), 3).unwrap();
        let mut child = sleeper();
        let pid = child.id() as i32;
        // Holds of that process in the ledger, as gpupin serve makes them.
        let inv = crate::policy::testing::machine(4);
        let m = Machine::new(&inv, PolicyName::Pack);
        for h in ["h1", "h2", "h3"] {
            let meta = HolderMeta {
                source: "test".into(),
                pid: Some(pid),
                kind: HolderKind::Hold,
                ..HolderMeta::default()
            };
            let one = GpuRequest::new(Selection::Count(1), Origin::Cli);
            ledger.allocate(&id(h), &one, &m, meta).unwrap();
        }
        for _ in 0..5 {
            w.admits(7, "h1", Some(pid)).unwrap();
            let pinned = Pinned::open(pid).unwrap();
            w.watch(7, id("h1"), pinned, None, true).unwrap();
        }
        for h in ["h2", "h3"] {
            w.watch(7, id(h), Pinned::open(pid).unwrap(), None, true)
                .unwrap();
        }
        assert_eq!(w.processes(), 1);
        let err = w
            .watch(7, id("h4"), Pinned::open(pid).unwrap(), None, true)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "uid 7 has 3 holders with a process watched by gpupin serve; the limit is 3 (serve.max_watched_per_user): release some first"
        );
        assert!(w.admits(7, "h4", Some(pid)).is_err());
        assert!(w.admits(7, "h1", Some(pid)).is_ok(), "asked again");
        assert!(w.admits(8, "h4", Some(pid)).is_ok(), "another user");
        // A hold released by hand no longer counts.
        ledger.release(&id("h3")).unwrap();
        assert!(w.admits(7, "h4", Some(pid)).is_ok(), "h3 was released");
        child.kill().unwrap();
        child.wait().unwrap();
        // The pidfd closes, then the holders are released (outside the watcher's lock).
        let start = Instant::now();
        while w.processes() > 0 || !ledger.records().unwrap().is_empty() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "not released at the process's end"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
