//! Running work inside another process's mount namespace and always coming back.
//!
//! At prestart/createRuntime, runc's init has mounted the container's /dev tmpfs at
//! `<rootfs>/dev` in the container's mount namespace but not yet pivoted; the hook runs in
//! the host namespaces, where that tmpfs is invisible. So the hook enters the container's
//! mount namespace for the duration of the work.

use super::InjectError;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// Runs `work` in the mount namespace of `pid`, then returns to our own namespace and
/// working directory, whatever `work` returned. A failure to return wins over the work's
/// result: the caller must not carry on in the container's namespace.
///
/// setns(CLONE_NEWNS) requires that no other thread shares our fs_struct (kernel
/// fs/namespace.c mntns_install: `fs->users != 1` gives EINVAL), i.e. a single-threaded
/// caller; it also resets root and cwd to the new namespace's root, hence the saved cwd.
pub(super) fn with_mount_namespace<T>(
    pid: i32,
    work: impl FnOnce() -> Result<T, InjectError>,
) -> Result<T, InjectError> {
    let own = open_ns(Path::new("/proc/self/ns/mnt"))?;
    let target = open_ns(&PathBuf::from(format!("/proc/{pid}/ns/mnt")))?;
    if same_namespace(&own, &target, pid)? {
        // A container's init at prestart always has a mount namespace of its own; a pid
        // in ours is a host process, and nodes made "inside" it would appear on the host.
        return Err(InjectError::HostNamespace { pid });
    }
    let cwd = rustix::fs::open(
        ".",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok();
    enter(&target, pid)?;
    let result = work();
    move_into_link_name_space(own.as_fd(), Some(LinkNameSpaceType::Mount)).map_err(|e| {
        InjectError::RestoreNamespace {
            pid,
            source: e.into(),
        }
    })?;
    if let Some(cwd) = cwd {
        // Best effort: the cwd only matters to relative paths the caller may still use,
        // and the namespace itself is already restored.
        let _ = rustix::process::fchdir(&cwd);
    }
    result
}

/// Namespaces are the same when their nsfs inodes are (namespaces(7)).
fn same_namespace(own: &OwnedFd, target: &OwnedFd, pid: i32) -> Result<bool, InjectError> {
    let stat = |fd: &OwnedFd| {
        rustix::fs::fstat(fd).map_err(|e| InjectError::OpenNamespace {
            path: PathBuf::from(format!("/proc/{pid}/ns/mnt")),
            source: e.into(),
        })
    };
    let (a, b) = (stat(own)?, stat(target)?);
    Ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino)
}

fn open_ns(path: &Path) -> Result<OwnedFd, InjectError> {
    rustix::fs::open(path, OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| {
        InjectError::OpenNamespace {
            path: path.to_owned(),
            source: e.into(),
        }
    })
}

/// setns, with the kernel checking that the fd is a mount namespace. EINVAL from a
/// `/proc/<pid>/ns/mnt` fd can then only mean another thread shares our fs_struct.
fn enter(target: &OwnedFd, pid: i32) -> Result<(), InjectError> {
    move_into_link_name_space(target.as_fd(), Some(LinkNameSpaceType::Mount)).map_err(|e| {
        if e == Errno::INVAL {
            InjectError::MultiThreaded {
                pid,
                source: e.into(),
            }
        } else {
            InjectError::EnterNamespace {
                pid,
                source: e.into(),
            }
        }
    })
}
