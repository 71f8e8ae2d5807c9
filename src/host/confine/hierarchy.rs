//! Where a pid's cgroups are on this machine: its path in each hierarchy (from
//! `/proc/<pid>/cgroup`) under wherever that hierarchy is mounted (from our mountinfo;
//! distributions, hybrids and containers mount them in different places).

use super::{Confine, ConfineError, Mechanism};
use crate::host::container_devices::cgroup::{
    devices_cgroup_path, devices_mounts, under_mount, unescape,
};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A cgroup the job's own one is made under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Parent {
    pub mechanism: Mechanism,
    /// The pid's current cgroup directory.
    pub dir: PathBuf,
    /// Where its hierarchy (or the visible subtree of it) is mounted.
    pub mount: PathBuf,
}

/// The pid's current cgroup for each mechanism `mode` uses (none for `Off`).
pub(super) fn parents(
    proc_root: &Path,
    pid: i32,
    mode: Confine,
) -> Result<Vec<Parent>, ConfineError> {
    let mountinfo = read(&proc_root.join("self/mountinfo"))?;
    let v1: Vec<_> = devices_mounts(&mountinfo).collect();
    let v2: Vec<_> = cgroup2_mounts(&mountinfo).collect();
    let unavailable = |hierarchy| ConfineError::Unavailable { mode, hierarchy };
    let wanted = match mode {
        Confine::Off => vec![],
        Confine::Auto => {
            let found = [
                (!v1.is_empty()).then_some(Mechanism::V1Devices),
                (!v2.is_empty()).then_some(Mechanism::Bpf),
            ];
            let found: Vec<_> = found.into_iter().flatten().collect();
            if found.is_empty() {
                return Err(ConfineError::NoMechanism { pid });
            }
            found
        }
        Confine::V1 if v1.is_empty() => return Err(unavailable("cgroup v1 devices")),
        Confine::V1 => vec![Mechanism::V1Devices],
        Confine::V2 if v2.is_empty() => return Err(unavailable("cgroup2")),
        Confine::V2 => vec![Mechanism::Bpf],
    };
    let cgroup = read(&proc_root.join(pid.to_string()).join("cgroup"))?;
    wanted
        .into_iter()
        .map(|mechanism| {
            let (hierarchy, path, mounts) = match mechanism {
                Mechanism::V1Devices => ("devices", devices_cgroup_path(&cgroup), &v1),
                Mechanism::Bpf => ("cgroup2", cgroup2_path(&cgroup), &v2),
            };
            let path = path.ok_or(ConfineError::NoCgroup { pid, hierarchy })?;
            mounts
                .iter()
                .find_map(|(root, mount)| {
                    let dir = under_mount(&path, root, mount)?;
                    Some(Parent {
                        mechanism,
                        dir,
                        mount: PathBuf::from(mount),
                    })
                })
                .ok_or(ConfineError::NotMounted {
                    pid,
                    hierarchy,
                    cgroup: path,
                })
        })
        .collect()
}

/// Refuses a parent that a user other than root could write a pid into, itself or any
/// cgroup above it up to the mount: moving a process needs write access to the common
/// ancestor's cgroup.procs only (cgroup-v2.rst, "Delegation Containment"), so that user
/// could put the job back beside its device cgroup. A systemd delegation (user@.service,
/// Delegate=yes) chowns exactly these files.
pub(super) fn refuse_delegated(parent: &Parent) -> Result<(), ConfineError> {
    for dir in parent.dir.ancestors() {
        if !dir.starts_with(&parent.mount) {
            break;
        }
        let procs = dir.join("cgroup.procs");
        let meta = std::fs::symlink_metadata(&procs).map_err(|source| ConfineError::Read {
            path: procs.clone(),
            source,
        })?;
        if meta.uid() != 0 || meta.mode() & 0o002 != 0 {
            return Err(ConfineError::Delegated {
                path: dir.to_owned(),
                uid: meta.uid(),
            });
        }
    }
    Ok(())
}

