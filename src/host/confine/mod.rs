//! Confinement of a bare-metal job (`gpupin exec`, `gpupin serve`) to its GPUs: a device
//! cgroup of its own in which the machine's other GPUs cannot be opened, so a job that
//! ignores CUDA_VISIBLE_DEVICES still cannot open another holder's `/dev/nvidia<minor>`.
//!
//! Two mechanisms, used side by side where both exist (on a hybrid host the kernel asks
//! cgroup2's device programs first, then the v1 controller, and both must allow):
//! - `v1`: the cgroup v1 `devices` controller (`v1.rs`);
//! - `bpf`: a BPF_PROG_TYPE_CGROUP_DEVICE program on a cgroup2 node (`bpf.rs`).
//!
//! Both are deny-lists: the job keeps whatever its parent cgroup let it open (the
//! control nodes, /dev/null, ...) less the other GPUs' nodes.

mod bpf;
mod capabilities;
mod dir;
mod errors;
pub(crate) mod hierarchy;
mod leftovers;
mod orphans;
mod v1;

#[cfg(test)]
mod tests;

pub use capabilities::{drop_job_caps, require_caps};
pub(crate) use errors::ConfineError;
pub(crate) use leftovers::{kill, populated, signal};
pub(crate) use orphans::remove_orphans;

use std::fmt;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};

/// Config key `confine`: true (= Auto), false (= Off), "auto", "v1", "v2".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Confine {
    Off,
    /// Every mechanism this machine has; an error where it has none.
    Auto,
    /// The cgroup v1 devices controller only.
    V1,
    /// A BPF device program on a cgroup2 hierarchy only (pure v2 or the hybrid's unified).
    V2,
}

impl Confine {
    pub const EXPECTED: &'static str = "expected true, false, \"auto\", \"v1\" or \"v2\"";
}

impl From<bool> for Confine {
    fn from(on: bool) -> Self {
        if on { Confine::Auto } else { Confine::Off }
    }
}

impl std::str::FromStr for Confine {
    type Err = ConfineError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "auto" | "true" => Ok(Confine::Auto),
            "false" => Ok(Confine::Off),
            "v1" => Ok(Confine::V1),
            "v2" => Ok(Confine::V2),
            _ => Err(ConfineError::InvalidMode {
                value: value.to_owned(),
            }),
        }
    }
}

impl fmt::Display for Confine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Confine::Off => "false",
            Confine::Auto => "auto",
            Confine::V1 => "v1",
            Confine::V2 => "v2",
        })
    }
}

/// Which NVIDIA GPU nodes a job may NOT open: every GPU of the machine but its own, and
/// every MIG capability node but those of its own instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceRules {
    pub gpu_major: u32,
    pub denied_minors: Vec<u32>,
    /// Major of `/dev/nvidia-caps/nvidia-cap<N>` (`nvidia-caps`); 0 with no denied caps.
    pub caps_major: u32,
    /// Capability minors of the MIG instances the job does not hold.
    pub denied_caps: Vec<u32>,
}

impl DeviceRules {
    /// The rules denying the GPU nodes `minors` (a job's: `exec::denied_minors`).
    pub(crate) fn deny(gpu_major: u32, minors: impl IntoIterator<Item = u32>) -> Self {
        let mut denied_minors: Vec<u32> = minors.into_iter().collect();
        denied_minors.sort_unstable();
        denied_minors.dedup();
        DeviceRules {
            gpu_major,
            denied_minors,
            caps_major: 0,
            denied_caps: Vec::new(),
        }
    }

    /// These rules, also denying the MIG capability nodes `minors` of major `caps_major`.
    pub(crate) fn with_caps(
        mut self,
        caps_major: u32,
        minors: impl IntoIterator<Item = u32>,
    ) -> Self {
        let mut denied: Vec<u32> = minors.into_iter().collect();
        denied.sort_unstable();
        denied.dedup();
        self.caps_major = caps_major;
        self.denied_caps = denied;
        self
    }

    /// Every denied node as (major, minor): the GPUs', then the capability nodes'.
    fn denied_nodes(&self) -> Vec<(u32, u32)> {
        let gpus = self.denied_minors.iter().map(|&m| (self.gpu_major, m));
        let caps = self.denied_caps.iter().map(|&m| (self.caps_major, m));
        gpus.chain(caps).collect()
    }

