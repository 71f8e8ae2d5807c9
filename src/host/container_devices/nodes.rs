//! Device node creation beneath an already-open container rootfs, one path component at
//! a time and never through a symlink: the rootfs is the container image's, and a
//! planted `/dev -> /etc` or `/dev/nvidia0 -> /etc/shadow` must not make a root hook
//! write on the host (the class of bug behind runc CVE-2019-19921 and CVE-2021-30465).

use super::InjectError;
use super::paths::NodePath;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

/// openat2 resolution for every step: stay beneath the directory fd, and fail with ELOOP
/// on any symlink, including the last component (openat2(2), without O_NOFOLLOW).
const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
/// O_PATH directory fds: enough as dirfd for mkdirat/mknodat/fstatat, and opening one
/// never runs anything on the target.
const DIR_FLAGS: OFlags = OFlags::PATH.union(OFlags::DIRECTORY).union(OFlags::CLOEXEC);
const NODE_MODE: u32 = 0o666;
const DIR_MODE: u32 = 0o755;

/// Clears the process umask until dropped, so nodes get exactly [`NODE_MODE`] from
/// mknodat itself: mknod never follows a symlink, whereas a later fchmodat would (and
/// fchmod does not work on an O_PATH fd). Only sound in a single-threaded process.
pub(super) struct UmaskGuard(Mode);

impl UmaskGuard {
    pub(super) fn clear() -> UmaskGuard {
        UmaskGuard(rustix::process::umask(Mode::empty()))
    }
}

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        rustix::process::umask(self.0);
    }
}

/// Opens the container rootfs as a directory. Its path comes from the bundle, written by
/// the runtime's caller, so it is resolved like the runtime itself resolves it.
pub(super) fn open_rootfs(rootfs: &Path) -> Result<OwnedFd, InjectError> {
    let open_err = |e: rustix::io::Errno| InjectError::OpenRootfs {
        path: rootfs.to_owned(),
        source: e.into(),
    };
    let root = rustix::fs::open(rootfs, DIR_FLAGS, Mode::empty()).map_err(open_err)?;
    // Before pivot_root the namespace's / is the host's root, whose /dev is the host's
    // devtmpfs: a rootfs that resolves there would put GPU nodes on the host.
    let (ours, slash) = (
        rustix::fs::fstat(&root).map_err(open_err)?,
        rustix::fs::stat("/").map_err(open_err)?,
    );
    if (ours.st_dev, ours.st_ino) == (slash.st_dev, slash.st_ino) {
        return Err(InjectError::HostRoot {
            path: rootfs.to_owned(),
        });
    }
    Ok(root)
}

/// Creates every node beneath `root` (an open rootfs whose host path is `rootfs`, for
/// messages). /dev itself must exist: runc mounts a tmpfs there before prestart.
pub(super) fn create_beneath(
    root: impl AsFd,
    rootfs: &Path,
    nodes: &[NodePath<'_>],
) -> Result<(), InjectError> {
    let dev = open_dir(root, "dev", "/dev", rootfs, false)?;
    for node in nodes {
        let dir = open_parent(&dev, rootfs, node)?;
        make_node(&dir, rootfs, node)?;
    }
    Ok(())
}

/// Opens (creating as needed) the directories between /dev and the node.
fn open_parent(dev: &OwnedFd, rootfs: &Path, node: &NodePath<'_>) -> Result<OwnedFd, InjectError> {
    let mut dir = dev.try_clone().map_err(|source| InjectError::OpenDir {
        container_path: "/dev".to_owned(),
        path: rootfs.join("dev"),
        source,
    })?;
    let mut container_path = String::from("/dev");
    for name in &node.dirs {
        container_path = format!("{container_path}/{name}");
        dir = open_dir(&dir, name, &container_path, rootfs, true)?;
    }
    Ok(dir)
}

/// Opens the single component `name` beneath `parent` as a directory, refusing symlinks;
/// with `create`, makes it first when missing (mkdirat never follows a symlink either).
fn open_dir(
    parent: impl AsFd,
    name: &str,
    container_path: &str,
    rootfs: &Path,
    create: bool,
) -> Result<OwnedFd, InjectError> {
    let open = || rustix::fs::openat2(&parent, name, DIR_FLAGS, Mode::empty(), RESOLVE);
    let result = match open() {
        Err(Errno::NOENT) if create => {
            match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(DIR_MODE)) {
                // EEXIST: made concurrently; the reopen below checks what it is.
                Ok(()) | Err(Errno::EXIST) => open(),
                Err(e) => Err(e),
            }
        }
        other => other,
    };
    result.map_err(|e| dir_error(e, container_path, rootfs))
}

