//! `node_access = "acl"` end to end (issue 31, finding 4): with root-only GPU nodes, two
//! throwaway users' jobs through a real `gpupin serve` each open their own GPU and get
//! `Permission denied` on the other's, and so do their shells beside the jobs; the ACL
//! entries follow the ledger through a release, a kill -9 cleaned up by `gpupin gc`, and a
//! daemon restart; an fd opened before the release still reads after it. Needs root,
//! useradd and getfacl (the acl package).
//!
//! The fake nodes carry /dev/zero's and /dev/full's numbers (1:5, 1:7) under a file
//! inventory with `gpu_major` 1: an open the ACL lets through then succeeds and gives an
//! fd, where a fake NVIDIA node would fail with ENXIO. No device cgroup (`confine = false`,
//! it would keep jobs off /dev/null too): the test is of the nodes' permissions alone.

#[allow(dead_code)]
mod exec_support;

use exec_support::{Daemon, GPUPIN, Job, Sleeper, User, alive, cmd, ok, requirements, until};
use gpupin_sandbox::harness::{self, Gpupin};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const INVENTORY: &str = r#"{
  "gpu_major": 1,
  "gpus": [
    {"index": 0, "uuid": "GPU-ac100000-0000-4000-8000-000000000000", "name": "NVIDIA H100 80GB HBM3",
     "memory": "80GiB", "pci_bus_id": "00000000:18:00.0", "minor": 5},
    {"index": 1, "uuid": "GPU-ac100000-0000-4000-8000-000000000001", "name": "NVIDIA H100 80GB HBM3",
     "memory": "80GiB", "pci_bus_id": "00000000:2A:00.0", "minor": 7}
  ]
}"#;

/// The machine: the inventory, and its two GPU nodes made root-only (mode 0600) in a
/// directory every user can reach.
struct Machine {
    _dir: tempfile::TempDir,
    inventory: PathBuf,
    dev: PathBuf,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let inventory = dir.path().join("inventory.json");
        std::fs::write(&inventory, INVENTORY).unwrap();
        let dev = dir.path().join("dev");
        std::fs::create_dir(&dev).unwrap();
        std::fs::set_permissions(&dev, std::fs::Permissions::from_mode(0o755)).unwrap();
        for minor in [5, 7] {
            let out = Command::new("mknod")
                .args(["-m", "600"])
                .arg(dev.join(format!("nvidia{minor}")))
                .args(["c", "1", &minor.to_string()])
                .output()
                .unwrap();
            assert!(out.status.success(), "mknod: {}", harness::stderr(&out));
        }
        Machine {
            _dir: dir,
            inventory,
            dev,
        }
    }

    fn node(&self, minor: u32) -> PathBuf {
        self.dev.join(format!("nvidia{minor}"))
    }

    /// The uids with named entries in the node's ACL, as getfacl shows them.
    fn named_users(&self, minor: u32) -> Vec<u32> {
        let out = Command::new("getfacl")
            .args(["-n", "-p"])
            .arg(self.node(minor))
            .output()
            .unwrap();
        assert!(out.status.success(), "getfacl: {}", harness::stderr(&out));
        harness::stdout(&out)
            .lines()
            .filter_map(|l| l.strip_prefix("user:")?.split(':').next()?.parse().ok())
            .collect()
    }

    fn setfacl(&self, args: &[&str], minor: u32) {
        let out = Command::new("setfacl")
            .args(args)
            .arg(self.node(minor))
            .output()
            .unwrap();
        assert!(out.status.success(), "setfacl: {}", harness::stderr(&out));
    }
}

/// A shell function `probe NODE`: "opened" if one byte could be read from a fresh open,
/// else the error's last words ("Permission denied").
const PROBE: &str = r#"probe() { if head -c 1 "$1" >/dev/null 2>"$S/$N.err"; then echo opened; else sed 's/.*: //' "$S/$N.err"; fi; }"#;

/// A job that reports `pid`, `own` and `other` (probes) into `<name>.before`, opens its
/// own GPU node as fd 3 and waits for its go. With `child`, a background process keeps
/// fd 3 past the job's end and, once told (`go-<name>-child`), reports into
/// `<name>.after` what the fd still reads (`fd`, hex) and what a fresh open gets (`own`).
fn script(scratch: &Path, name: &str, own: &Path, other: &Path, child: bool) -> String {
    let (s, own, other) = (scratch.display(), own.display(), other.display());
    let wait = |go: &str| {
        format!("i=0; while [ ! -e \"$S/{go}\" ] && [ $i -lt 900 ]; do sleep 0.1; i=$((i+1)); done")
    };
    let child = match child {
        true => format!(
            "( {}; {{ echo \"fd $(head -c 4 <&3 | od -An -tx1 | tr -d ' \\n')\"; echo \"own $(probe {own})\"; }} > \"$S/$N.t2\" && mv \"$S/$N.t2\" \"$S/$N.after\" ) >/dev/null 2>&1 &",
            wait(&format!("go-{name}-child"))
        ),
        false => String::new(),
    };
    format!(
        "S={s}; N={name}; {PROBE}; \
         {{ echo \"pid $$\"; echo \"own $(probe {own})\"; echo \"other $(probe {other})\"; }} > \"$S/$N.t\" && mv \"$S/$N.t\" \"$S/$N.before\"; \
         exec 3<{own} || exit 3; {child} {}",
        wait(&format!("go-{name}"))
    )
}

/// `key value` lines of a report, once it is there.
fn report(scratch: &Path, file: &str) -> Vec<(String, String)> {
    let text = until(&format!("{file} is written"), || {
        std::fs::read_to_string(scratch.join(file)).ok()
    });
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn value<'r>(report: &'r [(String, String)], key: &str) -> &'r str {
    &report.iter().find(|(k, _)| k == key).unwrap().1
}

