//! The prestart-only path: give a running-but-not-started container its GPUs from the
//! outside, by creating device nodes inside its mount namespace and granting access in its
//! device cgroup. Used by `gpupin hook prestart|createRuntime` under plain runc, where the
//! spec can no longer be edited.

// pub(crate): confine/ finds its cgroups with the same mountinfo readers.
pub(crate) mod cgroup;
mod mntns;
mod nodes;
mod paths;

use crate::model::gpu::DeviceNode;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    #[error("invalid device node path {path:?}: {reason}")]
    InvalidNodePath { path: String, reason: &'static str },
    #[error("rootfs {path} is not an absolute path")]
    RelativeRootfs { path: PathBuf },
    #[error("opening mount namespace {path}")]
    OpenNamespace {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "pid {pid} shares gpupin's own mount namespace, so it is no container's init; refusing to create device nodes on the host"
    )]
    HostNamespace { pid: i32 },
    #[error(
        "cannot enter the mount namespace of pid {pid}: setns(CLONE_NEWNS) needs a single-threaded process"
    )]
    MultiThreaded {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("entering the mount namespace of pid {pid}")]
    EnterNamespace {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("returning from the mount namespace of pid {pid} to our own")]
    RestoreNamespace {
        pid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("rootfs {path} is the host's root directory; refusing to create device nodes")]
    HostRoot { path: PathBuf },
    #[error("opening container rootfs {path}")]
    OpenRootfs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("container {container_path} at {path} is a symlink; refusing to create device nodes")]
    Symlink {
        container_path: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening container directory {container_path} at {path}")]
    OpenDir {
        container_path: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating device node {path}")]
    Mknod {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checking existing {path}")]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} already exists as {found}, not char device {major}:{minor}; refusing to replace it"
    )]
    NodeConflict {
        path: PathBuf,
        found: String,
        major: u32,
        minor: u32,
    },
    #[error("reading {path}")]
    ReadProc {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "pid {pid} has no cgroup v1 devices controller: cgroup v2 device control is not supported on the prestart path yet; use the gpupin-runtime shim or the podman precreate hook"
    )]
    CgroupV2Only { pid: i32 },
    #[error(
        "devices cgroup {cgroup} of pid {pid} is not under any devices hierarchy mount in {mountinfo}"
    )]
    CgroupNotMounted {
        pid: i32,
        cgroup: String,
        mountinfo: PathBuf,
    },
    #[error("opening device cgroup file {path}")]
    OpenCgroup {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {rule:?} to {path}")]
    WriteCgroup {
        path: PathBuf,
        rule: String,
        #[source]
        source: std::io::Error,
    },
}

/// Creates `nodes` under the container's /dev, inside the mount namespace of `pid`, with
/// `rootfs` the host path of the container's root (before pivot_root). Never follows a
/// symlink: a /dev or node path that is a symlink is an error.
///
/// Must be called from a single-threaded process (the hook is one): setns(CLONE_NEWNS)
/// fails with EINVAL when the caller shares its fs_struct with another thread, and that
/// is reported as [`InjectError::MultiThreaded`] with nothing done.
pub(crate) fn create_nodes_in_container(
    pid: i32,
    rootfs: &Path,
    nodes: &[DeviceNode],
) -> Result<(), InjectError> {
    // Validate everything before entering the namespace or creating anything.
    let paths = paths::validate_all(nodes)?;
    // After setns the cwd is the namespace root, so a relative path would resolve
    // somewhere else; spec::rootfs_path already joins it to the bundle.
    if !rootfs.is_absolute() {
        return Err(InjectError::RelativeRootfs {
            path: rootfs.to_owned(),
        });
    }
    mntns::with_mount_namespace(pid, || {
        // umask lives in the fs_struct, which a successful setns(CLONE_NEWNS) proved is
        // ours alone, so clearing it here is invisible to anyone else. runc does the same
        // around mknod (libcontainer/rootfs_linux.go createDevices: Umask(0)).
        let _umask = nodes::UmaskGuard::clear();
        let root = nodes::open_rootfs(rootfs)?;
        nodes::create_beneath(&root, rootfs, &paths)
    })
}

/// Grants read/write/mknod access to `nodes` in the device cgroup of `pid`
/// (cgroup v1; on a v2-only host this fails closed).
pub(crate) fn allow_in_device_cgroup(pid: i32, nodes: &[DeviceNode]) -> Result<(), InjectError> {
    cgroup::allow(Path::new("/proc"), pid, nodes)
}

