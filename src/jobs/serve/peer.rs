//! What the daemon knows of the processes it is asked about: the caller from the socket
//! (SO_PEERCRED, which the kernel fills and no caller can forge), and a job's parent and
//! owner from /proc, read only after a pidfd pins the process.

use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;

/// The process at the other end of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Peer {
    pub pid: i32,
    pub uid: u32,
}

pub(super) fn of(stream: &UnixStream) -> std::io::Result<Peer> {
    let cred = rustix::net::sockopt::socket_peercred(stream)?;
    Ok(Peer {
        pid: cred.pid.as_raw_nonzero().get(),
        uid: cred.uid.as_raw(),
    })
}

/// A process pinned by a pidfd: what /proc says of its pid is about this very process as
/// long as `alive` is true afterwards (a pid reused since would leave the pidfd readable).
pub(super) struct Pinned {
    pub pid: i32,
    pub fd: OwnedFd,
}

impl Pinned {
    pub(super) fn open(pid: i32) -> std::io::Result<Pinned> {
        let raw = rustix::process::Pid::from_raw(pid)
            .ok_or_else(|| std::io::Error::other(format!("pid {pid} is no process id")))?;
        let fd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty())?;
        Ok(Pinned { pid, fd })
    }

    /// Whether the process still runs (its pidfd is not readable yet).
    pub(super) fn alive(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
    }

    /// Blocks until the process ends (the tests wait so; the daemon only polls `alive`).
    #[cfg(test)]
    pub(super) fn wait_exit(&self) {
        let mut fds = [rustix::event::PollFd::new(
            &self.fd,
            rustix::event::PollFlags::IN,
        )];
        while !matches!(rustix::event::poll(&mut fds, None), Ok(n) if n > 0) {}
    }

    /// The parent pid and real uid `/proc/<pid>/status` gives, while the process lives.
    pub(super) fn parent_and_owner(&self) -> Option<(i32, u32)> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|v| v.parse::<i64>().ok())
        };
        let found = (field("PPid:")? as i32, field("Uid:")? as u32);
        self.alive().then_some(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_seen_as_ours_while_it_runs() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pinned = Pinned::open(child.id() as i32).unwrap();
        let me = std::process::id() as i32;
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(pinned.parent_and_owner(), Some((me, uid)));
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(!pinned.alive());
        assert_eq!(pinned.parent_and_owner(), None);
        pinned.wait_exit();
    }

    #[test]
    fn waiting_for_a_process_returns_only_once_it_ended() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pinned = Pinned::open(child.id() as i32).unwrap();
        let (done, ended) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            pinned.wait_exit();
            done.send(pinned.alive()).unwrap();
        });
        // While it runs, no answer: a watcher that returned now would release its GPUs.
        let early = ended.recv_timeout(std::time::Duration::from_millis(300));
        assert_eq!(early, Err(std::sync::mpsc::RecvTimeoutError::Timeout));
        child.kill().unwrap();
        child.wait().unwrap();
        let alive = ended
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("wait_exit returns once the process ended");
        assert!(!alive);
        waiter.join().unwrap();
    }

    #[test]
    fn the_peer_of_a_socket_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = of(&a).unwrap();
        assert_eq!(peer.pid, std::process::id() as i32);
        assert_eq!(peer.uid, rustix::process::geteuid().as_raw());
    }
}
