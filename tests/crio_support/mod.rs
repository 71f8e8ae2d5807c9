//! A CRI-O node: the peers' crio (v1.34.0, tests/peers/crio, with its pinns) with its own
//! root, run dir, CRI socket and NRI socket (NRI on), running containers through
//! Debian's conmon (podman's) and the generation's runc; cgroupfs (no systemd here),
//! host-network pods (no CNI), no hooks dir; the busybox image of cri_support loaded into
//! its storage by podman (no registry is reachable); NRI as the shipped
//! k8s/nri/crio-nri.conf sets it, at the test's own paths. Stopped (SIGTERM, then SIGKILL) and
//! its mounts undone when dropped.

#![allow(dead_code)] // each test binary uses a different part of the harness

use crate::cri_support::{Cri, IMAGE};
use gpupin_sandbox::harness::{self, Gpupin, engines};
use gpupin_sandbox::{find_on_path, is_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// Not a timed assertion: the bound of each wait, so that a crio that never gets there
/// fails the test instead of hanging it.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// What CRI-O runs with: (crio, pinns, conmon, runc).
struct Programs {
    crio: PathBuf,
    pinns: PathBuf,
    conmon: PathBuf,
    runc: PathBuf,
}

fn programs() -> Result<Programs, String> {
    if !is_root() {
        return Err("needs root (crio, runc, cgroups)".into());
    }
    let cache = harness::toolkit::peers_cache()?;
    let built = |path: PathBuf| match path.is_file() {
        true => Ok(path),
        false => Err(format!(
            "no {}: run tests/peers/build (needs Go)",
            path.display()
        )),
    };
    let on_path = |name: &str, package: &str| {
        find_on_path(name).ok_or(format!("no {name} on PATH (Debian's {package})"))
    };
    on_path("podman", "podman")?;
    let runc = match engines::modern("runc")? {
        Some(runc) => runc,
        None => on_path("runc", "runc")?,
    };
    Ok(Programs {
        crio: built(cache.join("crio/crio"))?,
        pinns: built(cache.join("pinns/pinns"))?,
        conmon: on_path("conmon", "conmon")?,
        runc,
    })
}

pub struct Crio {
    child: Child,
    /// The runc crio runs containers with (its root is `<dir>/run/runc`).
    runc: PathBuf,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub gpupin: Gpupin,
    pub cri: Cri,
}

impl Crio {
    /// `None` where a requirement is missing (the test skips; under CI=true it fails).
    pub fn start(test: &str) -> Option<Crio> {
        let programs = harness::required(test, programs())?;
        let gpupin = Gpupin::new(GPUPIN, "sim:nvswitch8");
        let dir = gpupin.dir.path().join("crio");
        for sub in ["nri-plugins", "nri-conf", "cni", "conf.d", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        load_image(&dir);
        // Images are loaded, never pulled: any signature policy would do.
        std::fs::write(
            dir.join("policy.json"),
            r#"{"default": [{"type": "insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        let config = dir.join("crio.conf");
        std::fs::write(&config, crio_config(&dir, &programs)).unwrap();
        let log = std::fs::File::create(dir.join("crio.log")).unwrap();
        let child = Command::new(&programs.crio)
            .arg("--config")
            .arg(&config)
            // An empty drop-in dir: nothing from /etc/crio.
            .arg("--config-dir")
            .arg(dir.join("conf.d"))
            .args(["--log-level", "info"])
            .env("PATH", engines::path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting crio");
        let socket = dir.join("crio.sock");
        let crio = Crio {
            child,
            runc: programs.runc.clone(),
            cri: Cri::new(&socket),
            socket,
            dir,
            gpupin,
        };
        crio.wait_ready();
        Some(crio)
    }

    /// Where NRI plugins connect.
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri.sock")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("crio.log")).unwrap_or_default()
    }

    pub fn status(&self) -> serde_json::Value {
        self.gpupin.status()
    }

    /// The holders `gpupin status` lists.
    pub fn holders(&self) -> Vec<serde_json::Value> {
        self.status()["holders"].as_array().unwrap().clone()
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while let Err(e) = self.cri.version() {
            assert!(
                started.elapsed() < PATIENCE,
                "crio's CRI did not answer: {e}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        while !self.nri_socket().exists() {
            assert!(
                started.elapsed() < PATIENCE,
                "crio made no NRI socket\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        harness::terminate(&mut self.child, PATIENCE);
        // Containers run on without crio (under conmon): those a test left, passed or
        // failed, are killed and deleted, and their conmons end with them.
        let root = self.dir.join("run/runc");
        let listed = Command::new(&self.runc)
            .arg("--root")
            .arg(&root)
            .args(["list", "-q"])
            .output();
        for id in listed
            .map(|o| harness::text(&o.stdout))
            .unwrap_or_default()
            .lines()
        {
            let _ = Command::new(&self.runc)
                .arg("--root")
                .arg(&root)
                .args(["delete", "--force", id])
                .output();
        }
        harness::unmount_under(&self.dir);
    }
}

/// The busybox image (cri_support's `docker save` archive) in crio's storage, by podman
/// on the same root, run dir and driver.
fn load_image(dir: &Path) {
    let archive = crate::cri_support::image::busybox_archive(dir, IMAGE);
    let out = Command::new("podman")
        .arg("--root")
        .arg(dir.join("storage"))
        .arg("--runroot")
        .arg(dir.join("run-storage"))
        .args(["--storage-driver", "vfs", "load", "--quiet", "--input"])
        .arg(&archive)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "podman load: {}",
        harness::stderr(&out)
    );
}

/// The shipped NRI section, k8s/nri/crio-nri.conf: the test's paths replace its own.
const SHIPPED_NRI: &str = include_str!("../../k8s/nri/crio-nri.conf");

/// The config: crio's own paths under `dir`, and the shipped NRI section.
fn crio_config(dir: &Path, programs: &Programs) -> String {
    let d = |sub: &str| dir.join(sub).display().to_string();
    format!(
        r#"[crio]
root = "{storage}"
runroot = "{run_storage}"
storage_driver = "vfs"
log_dir = "{logs}"
version_file = "{run}/version"
version_file_persist = "{lib}/version"
clean_shutdown_file = "{lib}/clean.shutdown"

[crio.api]
listen = "{socket}"
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
container_exits_dir = "{run}/exits"
container_attach_socket_dir = "{run}"
namespaces_dir = "{run}/ns"
pinns_path = "{pinns}"
drop_infra_ctr = true
hooks_dir = []
enable_criu_support = false

[crio.runtime.runtimes.runc]
runtime_path = "{runc}"
runtime_type = "oci"
runtime_root = "{run}/runc"
monitor_path = "{conmon}"
monitor_cgroup = "pod"

[crio.image]
pause_image = "{IMAGE}"
pause_command = "/bin/sleep"
signature_policy = "{policy}"

[crio.network]
network_dir = "{cni}"
plugin_dirs = ["{cni}"]

[crio.metrics]
enable_metrics = false

{nri_section}"#,
        storage = d("storage"),
        run_storage = d("run-storage"),
        logs = d("logs"),
        run = d("run"),
        lib = d("lib"),
        socket = d("crio.sock"),
        pinns = programs.pinns.display(),
        runc = programs.runc.display(),
        conmon = programs.conmon.display(),
        cni = d("cni"),
        nri_section = SHIPPED_NRI
            .replace("/var/run/nri/nri.sock", &d("nri.sock"))
            .replace("/opt/nri/plugins", &d("nri-plugins"))
            .replace("/etc/nri/conf.d", &d("nri-conf")),
        policy = d("policy.json"),
    )
}
