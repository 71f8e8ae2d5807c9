//! The daemon's signals, taken by one thread with sigwaitinfo (blocked in every other
//! thread): SIGHUP re-reads the config (the usual reload signal; without this it ended
//! the daemon and left its socket behind), SIGTERM and SIGINT stop it cleanly.

use std::io;

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Asked {
    Reload,
    Stop,
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset fill the set they are given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGHUP, libc::SIGTERM, libc::SIGINT] {
            libc::sigaddset(&mut set, sig);
        }
        set
    }
}

/// Blocks the daemon's signals in this thread and every thread it starts afterwards, so
/// that only `wait` takes them. Call before any thread is started.
pub(super) fn block() -> io::Result<()> {
    let set = signal_set();
    // SAFETY: a valid set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for the next of the daemon's signals.
pub(super) fn wait() -> io::Result<Asked> {
    let set = signal_set();
    loop {
        // SAFETY: a valid set and a siginfo to fill.
        let sig = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::sigwaitinfo(&set, &mut info)
        };
        match sig {
            libc::SIGHUP => return Ok(Asked::Reload),
            libc::SIGTERM | libc::SIGINT => return Ok(Asked::Stop),
            _ => {
                let err = io::Error::last_os_error();
                if err.kind() != io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
        }
    }
}