    fn denies(&self, minor: u32) -> bool {
        self.denied_minors.contains(&minor)
    }
}

/// How a job's cgroup keeps it from the other GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    /// Deny entries in the cgroup v1 devices controller.
    V1Devices,
    /// A BPF device program attached to a cgroup2 node.
    Bpf,
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mechanism::V1Devices => "cgroup v1 devices controller",
            Mechanism::Bpf => "cgroup2 BPF device program",
        })
    }
}

/// The cgroup(s) a job was put in, one per mechanism; `remove` rmdirs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCgroup {
    dirs: Vec<PathBuf>,
    mechanisms: Vec<Mechanism>,
}

impl JobCgroup {
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// The mechanism of each of `dirs`, in the same order.
    pub fn mechanisms(&self) -> &[Mechanism] {
        &self.mechanisms
    }

    /// The cgroups a ledger record names (`Record::cgroups`), for a job that another
    /// process confined (a daemon before this one). Directories not named `gpupin-*` are
    /// left out: a record names nothing else. The mechanism is told by the files there:
    /// only cgroup2 has `cgroup.events`.
    pub fn recorded(dirs: &[PathBuf]) -> Option<JobCgroup> {
        let dirs: Vec<PathBuf> = dirs
            .iter()
            .filter(|d| leftovers::is_job_cgroup(d))
            .cloned()
            .collect();
        let mechanisms = dirs
            .iter()
            .map(|d| match d.join("cgroup.events").exists() {
                true => Mechanism::Bpf,
                false => Mechanism::V1Devices,
            })
            .collect();
        (!dirs.is_empty()).then_some(JobCgroup { dirs, mechanisms })
    }

    /// Whether a process is still in any of the cgroups: the job is not over yet.
    pub fn populated(&self) -> bool {
        self.dirs.iter().any(|d| leftovers::populated(d))
    }

