//! Harness for the podman end-to-end tests: real podman with `--runtime runc`, the hooks
//! written by `gpupin install podman`, and a simulated 8-GPU machine.
//!
//! Each test gets its own podman storage (`--root`, `--runroot`, `--tmpdir`), hooks dir,
//! gpupin config and state dir under one temp dir, so tests run in parallel without
//! seeing each other's containers or GPUs; dropping the harness removes its containers.
//!
//! The skip rule, the rootfs, status queries and the GPU-node filter are
//! gpupin-sandbox's, shared with the other suites.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub use gpupin_sandbox::harness::gpu_nodes;
use gpupin_sandbox::harness::{self, status};
use gpupin_sandbox::{build_busybox_rootfs, find_static_busybox, is_root};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// gpupin, as cargo built it or from `$GPUPIN_BIN_DIR`.
fn gpupin_bin() -> PathBuf {
    gpupin_sandbox::harness::binary(env!("CARGO_BIN_EXE_gpupin"))
}
/// Podman here needs explicit ulimits (DESIGN.md, "Tests on this machine kind").
const CONTAINERS_CONF: &str =
    "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n";

pub struct Podman {
    dir: tempfile::TempDir,
    /// Prefix of this test's container names.
    test: String,
    runtime: String,
}

/// What a test needs from gpupin's config beyond the simulated machine.
#[derive(Default)]
pub struct Options {
    /// `claim_grace` in the config, e.g. "2s".
    pub claim_grace: Option<&'static str>,
    /// Install the hooks with `--always` (env requests).
    pub always: bool,
    /// The simulated machine; `sim:nvswitch8` when `None`.
    pub machine: Option<&'static str>,
}

/// A harness for `test`, or `None` (after saying why) where podman cannot run here.
/// Under CI=true a missing prerequisite fails the test instead: CI must not go green by
/// skipping.
pub fn setup(test: &str, options: Options) -> Option<Podman> {
    harness::required(test, prerequisites())?;
    let podman = Podman {
        dir: tempfile::Builder::new()
            .prefix("gpupin-podman-")
            .tempdir()
            .expect("temp dir"),
        test: test.replace('_', "-"),
        runtime: "runc".into(),
    };
    podman.write_files(&options);
    podman.install_hooks(options.always);
    Some(podman)
}

/// What podman needs here, or why it cannot run. The bench asks this itself: it says why
/// and exits 0 where a test would fail under CI=true.
pub fn prerequisites() -> Result<(), String> {
    if !is_root() {
        return Err("needs root (podman with runc and device nodes)".into());
    }
    for tool in ["podman", "runc"] {
        let ran = Command::new(tool).arg("--version").output();
        if !ran.is_ok_and(|o| o.status.success()) {
            return Err(format!("{tool} is not installed or does not run"));
        }
    }
    find_static_busybox().map(|_| ())
}

impl Podman {
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn config_path(&self) -> PathBuf {
        self.path("gpupin.toml")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("state")
    }

    pub fn hooks_dir(&self) -> PathBuf {
        self.path("hooks.d")
    }

    pub fn rootfs(&self) -> PathBuf {
        self.path("rootfs")
    }

    /// A container name unique to this test.
    pub fn name(&self, n: usize) -> String {
        format!("{}-{n}", self.test)
    }

