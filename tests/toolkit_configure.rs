//! NVIDIA's own `nvidia-ctk runtime configure --runtime=docker` (the toolkit built by
//! tests/peers/build) and `gpupin install docker` on one daemon.json, in both orders, as
//! an admin of a GPU server runs them: both runtimes stay, gpupin's hands containers over
//! to NVIDIA's once gpupin's install has seen it, and a real dockerd starts with the
//! result and lists both. Root, dockerd and the peers are needed; elsewhere the test says
//! why it skips (under CI=true it fails instead).

use gpupin_sandbox::harness::toolkit::Peers;
use gpupin_sandbox::harness::{binary, need_root, required};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const RUNTIME: &str = env!("CARGO_BIN_EXE_gpupin-runtime");
/// How long dockerd may take to answer (a readiness wait, no assertion).
const START_WAIT: Duration = Duration::from_secs(90);

fn setup(test: &str) -> Option<(Peers, tempfile::TempDir)> {
    if !need_root(test) {
        return None;
    }
    let peers = required(test, Peers::find())?;
    let dockerd = Command::new("dockerd")
        .arg("--version")
        .output()
        .map_err(|e| format!("dockerd: {e}"));
    required(test, dockerd)?;
    let dir = tempfile::Builder::new()
        .prefix("gpupin-toolkit-configure-")
        .tempdir()
        .unwrap();
    std::fs::write(
        dir.path().join("gpupin.toml"),
        "inventory = \"sim:nvswitch8\"\n",
    )
    .unwrap();
    Some((peers, dir))
}

fn nvidia_ctk_configure(peers: &Peers, daemon_json: &Path, extra: &[&str]) {
    let out = Command::new(peers.tool("nvidia-ctk"))
        .args(["runtime", "configure", "--runtime=docker", "--config"])
        .arg(daemon_json)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvidia-ctk runtime configure: {out:?}"
    );
}

fn gpupin_install(dir: &Path, daemon_json: &Path) -> String {
    let out = Command::new(binary(GPUPIN))
        .arg("--config")
        .arg(dir.join("gpupin.toml"))
        .args(["install", "docker", "--daemon-json"])
        .arg(daemon_json)
        .arg("--pidfile")
        .arg(dir.join("no.pid"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "gpupin install docker: {stderr}");
    stderr
}

fn read(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// gpupin's entry handing containers over to NVIDIA's runtime.
fn handing_over(dir: &Path) -> Value {
    json!({
        "path": binary(RUNTIME).display().to_string(),
        "runtimeArgs": [
            "--gpupin-config",
            dir.join("gpupin.toml").display().to_string(),
            "--gpupin-runtime",
            "nvidia-container-runtime"
        ]
    })
}

/// NVIDIA's entry as nvidia-ctk writes it.
fn nvidias() -> Value {
    json!({"args": [], "path": "nvidia-container-runtime"})
}

/// A dockerd of its own started with `daemon_json`: its runtimes and default runtime, as
/// `docker info` reports them.
fn dockerd_with(dir: &Path, daemon_json: &Path) -> (Vec<String>, String) {
    let sock = format!("unix://{}", dir.join("docker.sock").display());
    let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
    let mut child = Command::new("dockerd")
        .arg("--data-root")
        .arg(dir.join("root"))
        .arg("--exec-root")
        .arg(dir.join("exec"))
        .args(["-H", &sock])
        .arg("--pidfile")
        .arg(dir.join("docker.pid"))
        .arg("--config-file")
        .arg(daemon_json)
        .args([
            "--storage-driver",
            "vfs",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting dockerd");
    let start = Instant::now();
    let info = loop {
        let out = Command::new("docker")
            .args(["-H", &sock, "info", "--format"])
            .arg("{{json .Runtimes}}\t{{.DefaultRuntime}}")
            .output()
            .unwrap();
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap();
        }
        let exited = child.try_wait().unwrap();
        if exited.is_some() || start.elapsed() > START_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default();
            panic!(
                "dockerd did not come up with {} ({exited:?}): {log}",
                daemon_json.display()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = child.kill();
    let _ = child.wait();
    let (runtimes, default) = info.trim().split_once('\t').unwrap();
    let runtimes: Value = serde_json::from_str(runtimes).unwrap();
    let mut names: Vec<String> = runtimes.as_object().unwrap().keys().cloned().collect();
    names.sort();
    (names, default.to_string())
}

#[test]
fn nvidia_ctk_first_then_gpupin_install_keeps_both_and_hands_over() {
    let test = "nvidia_ctk_first_then_gpupin_install_keeps_both_and_hands_over";
    let Some((peers, dir)) = setup(test) else {
        return;
    };
    let daemon_json = dir.path().join("daemon.json");
    nvidia_ctk_configure(&peers, &daemon_json, &["--set-as-default"]);
    let note = gpupin_install(dir.path(), &daemon_json);
    assert!(
        note.contains("daemon.json has NVIDIA's runtime \"nvidia\" (nvidia-container-runtime, the default): gpupin-runtime hands containers over to it"),
        "{note}"
    );
    let installed = read(&daemon_json);
    assert_eq!(installed["default-runtime"], "nvidia");
    assert_eq!(installed["runtimes"]["nvidia"], nvidias());
    assert_eq!(installed["runtimes"]["gpupin"], handing_over(dir.path()));
    let (runtimes, default) = dockerd_with(dir.path(), &daemon_json);
    assert!(
        runtimes.contains(&"gpupin".to_string()) && runtimes.contains(&"nvidia".to_string()),
        "{runtimes:?}"
    );
    assert_eq!(default, "nvidia");
}

/// The other order: nvidia-ctk keeps gpupin's entry as it was, which hands over to runc
/// (gpupin installed before NVIDIA's runtime was there); running `gpupin install docker`
/// again (README, "Through NVIDIA's runtime or hook") makes it hand over to NVIDIA's.
#[test]
fn gpupin_install_first_then_nvidia_ctk_keeps_both_and_a_reinstall_hands_over() {
    let test = "gpupin_install_first_then_nvidia_ctk_keeps_both_and_a_reinstall_hands_over";
    let Some((peers, dir)) = setup(test) else {
        return;
    };
    let daemon_json = dir.path().join("daemon.json");
    std::fs::write(&daemon_json, "{}\n").unwrap();
    gpupin_install(dir.path(), &daemon_json);
    let before = read(&daemon_json)["runtimes"]["gpupin"].clone();
    assert_eq!(
        before["runtimeArgs"],
        json!([
            "--gpupin-config",
            dir.path().join("gpupin.toml").display().to_string()
        ])
    );
    nvidia_ctk_configure(&peers, &daemon_json, &["--set-as-default"]);
    let configured = read(&daemon_json);
    assert_eq!(
        configured["runtimes"]["gpupin"], before,
        "nvidia-ctk kept gpupin's entry"
    );
    assert_eq!(configured["runtimes"]["nvidia"], nvidias());
    assert_eq!(configured["default-runtime"], "nvidia");
    gpupin_install(dir.path(), &daemon_json);
    let reinstalled = read(&daemon_json);
    assert_eq!(reinstalled["runtimes"]["gpupin"], handing_over(dir.path()));
    assert_eq!(reinstalled["runtimes"]["nvidia"], nvidias());
    assert_eq!(reinstalled["default-runtime"], "nvidia");
    let (runtimes, default) = dockerd_with(dir.path(), &daemon_json);
    assert!(
        runtimes.contains(&"gpupin".to_string()) && runtimes.contains(&"nvidia".to_string()),
        "{runtimes:?}"
    );
    assert_eq!(default, "nvidia");
}