fn dir_error(err: Errno, container_path: &str, rootfs: &Path) -> InjectError {
    let path = host_path(rootfs, container_path);
    let container_path = container_path.to_owned();
    if err == Errno::LOOP {
        InjectError::Symlink {
            container_path,
            path,
            source: err.into(),
        }
    } else {
        InjectError::OpenDir {
            container_path,
            path,
            source: err.into(),
        }
    }
}

/// mknodat the node; an existing entry is fine only when it is already the same char
/// device (a retried hook), anything else is left alone and reported.
fn make_node(dir: &OwnedFd, rootfs: &Path, node: &NodePath<'_>) -> Result<(), InjectError> {
    let dev = rustix::fs::makedev(node.major, node.minor);
    let mode = Mode::from_raw_mode(NODE_MODE);
    match rustix::fs::mknodat(dir, node.name, FileType::CharacterDevice, mode, dev) {
        Ok(()) => Ok(()),
        Err(Errno::EXIST) => check_existing(dir, rootfs, node, dev),
        Err(e) => Err(InjectError::Mknod {
            path: host_path(rootfs, node.container_path),
            source: e.into(),
        }),
    }
}

fn check_existing(
    dir: &OwnedFd,
    rootfs: &Path,
    node: &NodePath<'_>,
    dev: u64,
) -> Result<(), InjectError> {
    let path = host_path(rootfs, node.container_path);
    let stat = rustix::fs::statat(dir, node.name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| {
        InjectError::Stat {
            path: path.clone(),
            source: e.into(),
        }
    })?;
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind == FileType::CharacterDevice && stat.st_rdev == dev {
        return Ok(());
    }
    Err(InjectError::NodeConflict {
        path,
        found: describe(kind, stat.st_rdev),
        major: node.major,
        minor: node.minor,
    })
}

fn describe(kind: FileType, rdev: u64) -> String {
    let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    match kind {
        FileType::CharacterDevice => format!("char device {major}:{minor}"),
        FileType::BlockDevice => format!("block device {major}:{minor}"),
        FileType::Symlink => "a symlink".to_owned(),
        FileType::Directory => "a directory".to_owned(),
        FileType::RegularFile => "a regular file".to_owned(),
        _ => "a special file".to_owned(),
    }
}

