use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

/// A character node `name` (1:5, /dev/zero's numbers) in `dir`, mode 0600; `None` when
/// not root (CI runs as root).
fn node(dir: &Path, name: &str) -> Option<NodeUsers> {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: mknod needs root (CI runs as root)");
        return None;
    }
    let path = dir.join(name);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &path,
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o600),
        rustix::fs::makedev(1, 5),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Some(NodeUsers {
        path,
        major: 1,
        minor: 5,
        uids: BTreeSet::new(),
    })
}

fn getfacl(path: &Path) -> Option<String> {
    let out = Command::new("getfacl").arg("-n").arg(path).output().ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

#[test]
fn users_get_entries_and_lose_them_and_the_mode_comes_back() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut node) = node(tmp.path(), "nvidia5") else {
        return;
    };
    node.uids = BTreeSet::from([65534, 4321]);
    assert!(set_users(&node).unwrap(), "written");
    assert!(
        !set_users(&node).unwrap(),
        "nothing to change the second time"
    );
    assert_eq!(users(&node).unwrap(), node.uids);
    match getfacl(&node.path) {
        Some(text) => {
            for line in ["user::rw-", "user:4321:rw-", "user:65534:rw-", "group::---"] {
                assert!(text.lines().any(|l| l == line), "{line} in {text}");
            }
            assert!(text.lines().any(|l| l == "other::---"), "{text}");
        }
        None => eprintln!("getfacl not found (the acl package): its view not compared"),
    }

    node.uids = BTreeSet::from([4321]);
    set_users(&node).unwrap();
    assert_eq!(users(&node).unwrap(), node.uids);

    node.uids.clear();
    set_users(&node).unwrap();
    assert!(users(&node).unwrap().is_empty());
    let mode = std::fs::metadata(&node.path).unwrap().mode() & 0o777;
    assert_eq!(
        mode, 0o600,
        "the group bits are the group's again, not the mask's"
    );
}

#[test]
fn a_symlink_fifo_or_other_device_in_a_nodes_place_is_left_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(mut real) = node(tmp.path(), "real") else {
        return;
    };
    real.uids = BTreeSet::from([4321]);
    let link = tmp.path().join("nvidia0");
    std::os::unix::fs::symlink(&real.path, &link).unwrap();
    let fifo = tmp.path().join("nvidia1");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        FileType::Fifo,
        Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    for path in [link, fifo] {
        let err = set_users(&NodeUsers {
            path: path.clone(),
            ..real.clone()
        })
        .unwrap_err();
        assert!(
            matches!(err, NodeAclError::NotTheNode { .. }),
            "{path:?}: {err}"
        );
    }
    let other = NodeUsers {
        minor: 6,
        ..real.clone()
    };
    let err = set_users(&other).unwrap_err().to_string();
    assert!(
        err.contains("character device 1:5, not the device node 1:6"),
        "{err}"
    );
    assert!(users(&real).unwrap().is_empty(), "the real node untouched");
}
