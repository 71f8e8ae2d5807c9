//! Job cgroups nobody will remove: a `gpupin exec` killed before its job ended, a daemon
//! that died, a crash between confine and the record. `gpupin gc` finds them by name
//! (`gpupin-<holder>`) under every hierarchy jobs are confined in, and removes the empty
//! ones whose holder is gone.

use crate::host::confine::hierarchy::cgroup2_mounts;
use crate::host::container_devices::cgroup::devices_mounts;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A job cgroup younger than this is left alone: confine makes it before it moves the job
/// in, and another ledger's gc (tests, or two configurations on one machine) must not
/// remove it in between.
const YOUNG: Duration = Duration::from_secs(60);

/// How deep below a mount the walk goes: far below any real cgroup tree, a bound all
/// the same.
const MAX_DEPTH: usize = 32;

/// Removes every empty `gpupin-<holder>` cgroup, under the v1 devices and cgroup2 mounts
/// of this machine, whose holder `is_live` says is gone; returns the ones removed.
pub(crate) fn remove_orphans(is_live: &dyn Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mounts: Vec<PathBuf> = devices_mounts(&mountinfo)
        .chain(cgroup2_mounts(&mountinfo))
        .map(|(_, mount)| PathBuf::from(mount))
        .collect();
    let mut removed = Vec::new();
    for mount in mounts {
        remove_under(&mount, is_live, SystemTime::now(), &mut removed);
    }
    removed
}

/// `remove_orphans` under the cgroup tree at `top` (tests use a fake tree), with `now`
/// as the time the age of a cgroup is measured against.
pub(super) fn remove_under(
    top: &Path,
    is_live: &dyn Fn(&str) -> bool,
    now: SystemTime,
    removed: &mut Vec<PathBuf>,
) {
    let mut pending = vec![(top.to_path_buf(), 0usize)];
    while let Some((dir, depth)) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            // Directories only, never through a link (cgroupfs has none; a fake tree may).
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            let name = entry.file_name();
            let holder = name.to_str().and_then(|n| n.strip_prefix("gpupin-"));
            match holder {
                Some(holder) if !holder.is_empty() => {
                    if is_live(holder) || young(&path, now) || super::populated(&path) {
                        continue;
                    }
                    if std::fs::remove_dir(&path).is_ok() {
                        tracing::info!(path = %path.display(), "removed the cgroup of a job that is gone");
                        removed.push(path);
                    }
                }
                _ if depth < MAX_DEPTH => pending.push((path, depth + 1)),
                _ => {}
            }
        }
    }
}

/// Whether `dir` was made (or changed) less than `YOUNG` before `now`.
fn young(dir: &Path, now: SystemTime) -> bool {
    let modified = std::fs::symlink_metadata(dir).and_then(|m| m.modified());
    match modified {
        Ok(at) => now.duration_since(at).map_or(true, |age| age < YOUNG),
        Err(_) => true,
    }
}