/// What `user`'s shell, a plain process outside any job, gets opening `node`.
fn shell_probe(g: &Gpupin, user: &User, node: &Path) -> String {
    let scratch = exec_support::scratch(g);
    let code = format!(
        "S={}; N=shell-{}; {PROBE}; probe {}",
        scratch.display(),
        user.uid,
        node.display()
    );
    let mut sh = Command::new("sh");
    sh.args(["-c", &code]).env("LC_ALL", "C");
    let out = user.owns(&mut sh).output().unwrap();
    harness::stdout(&out).trim().to_string()
}

#[test]
fn each_user_opens_only_the_gpus_they_hold_and_the_acls_follow_the_ledger() {
    let test = "each_user_opens_only_the_gpus_they_hold";
    if !requirements(test) {
        return;
    }
    let tools = match exec_support::on_path("getfacl") && exec_support::on_path("setfacl") {
        true => Ok(()),
        false => Err("getfacl and setfacl (the acl package) not found".to_string()),
    };
    if harness::required(test, tools).is_none() {
        return;
    }
    let machine = Machine::new();
    let extra = format!(
        "node_access = \"acl\"\nnode_dir = {:?}\nconfine = false",
        machine.dev.to_str().unwrap()
    );
    let g = Gpupin::with_extra(GPUPIN, machine.inventory.to_str().unwrap(), &extra);
    exec_support::open_up(&g);
    let scratch = exec_support::scratch(&g);
    let alice = User::create("acla");
    let bob = User::create("aclb");
    let mut daemon = Daemon::start(&g);
    let (alices, bobs) = (machine.node(5), machine.node(7));

    // Root-only nodes, nothing held: nobody but root opens either.
    for (user, node) in [(&alice, &alices), (&bob, &bobs)] {
        assert_eq!(shell_probe(&g, user, node), "Permission denied");
    }

    let a_script = script(&scratch, "a", &alices, &bobs, true);
    let mut a = Job::start_with(&g, Some(&alice), "a", &["--devices", "0"], &[], &a_script);
    let b_script = script(&scratch, "b", &bobs, &alices, false);
    let mut b = Job::start_with(&g, Some(&bob), "b", &["--devices", "1"], &[], &b_script);
    let a_before = report(&scratch, "a.before");
    let b_before = report(&scratch, "b.before");
    assert_eq!(value(&a_before, "own"), "opened", "{}", a.stderr());
    assert_eq!(value(&a_before, "other"), "Permission denied");
    assert_eq!(value(&b_before, "own"), "opened", "{}", b.stderr());
    assert_eq!(value(&b_before, "other"), "Permission denied");

    // Beside the jobs: a user's shell opens the GPU their job holds (the entry is the
    // user's), never the other user's.
    assert_eq!(shell_probe(&g, &alice, &alices), "opened");
    assert_eq!(shell_probe(&g, &alice, &bobs), "Permission denied");
    assert_eq!(shell_probe(&g, &bob, &alices), "Permission denied");
    assert_eq!(machine.named_users(5), [alice.uid]);
    assert_eq!(machine.named_users(7), [bob.uid]);

    // Alice's job ends and is released: her entry goes. Its child kept fd 3: an open fd
    // still reads after the release (ACLs, like device cgroups, are checked at open);
    // a fresh open is refused.
    let (exit, stderr) = a.finish();
    assert!(exit.success(), "{exit}: {stderr}");
    until("alice's entry is gone", || {
        machine.named_users(5).is_empty().then_some(())
    });
    assert_eq!(shell_probe(&g, &alice, &alices), "Permission denied");
    std::fs::write(scratch.join("go-a-child"), "").unwrap();
    let a_after = report(&scratch, "a.after");
    assert_eq!(value(&a_after, "fd"), "00000000", "the open fd reads on");
    assert_eq!(value(&a_after, "own"), "Permission denied");

    // The daemon dies (SIGKILL), then bob's job is killed -9: no one releases it, and
    // his entry stays until `gpupin gc` reaps the holder.
    drop(daemon);
    let b_pid: i32 = value(&b_before, "pid").parse().unwrap();
    // SAFETY: kill has no memory effects.
    unsafe { libc::kill(b_pid, libc::SIGKILL) };
    until("bob's job is gone", || (!alive(b_pid)).then_some(()));
    let _ = b.wait();
    assert_eq!(machine.named_users(7), [bob.uid], "nothing reconciled yet");
    ok(&g, None, &["gc"]);
    assert!(machine.named_users(7).is_empty(), "gc removed bob's entry");
    assert_eq!(shell_probe(&g, &bob, &bobs), "Permission denied");

    // A hold for a process of alice's, then entries out of line with the ledger (as a
    // crash between a change and its reconcile could leave them): a daemon's start puts
    // them right.
    let mut sleeper = Sleeper::start(&alice);
    let pid = sleeper.pid().to_string();
    ok(
        &g,
        None,
        &[
            "hold",
            "keep",
            "--devices",
            "0",
            "--user",
            &alice.name,
            "--pid",
            &pid,
        ],
    );
    assert_eq!(machine.named_users(5), [alice.uid]);
    machine.setfacl(&["-x", &format!("u:{}", alice.uid)], 5);
    machine.setfacl(&["-m", &format!("u:{}:rw", bob.uid)], 7);
    daemon = Daemon::start(&g);
    assert_eq!(machine.named_users(5), [alice.uid], "{}", daemon.log());
    assert!(machine.named_users(7).is_empty(), "{}", daemon.log());

    sleeper.stop();
    let out = cmd(&g, None, &["gc"]).output().unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert!(machine.named_users(5).is_empty());
    let mode = std::fs::metadata(&alices).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the node's mode as the admin made it");
    drop(daemon);
}