/// The host path of a container path, for messages only (never opened).
fn host_path(rootfs: &Path, container_path: &str) -> PathBuf {
    rootfs.join(container_path.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::super::paths::validate_all;
    use super::*;
    use crate::model::gpu::DeviceNode;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};

    fn node(path: &str, minor: u32) -> DeviceNode {
        DeviceNode {
            path: path.to_owned(),
            major: 195,
            minor,
        }
    }

    fn gpu_nodes() -> Vec<DeviceNode> {
        vec![
            node("/dev/nvidia0", 0),
            node("/dev/nvidiactl", 255),
            node("/dev/nvidia-caps/nvidia-cap1", 1),
        ]
    }

    /// mknod of a char device needs CAP_MKNOD; these tests are skipped without it.
    fn is_root() -> bool {
        rustix::process::geteuid().is_root()
    }

    /// A temp dir holding `rootfs/` (with `rootfs/dev/` when `with_dev`) and `outside/`.
    fn layout(with_dev: bool) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = tmp.path().join("rootfs");
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&rootfs).unwrap();
        fs::create_dir_all(&outside).unwrap();
        if with_dev {
            fs::create_dir(rootfs.join("dev")).unwrap();
        }
        (tmp, rootfs, outside)
    }

    fn create(rootfs: &Path, nodes: &[DeviceNode]) -> Result<(), InjectError> {
        let root = open_rootfs(rootfs).unwrap();
        create_beneath(&root, rootfs, &validate_all(nodes).unwrap())
    }

    fn assert_char(path: &Path, minor: u32) {
        let meta = fs::symlink_metadata(path).unwrap();
        assert!(meta.file_type().is_char_device(), "{}", path.display());
        assert_eq!(meta.rdev(), rustix::fs::makedev(195, minor));
    }

    #[test]
    fn a_rootfs_that_is_the_host_root_is_refused() {
        for path in ["/", "/.", "/tmp/.."] {
            let err = open_rootfs(Path::new(path)).unwrap_err();
            assert!(matches!(err, InjectError::HostRoot { .. }), "{path}: {err}");
        }
    }

    #[test]
    fn creates_char_nodes_and_nested_dirs() {
        if !is_root() {
            return;
        }
        let (_tmp, rootfs, _) = layout(true);
        create(&rootfs, &gpu_nodes()).unwrap();
        assert_char(&rootfs.join("dev/nvidia0"), 0);
        assert_char(&rootfs.join("dev/nvidiactl"), 255);
        assert_char(&rootfs.join("dev/nvidia-caps/nvidia-cap1"), 1);
    }

    #[test]
    fn retry_is_idempotent() {
        if !is_root() {
            return;
        }
        let (_tmp, rootfs, _) = layout(true);
        create(&rootfs, &gpu_nodes()).unwrap();
        create(&rootfs, &gpu_nodes()).unwrap();
        assert_char(&rootfs.join("dev/nvidia0"), 0);
    }

    #[test]
    fn dev_symlink_is_refused_and_nothing_is_created_outside() {
        let (_tmp, rootfs, outside) = layout(false);
        std::os::unix::fs::symlink(&outside, rootfs.join("dev")).unwrap();
        let err = create(&rootfs, &gpu_nodes()).unwrap_err();
        assert!(matches!(err, InjectError::Symlink { .. }), "{err}");
        let expected = format!(
            "container /dev at {}/dev is a symlink; refusing to create device nodes",
            rootfs.display()
        );
        assert_eq!(err.to_string(), expected);
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn node_symlink_is_refused_and_its_target_untouched() {
        let (_tmp, rootfs, outside) = layout(true);
        let target = outside.join("shadow");
        fs::write(&target, "secret").unwrap();
        std::os::unix::fs::symlink(&target, rootfs.join("dev/nvidia0")).unwrap();
        let err = create(&rootfs, &gpu_nodes()).unwrap_err();
        assert!(matches!(err, InjectError::NodeConflict { .. }), "{err}");
        assert!(err.to_string().contains("a symlink"), "{err}");
        let meta = fs::symlink_metadata(&target).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(fs::read_to_string(&target).unwrap(), "secret");
    }

    #[test]
    fn symlinked_intermediate_dir_is_refused() {
        let (_tmp, rootfs, outside) = layout(true);
        std::os::unix::fs::symlink(&outside, rootfs.join("dev/nvidia-caps")).unwrap();
        let nodes = [node("/dev/nvidia-caps/nvidia-cap1", 1)];
        let err = create(&rootfs, &nodes).unwrap_err();
        assert!(matches!(err, InjectError::Symlink { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with("container /dev/nvidia-caps at ")
        );
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn existing_node_of_another_device_is_a_conflict() {
        if !is_root() {
            return;
        }
        let (_tmp, rootfs, _) = layout(true);
        create(&rootfs, &[node("/dev/nvidia0", 1)]).unwrap();
        let err = create(&rootfs, &[node("/dev/nvidia0", 0)]).unwrap_err();
        assert!(err.to_string().contains("char device 195:1"), "{err}");
        assert_char(&rootfs.join("dev/nvidia0"), 1);
    }

    #[test]
    fn missing_dev_is_an_error_not_created() {
        let (_tmp, rootfs, _) = layout(false);
        let err = create(&rootfs, &gpu_nodes()).unwrap_err();
        assert!(matches!(err, InjectError::OpenDir { .. }), "{err}");
        assert!(!rootfs.join("dev").exists());
    }
}
