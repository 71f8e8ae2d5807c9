//! What every connection of the daemon shares (the config, which SIGHUP replaces, the
//! watcher, the open connections), the slot each admitted connection holds, and the
//! deadline a request must arrive within.
//!
//! No caller can make it hang or run out of fds or threads: connections are bounded per
//! user and in all (`[serve]`), and a request must arrive whole within `request_timeout`
//! (a deadline for the request, not for each read).

use super::watch::Watcher;
use crate::input::config::{Config, ConfigError};
use std::collections::HashMap;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// What every connection's thread shares.
pub(super) struct Shared {
    /// Replaced whole on SIGHUP; a connection keeps the one it started with.
    pub(super) config: RwLock<Arc<Config>>,
    pub(super) watcher: Watcher,
    /// `gpupin reset`'s pause of the health watch.
    pub(super) health_pause: super::health_pause::HealthPause,
    open: Mutex<Open>,
}

/// Open connections: in all, and by uid.
#[derive(Default)]
struct Open {
    total: u32,
    by_uid: HashMap<u32, u32>,
}

/// One admitted connection: counted until dropped.
pub(super) struct Slot {
    pub(super) shared: Arc<Shared>,
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
    pub(super) fn new(config: Config, watcher: Watcher) -> Shared {
        Shared {
            config: RwLock::new(Arc::new(config)),
            watcher,
            health_pause: Default::default(),
            open: Mutex::new(Open::default()),
        }
    }

    /// The config as it is now.
    pub(super) fn config(&self) -> Arc<Config> {
        Arc::clone(&self.config.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// A slot for a connection of `uid`, or the one-line reason there is none. Root is
    /// not bounded: its connections are the Slurm prolog's and the admins'.
    pub(super) fn admit(self: &Arc<Self>, uid: u32) -> Result<Slot, String> {
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

/// Reads the config file again and puts it in place for the connections that come next.
/// Keys the daemon cannot change while it runs (where the ledger and the socket are, the
/// socket's group) keep their old values, and are named.
pub(super) fn reload(shared: &Shared) -> Reloaded {
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

/// Reads a connection until a deadline: before each read the socket's timeout is set to
/// what is left, so that a caller sending a byte now and then still runs out of time.
pub(super) struct Deadline {
    pub(super) stream: Arc<UnixStream>,
    until: Instant,
    /// The whole time allowed, for the message.
    allowed: Duration,
}

impl Deadline {
    pub(super) fn new(stream: Arc<UnixStream>, allowed: Duration) -> Deadline {
        Deadline {
            stream,
            until: Instant::now() + allowed,
            allowed,
        }
    }

    pub(super) fn restart(&mut self, allowed: Duration) {
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
pub(super) fn still_open(stream: &UnixStream) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::daemon;
    use std::io::{BufRead, BufReader, Write};

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
