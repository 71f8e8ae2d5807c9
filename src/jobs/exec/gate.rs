//! A job that starts only once its GPUs are recorded under its own pid.
//!
//! The record must name the job's pid before the job runs (a job whose gpupin is killed
//! keeps its GPUs until it ends), and the job must be in its device cgroup before it can
//! open anything. The pid exists only once the child does, so the child is `gpupin` itself
//! (`gpupin exec-gate`), which waits on a pipe: the parent records and confines the pid,
//! then writes one byte, and the child execs the command (same pid, same start time). If
//! the parent goes away first, the pipe closes and the command never runs.
//!
//! (`Command::pre_exec` cannot wait there: `spawn` itself waits until the child has
//! exec'd.)

use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::process::{Child, Command};

/// The option of `gpupin exec-gate` that names the inherited pipe.
pub(super) const GATE_FD_ARG: &str = "--gate-fd";

/// A started child waiting at its gate.
pub struct Gated {
    pub child: Child,
    gate: Option<OwnedFd>,
}

impl Gated {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Lets the child exec the command.
    pub fn open(&mut self) -> io::Result<()> {
        let fd = self
            .gate
            .take()
            .ok_or_else(|| io::Error::other("the gate was opened already"))?;
        let mut pipe = std::fs::File::from(fd);
        pipe.write_all(b"1")
    }

    /// Closes the gate without letting the command run, and reaps the child.
    pub fn abandon(mut self) {
        self.gate = None;
        let _ = self.child.wait();
    }
}

/// Starts `gpupin exec-gate` (`gpupin` is the binary at `program`) for `command` with
/// `env` added to this process's environment. `drop_caps`: the gate drops the capabilities
/// that would let the job leave its confinement (for jobs root starts).
pub fn spawn_gated(
    program: &Path,
    command: &[OsString],
    env: &[(String, String)],
    drop_caps: bool,
) -> io::Result<Gated> {
    let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    // Only the read end crosses into the child; it is closed again before the command.
    rustix::io::fcntl_setfd(&read, rustix::io::FdFlags::empty())?;
    let mut cmd = Command::new(program);
    cmd.arg("exec-gate")
        .arg(GATE_FD_ARG)
        .arg(read.as_raw_fd().to_string());
    if drop_caps {
        cmd.arg("--drop-caps");
    }
    cmd.arg("--").args(command);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn()?;
    drop(read);
    Ok(Gated {
        child,
        gate: Some(write),
    })
}

/// The child's side: waits for the parent's byte on `fd`, then closes it. `false`: the
/// parent went away (or refused), and the command must not run.
pub fn pass_gate(fd: RawFd) -> io::Result<bool> {
    // SAFETY: the fd was inherited for exactly this and is owned by no one else here.
    let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut byte = [0u8; 1];
    loop {
        return match pipe.read(&mut byte) {
            Ok(1) => Ok(byte[0] == b'1'),
            Ok(_) => Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
    }
}
