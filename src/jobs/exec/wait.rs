//! The parent of a job: it passes signals on to the job and ends with the job's status.
//!
//! A signal someone sends to `gpupin exec` (kill, a batch system's TERM) is sent on to
//! the job. One the terminal sends (Ctrl-C, a hangup) reaches the whole foreground process
//! group, the job included, by itself: those are not sent again, so a job never sees one
//! Ctrl-C twice. The signals are blocked and taken with sigwaitinfo, which says who sent
//! each.

use std::io;
use std::process::{Child, ExitStatus};

/// Signals passed on to the job.
const FORWARDED: &[libc::c_int] = &[
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGALRM,
    libc::SIGCONT,
];

fn signal_set(with_chld: bool) -> libc::sigset_t {
    // SAFETY: sigemptyset/sigaddset fill the set they are given.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        if with_chld {
            libc::sigaddset(&mut set, libc::SIGCHLD);
        }
        set
    }
}

/// Blocks the forwarded signals and SIGCHLD in this process, so that they wait for
/// `forward_signals_and_wait` instead of ending it. Call before the job is started: a
/// child inherits the mask, and `gpupin exec-gate` clears it before the command.
pub fn block_signals() -> io::Result<()> {
    let set = signal_set(true);
    // SAFETY: a valid set; the old mask is not needed.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Clears the signal mask (the gate, before the command runs).
pub fn unblock_all_signals() -> io::Result<()> {
    // SAFETY: an empty set; the old mask is not needed.
    let rc = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::pthread_sigmask(libc::SIG_SETMASK, &set, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Waits for `child`, sending it the signals this process is sent. `block_signals` must
/// have been called before the child was started.
pub fn forward_signals_and_wait(child: &mut Child) -> io::Result<ExitStatus> {
    let set = signal_set(true);
    let pid = child.id() as libc::pid_t;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(status);
        }
        // SAFETY: a valid set and a siginfo to fill.
        let (sig, info) = unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let sig = libc::sigwaitinfo(&set, &mut info);
            (sig, info)
        };
        if sig < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if sig == libc::SIGCHLD {
            continue;
        }
        // The terminal's signals (si_code SI_KERNEL) reached the job's group already.
        if info.si_code != libc::SI_KERNEL {
            // SAFETY: sending a signal to our own child.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Waits up to `timeout` for one of the forwarded signals (SIGCHLD is let pass); `None`
/// when none came. For `gpupin exec` while it waits for a job's leftovers, which get the
/// signals it is sent: their session is not the terminal's, so nothing else reaches them.
/// `block_signals` must have been called.
pub fn next_signal(timeout: std::time::Duration) -> io::Result<Option<libc::c_int>> {
    let set = signal_set(true);
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let wait = libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid set and timeout; the siginfo is not needed.
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &wait) };
        if sig < 0 {
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EINTR) => continue,
                _ => return Err(err),
            }
        }
        if sig != libc::SIGCHLD {
            return Ok(Some(sig));
        }
    }
}

/// The exit code a shell would give: the job's own, or 128 + the signal that ended it.
pub fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => (128 + sig) as u8,
        (None, None) => 1,
    }
}
