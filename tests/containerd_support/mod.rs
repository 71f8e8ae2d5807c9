//! A private containerd for the containerd suites: its own root, state dir, socket and
//! config in a gpupin temp dir, gpupin's config in its environment (GPUPIN_CONFIG), which
//! the runc shim and so gpupin-runtime inherit. Stopped when dropped. Under
//! `GPUPIN_ENGINES=modern` containerd, ctr, the shim and runc are the peers' cache's
//! (containerd 2.x, runc 1.5; `harness::engines`), also for what containerd starts.

#![allow(dead_code)] // each test binary uses a different part of the harness

use gpupin_sandbox::harness::{self, Gpupin, engines, status};
use gpupin_sandbox::{find_on_path, find_static_busybox, is_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
/// How long containerd may take to answer after it starts (a readiness wait).
pub const START_WAIT: Duration = Duration::from_secs(60);

pub struct Containerd {
    child: Child,
    pub socket: PathBuf,
    pub gpupin: Gpupin,
}

/// What every containerd suite needs; `tools`: the programs a suite needs besides.
fn requirements(tools: &[&str]) -> Result<(), String> {
    if !is_root() {
        return Err("needs root (containerd, runc, device nodes)".into());
    }
    let engines = ["containerd", "ctr", "runc", "containerd-shim-runc-v2"];
    engines::check(&engines)?;
    for tool in engines.iter().chain(tools) {
        find_on_path(tool).ok_or(format!("{tool} is not installed"))?;
    }
    find_static_busybox()?;
    harness::announce_engines();
    Ok(())
}

impl Containerd {
    /// containerd on `sim:nvswitch8` with `extra` gpupin config lines; `config` gives
    /// containerd's config for the temp dir it will live in. `None` (the test skips)
    /// where a requirement is missing, a failure under CI=true.
    pub fn start(
        test: &str,
        tools: &[&str],
        extra: &str,
        config: impl FnOnce(&Path) -> String,
    ) -> Option<Containerd> {
        harness::required(test, requirements(tools))?;
        let gpupin = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", extra);
        let dir = gpupin.dir.path();
        let socket = dir.join("containerd.sock");
        let config_file = dir.join("containerd.toml");
        std::fs::write(&config_file, config(dir)).unwrap();
        let child = spawn(dir, &config_file, &socket, &gpupin.config);
        let c = Containerd {
            child,
            socket,
            gpupin,
        };
        c.wait_ready();
        Some(c)
    }

    /// Stops containerd (SIGKILL: its shims and containers run on) and starts it again
    /// with the same config, root and state, as a crash and `systemctl start` do.
    pub fn restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = self.dir().to_path_buf();
        self.child = spawn(
            &dir,
            &dir.join("containerd.toml"),
            &self.socket,
            &self.gpupin.config,
        );
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let started = Instant::now();
        while !self.ctr(&["version"]).status.success() {
            assert!(
                started.elapsed() < START_WAIT,
                "containerd did not answer: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The temp dir everything of this containerd lives in.
    pub fn dir(&self) -> &Path {
        self.gpupin.dir.path()
    }

    /// containerd's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr --address SOCKET ARGS`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        engines::command("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `gpupin status --json` of this containerd's gpupin config.
    pub fn status(&self) -> serde_json::Value {
        status::query(&self.gpupin.bin, &self.gpupin.config)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// containerd with everything in `dir`, its log appended to `containerd.log` there.
fn spawn(dir: &Path, config_file: &Path, socket: &Path, gpupin_config: &Path) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("containerd.log"))
        .unwrap();
    engines::command("containerd")
        .arg("--config")
        .arg(config_file)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state-containerd"))
        .arg("--address")
        .arg(socket)
        .env("GPUPIN_CONFIG", gpupin_config)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting containerd")
}

/// Whether the suites run on containerd 2.x (`GPUPIN_ENGINES=modern`), whose config is
/// version 3, rather than Debian's 1.6 (version 2).
pub fn is_v2() -> bool {
    engines::generation() == engines::Generation::Modern
}

/// A config of this containerd's version: `top` (top-level keys) and `tables`. containerd
/// 2.x's NRI plugin (on by default) serves one socket for the whole machine,
/// /var/run/nri/nri.sock, which every private containerd of the parallel tests (and any
/// other on the machine) would take over from the last: off, as gpupin does not use it.
pub fn config(top: &str, tables: &str) -> String {
    config_with_nri(top, tables, None)
}

/// `config`, with NRI on at `nri_socket` (containerd 2.x), a socket of the test's own:
/// the shipped section (k8s/nri/containerd-nri.toml) with the test's socket and its
/// plugin and plugin config dirs (`nri-plugins/`, `nri-conf.d/` beside the socket).
pub fn config_with_nri(top: &str, tables: &str, nri_socket: Option<&Path>) -> String {
    if !is_v2() {
        return format!("version = 2\n{top}{tables}");
    }
    let nri = match nri_socket {
        None => "[plugins.'io.containerd.nri.v1.nri']\n  disable = true\n".to_string(),
        Some(socket) => {
            let dir = socket.parent().unwrap();
            let shipped = std::fs::read_to_string(NRI_CONFIG).unwrap();
            let mut text = shipped.clone();
            for (from, to) in [
                ("/var/run/nri/nri.sock", socket.to_path_buf()),
                ("/opt/nri/plugins", dir.join("nri-plugins")),
                ("/etc/nri/conf.d", dir.join("nri-conf.d")),
            ] {
                assert!(text.contains(from), "{NRI_CONFIG} names no {from}");
                text = text.replace(from, to.to_str().unwrap());
            }
            text
        }
    };
    format!("version = 3\n{top}{tables}{nri}")
}

/// The shipped containerd 2.x NRI section.
const NRI_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/nri/containerd-nri.toml");

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn assert_ran(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}
