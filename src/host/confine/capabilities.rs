//! The capabilities confinement needs, and the ones a confined job must not keep.

use super::ConfineError;
use caps::{CapSet, Capability};
use std::io;

/// Checks that this process can confine a job: CAP_SYS_ADMIN (writing devices.deny, and
/// loading and attaching a BPF device program) and, unless it runs as uid 0 and so owns
/// the cgroup files, CAP_DAC_OVERRIDE to write them.
pub fn require_caps() -> Result<(), ConfineError> {
    let mut needed = vec![(Capability::CAP_SYS_ADMIN, "CAP_SYS_ADMIN")];
    if !rustix::process::geteuid().is_root() {
        needed.push((Capability::CAP_DAC_OVERRIDE, "CAP_DAC_OVERRIDE"));
    }
    for (cap, name) in needed {
        let has = caps::has_cap(None, CapSet::Effective, cap)
            .map_err(|source| ConfineError::ReadCaps { source })?;
        if !has {
            return Err(ConfineError::MissingCap { cap: name });
        }
    }
    Ok(())
}

/// For a job started by a root gpupin, in the child between fork and exec: drops
/// CAP_SYS_ADMIN and CAP_MKNOD from the bounding, inheritable, effective and permitted
/// sets (and so from the ambient one) of the calling thread, the child's only one. The
/// job can then neither mknod a node its rules do not name, nor write devices.allow (the
/// kernel asks CAP_SYS_ADMIN for that), nor regain either through a setuid binary or
/// file capabilities.
///
/// What it does not stop: a job that runs as uid 0 still owns the cgroup files, and can
/// write its pid into an ancestor's cgroup.procs (moving a process needs write access to
/// that file, no capability) and so leave its device cgroup; it also keeps root's other
/// capabilities (CAP_BPF, CAP_NET_ADMIN, CAP_DAC_OVERRIDE, ...). Confinement fences in a
/// job and its children; it is no boundary between users (the same user's processes
/// outside the job open the nodes as their modes allow): for every job it guards
/// against mistakes, not against a user who means to take a GPU.
///
/// Allocation-light rather than allocation-free: each set is read and written once, and
/// the caps crate builds a small set for that (glibc's malloc is safe after fork).
/// Dropping from the bounding set needs CAP_SETPCAP: a process without it, whose bounding
/// set still has these capabilities, fails with EPERM.
pub fn drop_job_caps() -> io::Result<()> {
    const DROPPED: [Capability; 2] = [Capability::CAP_SYS_ADMIN, Capability::CAP_MKNOD];
    for cap in DROPPED {
        if caps::has_cap(None, CapSet::Bounding, cap).map_err(io::Error::other)? {
            caps::drop(None, CapSet::Bounding, cap).map_err(io::Error::other)?;
        }
    }
    // Effective before permitted: capset(2) refuses an effective set larger than the
    // permitted one.
    for set in [CapSet::Inheritable, CapSet::Effective, CapSet::Permitted] {
        let mut held = caps::read(None, set).map_err(io::Error::other)?;
        let before = held.len();
        held.retain(|cap| !DROPPED.contains(cap));
        if held.len() != before {
            caps::set(None, set, &held).map_err(io::Error::other)?;
        }
    }
    Ok(())
}
