//! A private containerd for the containerd suites: its own root, state dir, socket and
//! config in a gpupin temp dir, gpupin's config in its environment (GPUPIN_CONFIG), which
//! the runc shim and so gpupin-runtime inherit. Stopped when dropped.

use gpupin_sandbox::harness::{self, Gpupin, status};
use gpupin_sandbox::{find_on_path, find_static_busybox, is_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
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
    for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"]
        .iter()
        .chain(tools)
    {
        find_on_path(tool).ok_or(format!("{tool} is not installed"))?;
    }
    find_static_busybox().map(|_| ())
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
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config_file)
            .arg("--root")
            .arg(dir.join("root"))
            .arg("--state")
            .arg(dir.join("state-containerd"))
            .arg("--address")
            .arg(&socket)
            .env("GPUPIN_CONFIG", &gpupin.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting containerd");
        let c = Containerd {
            child,
            socket,
            gpupin,
        };
        let started = Instant::now();
        while !c.ctr(&["version"]).status.success() {
            assert!(
                started.elapsed() < START_WAIT,
                "containerd did not answer: {}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(c)
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
        Command::new("ctr")
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