/// The capability this process lacks for injecting at prestart, if any: entering the
/// container's mount namespace needs CAP_SYS_ADMIN, making its device nodes CAP_MKNOD.
/// Asked before anything is allocated, so that a hook run without them (a runtime that
/// drops capabilities from its hooks) fails with one clear line, not halfway.
pub(crate) fn missing_capability() -> Option<&'static str> {
    use caps::{CapSet, Capability};
    [
        (Capability::CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (Capability::CAP_MKNOD, "CAP_MKNOD"),
    ]
    .into_iter()
    .find(|(cap, _)| !caps::has_cap(None, CapSet::Effective, *cap).unwrap_or(false))
    .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    use std::process::{Child, Command};
    use std::time::{Duration, Instant};

    fn gpu_nodes() -> Vec<DeviceNode> {
        [("/dev/nvidia0", 0), ("/dev/nvidia-caps/nvidia-cap1", 1)]
            .map(|(path, minor)| DeviceNode {
                path: path.to_owned(),
                major: 195,
                minor,
            })
            .to_vec()
    }

    /// A stand-in for runc init before pivot_root: a process in its own mount namespace
    /// with a tmpfs on <rootfs>/dev that the host does not see.
    fn spawn_container(rootfs: &Path) -> Option<Child> {
        let script = "mount -t tmpfs tmpfs \"$0/dev\" && exec sleep 30";
        let child = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", script])
            .arg(rootfs)
            .spawn()
            .ok()?;
        let mountinfo = format!("/proc/{}/mountinfo", child.id());
        let dev = format!(" {}/dev ", rootfs.display());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if fs::read_to_string(&mountinfo).is_ok_and(|m| m.contains(&dev)) {
                return Some(child);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Runs `work` in a forked, hence single-threaded, child (the test harness has many
    /// threads, so setns(CLONE_NEWNS) cannot run in it); `work`'s error text goes to
    /// `report`. Returns whether the child succeeded.
    fn in_forked_child(report: &Path, work: impl FnOnce() -> Result<(), String>) -> bool {
        // SAFETY: the child only runs `work` (allocation and syscalls; glibc's malloc is
        // fork-safe) and leaves with _exit, never returning into the harness.
        match unsafe { libc::fork() } {
            -1 => false,
            0 => {
                let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                let code = match outcome {
                    Ok(Ok(())) => 0,
                    Ok(Err(msg)) => {
                        let _ = fs::write(report, msg);
                        1
                    }
                    Err(_) => 2,
                };
                // SAFETY: ends the child without running the harness's exit handlers.
                unsafe { libc::_exit(code) }
            }
            child => {
                let mut status = 0;
                // SAFETY: waits for our own child with a valid status pointer.
                let waited = unsafe { libc::waitpid(child, &mut status, 0) };
                waited == child && libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
            }
        }
    }

    /// The child's work: inject, then check that namespace and cwd came back.
    fn inject_and_check_return(pid: i32, rootfs: &Path) -> Result<(), String> {
        let ns = || fs::read_link("/proc/self/ns/mnt").map_err(|e| e.to_string());
        let (ns_before, cwd_before) = (ns()?, std::env::current_dir().ok());
        create_nodes_in_container(pid, rootfs, &gpu_nodes()).map_err(|e| format!("{e:?}"))?;
        if ns()? != ns_before || std::env::current_dir().ok() != cwd_before {
            return Err("mount namespace or cwd not restored".to_owned());
        }
        Ok(())
    }

    #[test]
    fn nodes_land_in_the_container_mount_namespace_only() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path().join("rootfs");
        fs::create_dir_all(rootfs.join("dev")).unwrap();
        let Some(mut container) = spawn_container(&rootfs) else {
            return; // no unshare(1) or no mount permission here
        };
        let pid = container.id() as i32;
        let report = tmp.path().join("report");
        let ok = in_forked_child(&report, || inject_and_check_return(pid, &rootfs));
        let seen_inside = format!("/proc/{pid}/root{}/dev/nvidia0", rootfs.display());
        let inside = fs::symlink_metadata(&seen_inside);
        let host_dev_entries = fs::read_dir(rootfs.join("dev")).unwrap().count();
        // Called from this multi-threaded harness, setns must refuse cleanly.
        let threaded = create_nodes_in_container(pid, &rootfs, &gpu_nodes());
        let _ = container.kill();
        let _ = container.wait();

        assert!(ok, "child failed: {:?}", fs::read_to_string(&report));
        let inside = inside.unwrap();
        assert!(inside.file_type().is_char_device());
        assert_eq!(inside.rdev(), rustix::fs::makedev(195, 0));
        assert_eq!(inside.mode() & 0o777, 0o666, "umask must not apply");
        assert_eq!(
            host_dev_entries, 0,
            "nothing may be created in the host view"
        );
        let err = threaded.unwrap_err();
        assert!(matches!(err, InjectError::MultiThreaded { .. }), "{err}");
    }

    #[test]
    fn a_pid_in_our_own_mount_namespace_is_refused_and_nothing_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir(tmp.path().join("dev")).unwrap();
        let me = std::process::id() as i32;
        let err = create_nodes_in_container(me, tmp.path(), &gpu_nodes()).unwrap_err();
        assert!(matches!(err, InjectError::HostNamespace { .. }), "{err}");
        assert_eq!(fs::read_dir(tmp.path().join("dev")).unwrap().count(), 0);
    }

    #[test]
    fn relative_rootfs_and_bad_paths_fail_before_setns() {
        let err = create_nodes_in_container(1, Path::new("rootfs"), &gpu_nodes()).unwrap_err();
        assert!(matches!(err, InjectError::RelativeRootfs { .. }), "{err}");
        let bad = [DeviceNode {
            path: "/etc/shadow".to_owned(),
            major: 1,
            minor: 3,
        }];
        let err = create_nodes_in_container(1, Path::new("/"), &bad).unwrap_err();
        assert!(matches!(err, InjectError::InvalidNodePath { .. }), "{err}");
    }
}
