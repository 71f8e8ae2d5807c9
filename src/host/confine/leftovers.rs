//! Whether a job's cgroup still has processes in it, and ending them.
//!
//! A job is over when its cgroup is empty, not when its first process exits: a child it
//! started with `setsid` or a double fork keeps running on its GPUs, inside its device
//! cgroup. cgroup2 says so in `cgroup.events` (`populated 0|1`, for the cgroup and every
//! cgroup below it); a cgroup v1 has no such file, and its `cgroup.procs` lists the
//! processes in it.
//!
//! Paths come from the ledger's records (a daemon restarted since the job started knows
//! its cgroups from there), so only directories named `gpupin-<holder>` are read, and
//! every open is no-follow.

use super::ConfineError;
use std::io::{ErrorKind, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Whether `dir` is a job cgroup gpupin made: an absolute path whose last component is
/// `gpupin-<something>`. Anything else a record names is never read, written or removed.
pub(super) fn is_job_cgroup(dir: &Path) -> bool {
    dir.is_absolute()
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("gpupin-") && n.len() > "gpupin-".len())
}

/// Whether any process is in `dir` or below it. A cgroup that is gone is empty; one
/// that cannot be read counts as populated, so that an error never frees GPUs a process
/// may still use.
pub(crate) fn populated(dir: &Path) -> bool {
    if !is_job_cgroup(dir) {
        return false;
    }
    match populated_or_error(dir) {
        Ok(found) => found,
        Err(err) => {
            tracing::warn!(error = %crate::base::message::one_line(&err), "counting the job's cgroup as in use");
            true
        }
    }
}

fn populated_or_error(dir: &Path) -> Result<bool, ConfineError> {
    // cgroup2: exact for the whole subtree, and one small read.
    if let Some(events) = read_if_there(&dir.join("cgroup.events"))? {
        return Ok(events
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["populated", "1"]));
    }
    // v1: the processes of the cgroup and of any cgroup below it (gpupin makes none,
    // but a job of root's could: root owns the cgroup's files).
    let mut found = false;
    for dir in subtree(dir) {
        if let Some(procs) = read_if_there(&dir.join("cgroup.procs"))? {
            found |= !pids(&procs).is_empty();
        }
    }
    // Neither file anywhere: the cgroup is gone (or the path is no cgroup at all).
    Ok(found)
}

/// `dir` and the directories below it, never through a link, at most `MAX_DEPTH` down.
fn subtree(dir: &Path) -> Vec<std::path::PathBuf> {
    const MAX_DEPTH: usize = 16;
    let mut all = vec![dir.to_path_buf()];
    let mut pending = vec![(dir.to_path_buf(), 0usize)];
    while let Some((at, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&at) else {
            continue;
        };
        for entry in entries.flatten() {
            if depth < MAX_DEPTH && entry.file_type().is_ok_and(|t| t.is_dir()) {
                all.push(entry.path());
                pending.push((entry.path(), depth + 1));
            }
        }
    }
    all
}

/// SIGKILL to every process in `dir`. cgroup2's `cgroup.kill` (Linux 5.14) kills the
/// whole subtree at once, forks in flight included; elsewhere each pid `cgroup.procs`
/// lists, which the caller repeats until the cgroup is empty (a process may fork while
/// it is being killed).
///
/// A pid is signalled through a pidfd opened before `cgroup.procs` is read again: a pid
/// listed the second time whose pidfd still refers to a live process is that very
/// process, so a pid reused by someone else's process in between is never signalled.
pub(crate) fn kill(dir: &Path) -> Result<(), ConfineError> {
    if is_job_cgroup(dir) && dir.join("cgroup.kill").exists() {
        return super::dir::write(dir, "cgroup.kill", "1");
    }
    signal(dir, rustix::process::Signal::KILL)
}

/// Sends `sig` to every process the `cgroup.procs` of `dir` and of the cgroups below it
/// list, each through a pidfd (see `kill`).
pub(crate) fn signal(dir: &Path, sig: rustix::process::Signal) -> Result<(), ConfineError> {
    if !is_job_cgroup(dir) {
        return Ok(());
    }
    let mut first = None;
    for cgroup in subtree(dir) {
        if let Err(err) = signal_one(&cgroup, sig) {
            first.get_or_insert(err);
        }
    }
    first.map_or(Ok(()), Err)
}

fn signal_one(dir: &Path, sig: rustix::process::Signal) -> Result<(), ConfineError> {
    let Some(first) = read_if_there(&dir.join("cgroup.procs"))? else {
        return Ok(());
    };
    let pinned: Vec<(i32, std::os::fd::OwnedFd)> = pids(&first)
        .into_iter()
        .filter_map(|pid| {
            let raw = rustix::process::Pid::from_raw(pid)?;
            let fd = rustix::process::pidfd_open(raw, rustix::process::PidfdFlags::empty());
            Some((pid, fd.ok()?))
        })
        .collect();
    let Some(again) = read_if_there(&dir.join("cgroup.procs"))? else {
        return Ok(());
    };
    let still_in = pids(&again);
    for (pid, fd) in pinned.iter().filter(|(pid, _)| still_in.contains(pid)) {
        // ESRCH: it ended on its own meanwhile.
        if let Err(err) = rustix::process::pidfd_send_signal(fd.as_fd(), sig)
            && err != rustix::io::Errno::SRCH
        {
            tracing::warn!(pid, error = %err, "signalling a leftover process of a job");
        }
    }
    Ok(())
}

/// How many processes `dir` itself has (its `cgroup.procs`); 0 when it cannot be read.
pub(super) fn count(dir: &Path) -> usize {
    if !is_job_cgroup(dir) {
        return 0;
    }
    match read_if_there(&dir.join("cgroup.procs")) {
        Ok(Some(text)) => pids(&text).len(),
        _ => 0,
    }
}

/// The processes in `dir` and the cgroups below it, by pid (a cgroup that cannot be read
/// shows none).
pub(super) fn members(dir: &Path) -> Vec<i32> {
    if !is_job_cgroup(dir) {
        return Vec::new();
    }
    let mut all = Vec::new();
    for dir in subtree(dir) {
        if let Ok(Some(procs)) = read_if_there(&dir.join("cgroup.procs")) {
            all.extend(pids(&procs));
        }
    }
    all
}

/// The pids of a `cgroup.procs` text.
fn pids(text: &str) -> Vec<i32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// The text of `path`, `None` when there is no such file; never follows a link.
fn read_if_there(path: &Path) -> Result<Option<String>, ConfineError> {
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(path);
    let mut file = match opened {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(ConfineError::Read {
                path: path.to_owned(),
                source,
            });
        }
    };
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|source| ConfineError::Read {
            path: path.to_owned(),
            source,
        })?;
    Ok(Some(text))
}