    /// SIGKILL to every process still in the cgroups (see `leftovers::kill`); the caller
    /// checks `populated` again later, and kills again while it is.
    pub fn kill(&self) -> Result<(), ConfineError> {
        let mut first = None;
        for dir in &self.dirs {
            if let Err(err) = leftovers::kill(dir) {
                first.get_or_insert(err);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Sends `sig` to every process still in the cgroups (the signals someone sends
    /// `gpupin exec` while it waits for a job's leftovers).
    pub fn signal(&self, sig: rustix::process::Signal) {
        for dir in &self.dirs {
            if let Err(err) = leftovers::signal(dir, sig) {
                tracing::info!(error = %crate::base::message::one_line(&err), "signalling a job's leftovers");
            }
        }
    }

    /// How many processes are in the cgroups (the largest count of any one of them; the
    /// same processes are in each), for messages.
    pub fn count(&self) -> usize {
        self.dirs
            .iter()
            .map(|d| leftovers::count(d))
            .max()
            .unwrap_or(0)
    }

    /// The processes in the cgroups, by pid, each once, in order (what status names as a
    /// job's leftovers once its main process has exited).
    pub fn members(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self
            .dirs
            .iter()
            .flat_map(|d| leftovers::members(d))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Removes every cgroup, best effort: the kernel refuses (EBUSY) while a process is
    /// still in one (a daemon the job left behind); the others are removed anyway and the
    /// first failure is returned. A cgroup already gone is no error.
    pub fn remove(&self) -> Result<(), ConfineError> {
        remove_dirs(&self.dirs)
    }
}

/// Removes the job cgroups `dirs` (as a record names them), best effort as
/// `JobCgroup::remove`; directories not named `gpupin-*` are never touched.
pub(crate) fn remove_dirs(dirs: &[PathBuf]) -> Result<(), ConfineError> {
    let mut first = None;
    for dir in dirs.iter().filter(|d| leftovers::is_job_cgroup(d)) {
        if let Err(err) = dir::remove(dir) {
            first.get_or_insert(err);
        }
    }
    first.map_or(Ok(()), Err)
}

/// Creates a cgroup named `gpupin-<name>` as a child of `pid`'s current cgroup in each
/// hierarchy the mode uses, applies `rules`, then moves `pid` into it (cgroup.procs).
/// `Off` -> Ok(None). `Auto` uses every mechanism the machine has and fails when it has
/// neither. A leftover cgroup of the same name is removed and made anew when empty (its
/// old rules or programs must not stay), and is an error while processes are in it.
///
/// Refuses a parent cgroup that a user other than root owns (a systemd delegation): that
/// user could move the job back out of its device cgroup.
///
/// `pidfd` pins the process `pid` was checked to be: cgroupfs takes a bare pid, so the
/// pidfd is checked before the pid is written and again after. Alive after the write, the
/// pid named that process when it was written (a pid is not reused while its process
/// lives); gone, the pid may have been another process's by then (`ConfineError::Gone`).
///
/// On error `pid` is back in its former cgroups where it had been moved (except after
/// `Gone`: see above), the cgroups made are removed where they are empty, and the caller
/// must not let the job run.
pub(crate) fn confine(
    pid: i32,
    pidfd: BorrowedFd<'_>,
    name: &str,
    mode: Confine,
    rules: &DeviceRules,
) -> Result<Option<JobCgroup>, ConfineError> {
    confine_in(Path::new("/proc"), pid, pidfd, name, mode, rules)
}

/// The cgroup directory process `pid` is in, for a per-cgroup limit set from outside (a
/// container's memory limit on its GPUs): its cgroup2 one where the host mounts cgroup2,
/// else its v1 devices one.
pub(crate) fn cgroup_dir_of(pid: i32) -> Result<PathBuf, ConfineError> {
    let parents = hierarchy::parents(Path::new("/proc"), pid, Confine::Auto)?;
    parents
        .iter()
        .find(|p| p.mechanism == Mechanism::Bpf)
        .or_else(|| parents.first())
        .map(|p| p.dir.clone())
        .ok_or(ConfineError::NoMechanism { pid })
}

/// Whether the process a pidfd refers to still runs (its pidfd is not readable yet).
pub(crate) fn pidfd_alive(pidfd: BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let zero = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(0))
}

fn confine_in(
    proc_root: &Path,
    pid: i32,
    pidfd: BorrowedFd<'_>,
    name: &str,
    mode: Confine,
    rules: &DeviceRules,
) -> Result<Option<JobCgroup>, ConfineError> {
    if mode == Confine::Off {
        return Ok(None);
    }
    let leaf = dir::leaf_name(name)?;
    let parents = hierarchy::parents(proc_root, pid, mode)?;
    // (mechanism, parent dir, job dir) of each cgroup made so far, for `undo`.
    let mut made: Vec<(Mechanism, PathBuf, PathBuf)> = Vec::new();
    let outcome = (|| {
        for parent in &parents {
            hierarchy::refuse_delegated(parent)?;
            let dir = dir::create(&parent.dir, &leaf)?;
            made.push((parent.mechanism, parent.dir.clone(), dir.clone()));
            match parent.mechanism {
                Mechanism::V1Devices => v1::apply(&dir, rules)?,
                Mechanism::Bpf => bpf::attach(&dir, rules)?,
            }
        }
        // Moved only once every cgroup has its rules: the job is never in a cgroup
        // that does not confine it yet.
        for (_, _, dir) in &made {
            if !pidfd_alive(pidfd) {
                return Err(ConfineError::Gone { pid });
            }
            dir::move_pid(dir, pid)?;
        }
        Ok(())
    })();
    let outcome = outcome.and_then(|()| match pidfd_alive(pidfd) {
        true => Ok(()),
        // Whatever the pid names now is not the job: it is not moved back out of its
        // device cgroup into the job's parent's (that could free a process of someone
        // else's from a cgroup that confined it). The cgroups stay until they are empty
        // (`gpupin gc` removes them then).
        false => Err(ConfineError::Gone { pid }),
    });
    if let Err(err) = outcome {
        match err {
            ConfineError::Gone { .. } => {
                for (_, _, dir) in &made {
                    let _ = dir::remove(dir);
                }
            }
            _ => undo(pid, &made),
        }
        return Err(err);
    }
    tracing::debug!(pid, ?made, "confined to its GPUs");
    let (mechanisms, dirs) = made.into_iter().map(|(m, _, d)| (m, d)).unzip();
    Ok(Some(JobCgroup { dirs, mechanisms }))
}

/// Best effort after a failure: `pid` back into each parent, then the new cgroups gone.
fn undo(pid: i32, made: &[(Mechanism, PathBuf, PathBuf)]) {
    for (_, parent, dir) in made {
        let _ = dir::move_pid(parent, pid);
        if let Err(err) = dir::remove(dir) {
            tracing::warn!(error = %err, "leaving a job cgroup behind after a failure");
        }
    }
}
