//! Device access in the container's cgroup v1 `devices` controller.
//!
//! Only v1 is handled: on cgroup v2, device access is an eBPF program attached by the
//! runtime, which a hook cannot amend without replacing it. There the prestart path fails
//! closed, and the spec-editing paths (shim, podman precreate) let the runtime do it.

use super::InjectError;
use crate::model::gpu::DeviceNode;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Writes `c MAJ:MIN rwm` for every node to the devices.allow of `pid`'s devices cgroup,
/// reading `<proc_root>/<pid>/cgroup` and `<proc_root>/self/mountinfo`.
pub(super) fn allow(proc_root: &Path, pid: i32, nodes: &[DeviceNode]) -> Result<(), InjectError> {
    let dir = devices_cgroup_dir(proc_root, pid)?;
    let path = dir.join("devices.allow");
    // Append: each write(2) to devices.allow is one rule for the kernel, and on a plain
    // file (tests) rules must not overwrite each other.
    let mut file = OpenOptions::new()
        .append(true)
        .open(&path)
        .map_err(|source| InjectError::OpenCgroup {
            path: path.clone(),
            source,
        })?;
    for node in nodes {
        let rule = format!("c {}:{} rwm", node.major, node.minor);
        match file.write(rule.as_bytes()) {
            Ok(n) if n == rule.len() => {}
            Ok(_) => {
                return Err(write_error(
                    &path,
                    &rule,
                    std::io::ErrorKind::WriteZero.into(),
                ));
            }
            Err(source) => return Err(write_error(&path, &rule, source)),
        }
    }
    Ok(())
}

fn write_error(path: &Path, rule: &str, source: std::io::Error) -> InjectError {
    InjectError::WriteCgroup {
        path: path.to_owned(),
        rule: rule.to_owned(),
        source,
    }
}

/// The host directory of `pid`'s devices cgroup: its path in the hierarchy (from
/// `/proc/<pid>/cgroup`) under wherever that hierarchy is mounted (from our mountinfo;
/// distributions and containers mount it in different places).
fn devices_cgroup_dir(proc_root: &Path, pid: i32) -> Result<PathBuf, InjectError> {
    let cgroup_file = proc_root.join(pid.to_string()).join("cgroup");
    let cgroup =
        devices_cgroup_path(&read(&cgroup_file)?).ok_or(InjectError::CgroupV2Only { pid })?;
    let mountinfo_file = proc_root.join("self/mountinfo");
    let mounts = read(&mountinfo_file)?;
    devices_mounts(&mounts)
        .find_map(|(root, mount_point)| under_mount(&cgroup, &root, &mount_point))
        .ok_or_else(|| InjectError::CgroupNotMounted {
            pid,
            cgroup: cgroup.clone(),
            mountinfo: mountinfo_file,
        })
}

fn read(path: &Path) -> Result<String, InjectError> {
    std::fs::read_to_string(path).map_err(|source| InjectError::ReadProc {
        path: path.to_owned(),
        source,
    })
}

/// The path of the v1 `devices` controller in a `/proc/<pid>/cgroup` text
/// (`hierarchy-id:controller-list:path`, cgroups(7)); None on a v2-only system.
pub(crate) fn devices_cgroup_path(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        controllers
            .split(',')
            .any(|c| c == "devices")
            .then(|| path.to_owned())
    })
}

/// (root, mount point) of every cgroup v1 mount carrying the devices controller, from a
/// mountinfo text (proc_pid_mountinfo(5): fields before ` - `, then fstype, source,
/// super options).
pub(crate) fn devices_mounts(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines().filter_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (fstype, _source, options) = (fs.next()?, fs.next()?, fs.next()?);
        if fstype != "cgroup" || !options.split(',').any(|o| o == "devices") {
            return None;
        }
        let mut fields = mount.split(' ').skip(3);
        let (root, mount_point) = (fields.next()?, fields.next()?);
        Some((unescape(root), unescape(mount_point)))
    })
}

