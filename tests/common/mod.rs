//! Shared set-up of the end-to-end tests: a gpupin config with its own state dir, and for
//! the runc tests a busybox rootfs and a private runc root, all in one temp dir per test.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

use gpupin::sandbox::{BundleSpec, Container, HookCommand, Requirements, Runc, SandboxError};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

pub const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// The simulated machines' numbers (the contract of `sim:nvswitch8` and `sim:pcie8`):
/// GPU nodes 195:<minor>, minors 0..7, and three control nodes.
pub const GPU_MAJOR: u32 = 195;
pub const CONTROL_NODES: &[(&str, u32, u32)] = &[
    ("nvidiactl", 195, 255),
    ("nvidia-uvm", 510, 0),
    ("nvidia-uvm-tools", 510, 1),
];

/// A gpupin configuration in a temp dir: state dir, inventory, and the binary to call.
pub struct Gpupin {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state_dir: PathBuf,
}

impl Gpupin {
    pub fn new(machine: &str) -> Gpupin {
        Gpupin::with_extra(machine, "")
    }

    /// As `new`, with more config lines (`max_shared = 2`, `live_file = "..."`).
    pub fn with_extra(machine: &str, extra: &str) -> Gpupin {
        let dir = tempfile::Builder::new()
            .prefix("gpupin-e2e")
            .tempdir()
            .unwrap();
        let state_dir = dir.path().join("state");
        let config = dir.path().join("gpupin.toml");
        let text = format!(
            "state_dir = {:?}\ninventory = {machine:?}\npolicy = \"pack\"\n{extra}\n",
            state_dir.to_str().unwrap()
        );
        std::fs::write(&config, text).unwrap();
        Gpupin {
            dir,
            config,
            state_dir,
        }
    }

    /// `gpupin --config <ours> ARGS`, stdin from `input`.
    pub fn run(&self, args: &[&str], input: &str) -> Output {
        use std::io::Write;
        let mut child = Command::new(GPUPIN)
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // The hook may exit before reading stdin (a bad argument); a broken pipe is fine.
        let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
        child.wait_with_output().unwrap()
    }

    /// `gpupin status --json`, which must succeed.
    pub fn status(&self) -> Value {
        let out = self.run(&["status", "--json"], "");
        assert!(out.status.success(), "status failed: {}", stderr(&out));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The ledger's record of `id` as `status --json` shows it.
    pub fn holder(&self, id: &str) -> Option<Value> {
        let status = self.status();
        status["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == id)
            .cloned()
    }

    /// Minors of the GPUs `id` holds, sorted.
    pub fn held_minors(&self, id: &str) -> Vec<u32> {
        let status = self.status();
        let mut minors: Vec<u32> = status["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|g| {
                g["holders"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|h| h["id"] == id)
            })
            .map(|g| g["minor"].as_u64().unwrap() as u32)
            .collect();
        minors.sort();
        minors
    }

    /// Every file under <state_dir>/holders with its bytes: "the ledger" for before/after
    /// comparisons.
    pub fn ledger_snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        let holders = self.state_dir.join("holders");
        let Ok(entries) = std::fs::read_dir(&holders) else {
            return BTreeMap::new();
        };
        entries
            .map(|e| e.unwrap().path())
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&p).unwrap_or_default())
            })
            .collect()
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A gpupin configuration plus what real containers need.
pub struct Sandbox {
    pub gpupin: Gpupin,
    pub runc: Runc,
    pub rootfs: PathBuf,
    pub hook: HookCommand,
    test: String,
}

static SEQUENCE: AtomicU32 = AtomicU32::new(0);

impl Sandbox {
    /// `None` (after saying why on stderr) where root, runc or busybox is missing; under
    /// CI=true a missing requirement fails the test instead.
    pub fn new(test: &str) -> Option<Sandbox> {
        Sandbox::with_machine(test, "sim:nvswitch8")
    }

    pub fn with_machine(test: &str, machine: &str) -> Option<Sandbox> {
        Sandbox::with_config(test, machine, "")
    }

    /// A sandbox whose gpupin config has `extra` lines besides state dir and machine.
    pub fn with_config(test: &str, machine: &str, extra: &str) -> Option<Sandbox> {
        let reqs = match Requirements::check() {
            Ok(reqs) => reqs,
            Err(reason) => return skip(test, &reason),
        };
        let gpupin = Gpupin::with_extra(machine, extra);
        let root = gpupin.dir.path().join("runc-root");
        let rootfs = gpupin.dir.path().join("rootfs");
        gpupin::sandbox::build_busybox_rootfs(&reqs.busybox, &rootfs).unwrap();
        let hook = HookCommand {
            exe: PathBuf::from(GPUPIN),
            config: Some(gpupin.config.clone()),
        };
        Some(Sandbox {
            runc: Runc::new(&reqs.runc, &root),
            rootfs,
            hook,
            test: test.to_string(),
            gpupin,
        })
    }

    /// A container id unique to this test run: cgroups are named after container ids and
    /// are global to the machine.
    pub fn id(&self, name: &str) -> String {
        let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
        format!("e2e-{}-{n}-{name}", std::process::id())
    }

    /// A `sleep 1000` container on the shared rootfs with gpupin's hooks.
    pub fn spec(&self) -> BundleSpec {
        BundleSpec::sleeper(&self.rootfs).with_hook(&self.hook)
    }

    /// Writes a bundle for `id` and runs it detached.
    pub fn start(&self, id: &str, spec: &BundleSpec) -> Result<Container, SandboxError> {
        let bundle = self.bundle_dir(id);
        gpupin::sandbox::write_bundle(&bundle, spec)?;
        self.runc.run_detached(id, &bundle)
    }

    pub fn bundle_dir(&self, id: &str) -> PathBuf {
        self.gpupin.dir.path().join("bundles").join(id)
    }

    pub fn test(&self) -> &str {
        &self.test
    }
}

fn skip<T>(test: &str, reason: &str) -> Option<T> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} needs what is missing here: {reason}");
    }
    eprintln!("skipping {test}: {reason}");
    None
}

/// Names under the container's /dev that start with `nvidia`.
pub fn nvidia_nodes(c: &Container) -> BTreeSet<String> {
    let ls = c.exec_stdout(&["ls", "/dev"]).unwrap();
    ls.split_whitespace()
        .filter(|n| n.starts_with("nvidia"))
        .map(str::to_string)
        .collect()
}

/// The GPU nodes (`nvidia<minor>`) under the container's /dev, without control nodes.
pub fn nvidia_gpu_nodes(c: &Container) -> Vec<String> {
    nvidia_nodes(c)
        .into_iter()
        .filter(|n| n["nvidia".len()..].bytes().all(|b| b.is_ascii_digit()) && n.len() > 6)
        .collect()
}

/// `stat -c %F %t:%T` of a path in the container: type, then major:minor in hex (busybox).
pub fn stat_node(c: &Container, path: &str) -> String {
    c.exec_stdout(&["stat", "-c", "%F %t:%T", path])
        .unwrap()
        .trim()
        .to_string()
}

/// What `stat_node` prints for a character device major:minor.
pub fn char_node(major: u32, minor: u32) -> String {
    format!("character special file {major:x}:{minor:x}")
}

/// The device cgroup v1 allow list of a host pid, as the kernel reports it.
pub fn devices_list(pid: i32) -> BTreeSet<String> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroups
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("a devices cgroup v1 line");
    let list = Path::new("/sys/fs/cgroup/devices")
        .join(path.trim_start_matches('/'))
        .join("devices.list");
    std::fs::read_to_string(&list)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}