fn read(path: &Path) -> Result<String, ConfineError> {
    std::fs::read_to_string(path).map_err(|source| ConfineError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The path in the cgroup2 hierarchy from a `/proc/<pid>/cgroup` text: the `0::<path>`
/// line (cgroups(7)), present on pure v2 and hybrid hosts.
fn cgroup2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// (root, mount point) of every cgroup2 mount in a mountinfo text (proc_pid_mountinfo(5)).
pub(crate) fn cgroup2_mounts(text: &str) -> impl Iterator<Item = (String, String)> + '_ {
    text.lines().filter_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        if fs.split(' ').next()? != "cgroup2" {
            return None;
        }
        let mut fields = mount.split(' ').skip(3);
        let (root, mount_point) = (fields.next()?, fields.next()?);
        Some((unescape(root), unescape(mount_point)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    const HYBRID: &str = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n\
        36 31 0:33 / MNT/devices rw,relatime - cgroup cgroup rw,devices\n\
        41 31 0:38 / MNT/uni\\040fied rw,relatime - cgroup2 cgroup2 rw\n";
    const PURE_V2: &str = "30 23 0:27 /sub MNT/v2 rw - cgroup2 cgroup2 rw,nsdelegate\n";
    const NEITHER: &str = "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n";
    const PID_CGROUP: &str = "5:devices:/jobs\n4:memory:/x\n0::/sub/jobs\n";

    /// A fake proc root for pid 42 with `mountinfo` (MNT replaced by the temp dir).
    fn fake(mountinfo: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        fs::create_dir_all(proc_root.join("42")).unwrap();
        fs::create_dir_all(proc_root.join("self")).unwrap();
        fs::write(proc_root.join("42/cgroup"), PID_CGROUP).unwrap();
        let mountinfo = mountinfo.replace("MNT", tmp.path().to_str().unwrap());
        fs::write(proc_root.join("self/mountinfo"), mountinfo).unwrap();
        (tmp, proc_root)
    }

    fn mechanisms(parents: &[Parent]) -> Vec<Mechanism> {
        parents.iter().map(|p| p.mechanism).collect()
    }

    #[test]
    fn auto_on_a_hybrid_uses_both_mechanisms() {
        let (tmp, proc_root) = fake(HYBRID);
        let found = parents(&proc_root, 42, Confine::Auto).unwrap();
        assert_eq!(mechanisms(&found), [Mechanism::V1Devices, Mechanism::Bpf]);
        assert_eq!(found[0].dir, tmp.path().join("devices/jobs"));
        assert_eq!(found[1].dir, tmp.path().join("uni fied/sub/jobs"));
        assert_eq!(found[1].mount, tmp.path().join("uni fied"));
    }

    #[test]
    fn a_mounted_subtree_of_cgroup2_is_resolved() {
        let (tmp, proc_root) = fake(PURE_V2);
        let found = parents(&proc_root, 42, Confine::Auto).unwrap();
        assert_eq!(mechanisms(&found), [Mechanism::Bpf]);
        assert_eq!(found[0].dir, tmp.path().join("v2/jobs"));
    }

    #[test]
    fn a_mode_asks_for_its_mechanism_only() {
        let (_tmp, proc_root) = fake(HYBRID);
        let v1 = parents(&proc_root, 42, Confine::V1).unwrap();
        assert_eq!(mechanisms(&v1), [Mechanism::V1Devices]);
        let v2 = parents(&proc_root, 42, Confine::V2).unwrap();
        assert_eq!(mechanisms(&v2), [Mechanism::Bpf]);
        assert!(parents(&proc_root, 42, Confine::Off).unwrap().is_empty());
    }

    #[test]
    fn a_missing_mechanism_is_a_one_line_error() {
        let (_tmp, proc_root) = fake(PURE_V2);
        let err = parents(&proc_root, 42, Confine::V1).unwrap_err();
        assert!(matches!(err, ConfineError::Unavailable { .. }), "{err}");
        assert!(err.to_string().contains("confine = \"v1\""), "{err}");
        let (_tmp, proc_root) = fake(NEITHER);
        let err = parents(&proc_root, 42, Confine::Auto).unwrap_err();
        assert!(
            matches!(err, ConfineError::NoMechanism { pid: 42 }),
            "{err}"
        );
        assert!(!err.to_string().contains('\n'));
    }

    #[test]
    fn a_cgroup_outside_the_mounted_subtree_is_an_error() {
        let (_tmp, proc_root) = fake(&PURE_V2.replace("/sub ", "/other "));
        let err = parents(&proc_root, 42, Confine::V2).unwrap_err();
        assert!(matches!(err, ConfineError::NotMounted { .. }), "{err}");
    }

    #[test]
    fn a_cgroup_delegated_to_a_user_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let mount = tmp.path().join("mnt");
        let dir = mount.join("user.slice/app");
        fs::create_dir_all(&dir).unwrap();
        for d in [&mount, &mount.join("user.slice"), &dir] {
            fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        let parent = Parent {
            mechanism: Mechanism::Bpf,
            dir: dir.clone(),
            mount: mount.clone(),
        };
        if !rustix::process::geteuid().is_root() {
            // Files we create are ours: the refusal is what a non-root run can check.
            assert!(refuse_delegated(&parent).is_err());
            return;
        }
        refuse_delegated(&parent).unwrap();
        let delegated = mount.join("user.slice/cgroup.procs");
        std::os::unix::fs::chown(&delegated, Some(1000), None).unwrap();
        let err = refuse_delegated(&parent).unwrap_err();
        assert!(
            matches!(err, ConfineError::Delegated { uid: 1000, ref path } if *path == mount.join("user.slice")),
            "{err}"
        );
    }
}