/// The host directory of `cgroup` when the mount of hierarchy subtree `root` at
/// `mount_point` contains it (a container's own mounts show only its subtree).
pub(crate) fn under_mount(cgroup: &str, root: &str, mount_point: &str) -> Option<PathBuf> {
    let rest = if root == "/" {
        cgroup
    } else {
        let rest = cgroup.strip_prefix(root)?;
        // "/a" must not match "/ab".
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        rest
    };
    let rest = rest.trim_start_matches('/');
    // The kernel never writes ".." here; refuse it rather than leave the hierarchy.
    if rest.split('/').any(|part| part == "..") {
        return None;
    }
    Some(Path::new(mount_point).join(rest))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
pub(crate) fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            let s = std::str::from_utf8(d).ok()?;
            u8::from_str_radix(s, 8).ok()
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const HYBRID_CGROUP: &str = "9:name=systemd:/docker/abc\n5:devices:/docker/abc\n\
        4:cpu,cpuacct:/docker/abc\n0::/docker/abc\n";
    const V2_CGROUP: &str = "0::/system.slice/docker-abc.scope\n";

    fn node(minor: u32) -> DeviceNode {
        DeviceNode {
            path: crate::model::nvidia::gpu_node(minor),
            major: 195,
            minor,
        }
    }

    /// A fake proc root (`<pid>/cgroup`, `self/mountinfo`) and a devices hierarchy whose
    /// mount point is `<tmp>/cg dev` (a space, to exercise mountinfo escapes).
    fn fake(pid_cgroup: &str, mount_root: &str, cg_path: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        fs::create_dir_all(proc_root.join("42")).unwrap();
        fs::create_dir_all(proc_root.join("self")).unwrap();
        fs::write(proc_root.join("42/cgroup"), pid_cgroup).unwrap();
        let mount_point = tmp.path().join("cg dev");
        let escaped = mount_point.to_str().unwrap().replace(' ', "\\040");
        let mountinfo = format!(
            "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n\
             35 31 0:32 / /x/memory rw shared:5 - cgroup cgroup rw,memory\n\
             36 31 0:33 {mount_root} {escaped} rw,relatime shared:15 - cgroup cgroup rw,devices\n\
             41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
        );
        fs::write(proc_root.join("self/mountinfo"), mountinfo).unwrap();
        let dir = mount_point.join(cg_path);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("devices.allow"), "").unwrap();
        (tmp, proc_root)
    }

    #[test]
    fn rules_are_written_to_the_containers_devices_allow() {
        let (tmp, proc_root) = fake(HYBRID_CGROUP, "/", "docker/abc");
        allow(&proc_root, 42, &[node(0), node(3)]).unwrap();
        let written = fs::read_to_string(tmp.path().join("cg dev/docker/abc/devices.allow"));
        assert_eq!(written.unwrap(), "c 195:0 rwmc 195:3 rwm");
    }

    #[test]
    fn mount_of_a_subtree_is_resolved() {
        let (tmp, proc_root) = fake(HYBRID_CGROUP, "/docker", "abc");
        allow(&proc_root, 42, &[node(1)]).unwrap();
        let written = fs::read_to_string(tmp.path().join("cg dev/abc/devices.allow"));
        assert_eq!(written.unwrap(), "c 195:1 rwm");
    }

    #[test]
    fn cgroup_outside_the_mounted_subtree_is_an_error() {
        let (_tmp, proc_root) = fake(HYBRID_CGROUP, "/dock", "abc");
        let err = allow(&proc_root, 42, &[node(1)]).unwrap_err();
        assert!(
            matches!(err, InjectError::CgroupNotMounted { pid: 42, .. }),
            "{err}"
        );
    }

    #[test]
    fn v2_only_fails_closed() {
        let (_tmp, proc_root) = fake(V2_CGROUP, "/", "x");
        let err = allow(&proc_root, 42, &[node(0)]).unwrap_err();
        assert!(matches!(err, InjectError::CgroupV2Only { pid: 42 }));
        assert!(err.to_string().contains("cgroup v2"), "{err}");
    }

    #[test]
    fn missing_pid_is_a_read_error() {
        let (_tmp, proc_root) = fake(HYBRID_CGROUP, "/", "docker/abc");
        let err = allow(&proc_root, 7, &[node(0)]).unwrap_err();
        assert!(matches!(err, InjectError::ReadProc { .. }));
    }

    #[test]
    fn devices_controller_is_found_among_comounted_ones() {
        assert_eq!(
            devices_cgroup_path("3:cpu,devices:/a:b\n").as_deref(),
            Some("/a:b")
        );
        assert_eq!(devices_cgroup_path("3:name=devices:/a\n"), None);
    }

    #[test]
    fn under_mount_never_leaves_the_hierarchy() {
        assert_eq!(under_mount("/ab", "/a", "/m"), None);
        assert_eq!(under_mount("/a/../x", "/", "/m"), None);
        assert_eq!(under_mount("/a", "/a", "/m"), Some(PathBuf::from("/m/")));
        assert_eq!(under_mount("/", "/", "/m"), Some(PathBuf::from("/m/")));
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\134b"), "/a\\b");
        assert_eq!(unescape(r"/trailing\04"), r"/trailing\04");
    }
}