    fn write_files(&self, options: &Options) {
        let mut toml = format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = {:?}\n",
            self.state_dir(),
            self.state_dir().join("audit.log"),
            options.machine.unwrap_or("sim:nvswitch8")
        );
        if let Some(grace) = options.claim_grace {
            toml.push_str(&format!("claim_grace = {grace:?}\n"));
        }
        std::fs::write(self.config_path(), toml).unwrap();
        std::fs::write(self.path("containers.conf"), CONTAINERS_CONF).unwrap();
        let busybox = find_static_busybox().unwrap();
        build_busybox_rootfs(&busybox, &self.rootfs()).unwrap();
    }

    /// The hooks dir is filled by `gpupin install podman`, so that install is what the
    /// tests exercise, not hand-written files.
    fn install_hooks(&self, always: bool) {
        let hooks = self.hooks_dir();
        let mut args = vec!["install", "podman", "--dir", hooks.to_str().unwrap()];
        if always {
            args.push("--always");
        }
        let out = self.gpupin(&args);
        assert_success("gpupin install podman", &out);
    }

    /// Later `podman` commands use `runtime` (a path or a name) instead of runc.
    pub fn set_runtime(&mut self, runtime: &Path) {
        self.runtime = runtime.display().to_string();
    }

    /// `podman` with this test's storage, hooks and runtime.
    pub fn podman(&self) -> Command {
        self.podman_with_hooks(&self.hooks_dir())
    }

    /// `podman` with this test's storage and runtime, and the hooks in `hooks_dir` only
    /// (an empty dir: no hooks at all, the default dirs included).
    pub fn podman_with_hooks(&self, hooks_dir: &Path) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", self.path("containers.conf"));
        for (flag, dir) in [
            ("--root", "root"),
            ("--runroot", "runroot"),
            ("--tmpdir", "tmp"),
        ] {
            cmd.arg(flag).arg(self.path(dir));
        }
        cmd.args(["--storage-driver", "vfs", "--cgroup-manager", "cgroupfs"]);
        cmd.args(["--events-backend", "file", "--runtime", &self.runtime]);
        cmd.arg("--hooks-dir").arg(hooks_dir);
        cmd
    }

    /// `podman [global] run --name NAME --network none OPTIONS --rootfs ROOTFS CMD...`:
    /// with `--rootfs` the first argument after the options is the rootfs, not an image.
    pub fn run(&self, global: &[&str], name: &str, options: &[&str], cmd: &[&str]) -> Output {
        let mut command = self.podman();
        command
            .args(global)
            .args(["run", "--name", name, "--network", "none"])
            .args(options)
            .arg("--rootfs")
            .arg(self.rootfs())
            .args(cmd);
        command.output().expect("running podman")
    }

    /// Starts a detached `sleep` container with `args` (annotations, env) and returns its
    /// full id.
    pub fn start(&self, name: &str, args: &[&str]) -> String {
        let options = [&["-d"], args].concat();
        let out = self.run(&[], name, &options, &["sleep", "1000"]);
        assert_success(&format!("podman run -d {name}"), &out);
        let id = String::from_utf8(out.stdout).unwrap().trim().to_string();
        assert_eq!(id.len(), 64, "podman run -d prints the full id: {id:?}");
        id
    }

    /// The rootfs as image `reference` in this test's storage (`podman import`: no
    /// registry is needed).
    pub fn import_image(&self, reference: &str) {
        let tar = self.path("rootfs.tar");
        let out = Command::new("tar")
            .arg("-C")
            .arg(self.rootfs())
            .arg("-cf")
            .arg(&tar)
            .arg(".")
            .output()
            .expect("running tar");
        assert_success("tar of the rootfs", &out);
        let out = self
            .podman()
            .args(["import", "--quiet"])
            .arg(&tar)
            .arg(reference)
            .output()
            .expect("running podman import");
        assert_success("podman import", &out);
    }

    /// Like `start`, from `image` rather than the rootfs.
    pub fn start_image(&self, name: &str, image: &str, args: &[&str]) -> String {
        let out = self
            .podman()
            .args(["run", "-d", "--name", name, "--network", "none"])
            .args(args)
            .args([image, "sleep", "1000"])
            .output()
            .expect("running podman");
        assert_success(&format!("podman run -d {name} {image}"), &out);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Removes a container at once (`sleep` as pid 1 ignores SIGTERM).
    pub fn remove(&self, name: &str) {
        let out = self
            .podman()
            .args(["rm", "-f", "-t", "0", name])
            .output()
            .unwrap();
        assert_success(&format!("podman rm -f {name}"), &out);
    }

    /// `/dev` entries and the env of pid 1 inside a running container. The env is read
    /// from /proc/1/environ: `podman exec` would show podman's idea of the env, not the
    /// spec gpupin edited.
    pub fn inside(&self, name: &str) -> (Vec<String>, Vec<String>) {
        let script = "ls /dev; echo ---; tr '\\0' '\\n' < /proc/1/environ";
        let out = self
            .podman()
            .args(["exec", name, "sh", "-c", script])
            .output()
            .unwrap();
        assert_success(&format!("podman exec {name}"), &out);
        let text = String::from_utf8(out.stdout).unwrap();
        let (dev, env) = text.split_once("---\n").expect("separator");
        (lines(dev), lines(env))
    }

    pub fn gpupin(&self, args: &[&str]) -> Output {
        Command::new(gpupin_bin())
            .arg("--config")
            .arg(self.config_path())
            .args(args)
            .env_remove("GPUPIN_CONFIG")
            .output()
            .expect("running gpupin")
    }

    pub fn status(&self) -> Value {
        status::query(&gpupin_bin(), &self.config_path())
    }

    pub fn holders(&self) -> Vec<Value> {
        status::holders(&self.status())
    }

    /// The (uuid, minor) of each GPU `holder` holds, from `gpupin status --json`.
    pub fn gpus_of(&self, holder: &str) -> Vec<(String, u64)> {
        status::held_gpus(&self.status(), holder)
    }

    pub fn audit_log(&self) -> String {
        std::fs::read_to_string(self.state_dir().join("audit.log")).unwrap_or_default()
    }

    /// The audit log's lines as JSON.
    pub fn audit_lines(&self) -> Vec<Value> {
        self.audit_log()
            .lines()
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("audit line {l:?} is no JSON: {e}"))
            })
            .collect()
    }

    /// The audit log's lines as (event, holder).
    pub fn audit_events(&self) -> Vec<(String, String)> {
        self.audit_log()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("audit line {l:?} is no JSON: {e}"));
                let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
                (field("event"), field("holder"))
            })
            .collect()
    }

    /// A runtime that refuses `create` and passes everything else to runc: a container
    /// whose precreate claim is never bound.
    pub fn failing_runtime(&self) -> PathBuf {
        let path = self.path("failing-runtime");
        let script = "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then\n    \
                      echo 'failing-runtime: refusing create' >&2\n    exit 1\n  fi\ndone\n\
                      exec runc \"$@\"\n";
        std::fs::write(&path, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Best effort: a failed test must not leave containers running.
        let _ = self.podman().args(["rm", "-a", "-f", "-t", "0"]).output();
    }
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

pub fn combined(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn assert_success(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}",
        out.status,
        combined(out)
    );
}

/// The value of `key` in `env` (`KEY=VALUE` lines), the last one winning.
pub fn env_value<'a>(env: &'a [String], key: &str) -> Option<&'a str> {
    env.iter()
        .rev()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}
