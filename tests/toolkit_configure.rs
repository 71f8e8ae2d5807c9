//! NVIDIA's own `nvidia-ctk runtime configure` (the toolkit built by tests/peers/build)
//! beside gpupin's own set-up, in both orders, as an admin of a GPU server runs them:
//! - Docker: `nvidia-ctk runtime configure --runtime=docker` and `gpupin install docker`
//!   on one daemon.json: both runtimes stay, gpupin's hands containers over to NVIDIA's
//!   once gpupin's install has seen it, and a real dockerd starts with the result and
//!   lists both.
//! - containerd 1.6/1.7: `--runtime=containerd` and k8s/containerd/gpupin-v2.toml
//!   appended to config.toml (docs/integrations.md, "The runtime handler"): `containerd config dump`
//!   shows both runtime handlers, and a real containerd loads its CRI plugin with them;
//!   with `GPUPIN_ENGINES=modern`, containerd 2.x with gpupin-v3.toml in the conf.d its
//!   config.toml imports, and dockerd 29 for the Docker cases.
//!
//! Root, dockerd, containerd and the peers are needed; elsewhere the test says why it
//! skips (under CI=true it fails instead).

use gpupin_sandbox::engines::{self, Generation};
use gpupin_sandbox::harness::toolkit::Peers;
use gpupin_sandbox::harness::{binary, need_root, required};
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const RUNTIME: &str = env!("CARGO_BIN_EXE_gpupin-runtime");
/// How long dockerd may take to answer (a readiness wait, no assertion).
const START_WAIT: Duration = Duration::from_secs(90);

/// The peers, `daemon` (dockerd or containerd) answering `--version`, and a temp dir with
/// a gpupin config; `None` (after saying why) where one is missing.
fn setup_with(test: &str, daemon: &str) -> Option<(Peers, tempfile::TempDir)> {
    if !need_root(test) {
        return None;
    }
    let peers = required(test, Peers::find())?;
    let version = engines::command(daemon)
        .arg("--version")
        .output()
        .map_err(|e| format!("{daemon}: {e}"));
    required(test, version)?;
    let dir = tempfile::Builder::new()
        .prefix(&format!("gpupin-toolkit-{daemon}-"))
        .tempdir()
        .unwrap();
    std::fs::write(
        dir.path().join("gpupin.toml"),
        "inventory = \"sim:nvswitch8\"\n",
    )
    .unwrap();
    Some((peers, dir))
}

fn setup(test: &str) -> Option<(Peers, tempfile::TempDir)> {
    setup_with(test, "dockerd")
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

/// The first successful answer of `ask` (its stdout) from the daemon `child` just
/// started, which is stopped then. A daemon that exits, or has not answered within
/// START_WAIT (a readiness wait, no assertion), fails the test with its `log`.
fn first_answer(
    mut child: Child,
    what: &str,
    log: &Path,
    mut ask: impl FnMut() -> Output,
) -> String {
    let start = Instant::now();
    loop {
        let out = ask();
        if out.status.success() {
            let _ = child.kill();
            let _ = child.wait();
            return String::from_utf8(out.stdout).unwrap();
        }
        let exited = child.try_wait().unwrap();
        if exited.is_some() || start.elapsed() > START_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{what} did not come up ({exited:?}): {log}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A dockerd of its own started with `daemon_json`: its runtimes and default runtime, as
/// `docker info` reports them.
fn dockerd_with(dir: &Path, daemon_json: &Path) -> (Vec<String>, String) {
    let sock = format!("unix://{}", dir.join("docker.sock").display());
    let log = std::fs::File::create(dir.join("dockerd.log")).unwrap();
    let child = engines::command("dockerd")
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
    let what = format!("dockerd with {}", daemon_json.display());
    let info = first_answer(child, &what, &dir.join("dockerd.log"), || {
        Command::new("docker")
            .args(["-H", &sock, "info", "--format"])
            .arg("{{json .Runtimes}}\t{{.DefaultRuntime}}")
            .output()
            .unwrap()
    });
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
/// again (docs/integrations.md, "Through NVIDIA's runtime or hook") makes it hand over to NVIDIA's.
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

/// The shipped containerd 1.6/1.7 handler, appended to config.toml as docs/integrations.md says.
const HANDLER_V2: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/containerd/gpupin-v2.toml");
/// The shipped containerd 2.x handler, a file in conf.d that config.toml imports.
const HANDLER_V3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/containerd/gpupin-v3.toml");

/// Whether this run's containerd is 2.x (`GPUPIN_ENGINES=modern`): its config is version
/// 3 (or later), its CRI runtime plugin `io.containerd.cri.v1.runtime`, and it merges an
/// imported file's plugin sections key by key.
fn containerd2() -> bool {
    engines::generation() == Generation::Modern
}

fn containerd_setup(test: &str) -> Option<(Peers, tempfile::TempDir)> {
    setup_with(test, "containerd")
}

/// config.toml as an admin starts from: `containerd config default`, which defines the
/// default runtime (runc) the CRI plugin needs. containerd 2.x's imports
/// /etc/containerd/conf.d/*.toml: the test's conf.d beside it instead.
fn containerd_default_config(config: &Path) {
    let out = engines::command("containerd")
        .args(["config", "default"])
        .output()
        .unwrap();
    assert!(out.status.success(), "containerd config default: {out:?}");
    let mut text = String::from_utf8(out.stdout).unwrap();
    if containerd2() {
        let conf_d = config.parent().unwrap().join("conf.d");
        std::fs::create_dir_all(&conf_d).unwrap();
        let imports = format!("imports = ['{}/*.toml']", conf_d.display());
        text = text
            .lines()
            .map(|l| match l.starts_with("imports = ") {
                true => imports.clone(),
                false => l.to_string(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            text.contains(&imports),
            "containerd 2's default imports conf.d: {text}"
        );
    }
    std::fs::write(config, text).unwrap();
}

/// gpupin's handler as docs/integrations.md says: 1.6/1.7 append gpupin-v2.toml to config.toml,
/// 2.x save gpupin-v3.toml in the conf.d config.toml imports.
fn append_gpupin_handler(config: &Path) {
    if containerd2() {
        let file = config.parent().unwrap().join("conf.d/gpupin.toml");
        std::fs::copy(HANDLER_V3, file).unwrap();
        return;
    }
    let handler = std::fs::read_to_string(HANDLER_V2).unwrap();
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push('\n');
    text.push_str(&handler);
    std::fs::write(config, text).unwrap();
}

/// `nvidia-ctk runtime configure --runtime=containerd`, with its drop-in beside the test's
/// config (its default is /etc/containerd/conf.d/99-nvidia.toml).
fn nvidia_ctk_containerd(peers: &Peers, config: &Path) {
    let drop_in = config.parent().unwrap().join("conf.d/99-nvidia.toml");
    let out = Command::new(peers.tool("nvidia-ctk"))
        .args(["runtime", "configure", "--runtime=containerd", "--config"])
        .arg(config)
        .arg("--drop-in-config")
        .arg(&drop_in)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvidia-ctk runtime configure --runtime=containerd: {out:?}"
    );
}

/// The CRI plugin's runtime handlers in containerd's merged config (`containerd config
/// dump`, imports applied), each with the binary its runc shim runs ("" for runc).
fn handlers(config: &Path) -> Vec<(String, String)> {
    let out = engines::command("containerd")
        .arg("--config")
        .arg(config)
        .args(["config", "dump"])
        .output()
        .unwrap();
    assert!(out.status.success(), "containerd config dump: {out:?}");
    let dump: toml::Table = toml::from_str(&String::from_utf8(out.stdout).unwrap()).unwrap();
    let plugin = match containerd2() {
        true => "io.containerd.cri.v1.runtime",
        false => "io.containerd.grpc.v1.cri",
    };
    let runtimes = dump["plugins"][plugin]["containerd"]["runtimes"]
        .as_table()
        .unwrap();
    runtimes
        .iter()
        .map(|(name, runtime)| {
            let binary = runtime
                .get("options")
                .and_then(|o| o.get("BinaryName"))
                .and_then(|b| b.as_str())
                .unwrap_or_default();
            (name.clone(), binary.to_string())
        })
        .collect()
}

fn both_handlers() -> Vec<(String, String)> {
    vec![
        ("gpupin".into(), "/usr/bin/gpupin-runtime".into()),
        ("nvidia".into(), "/usr/bin/nvidia-container-runtime".into()),
        ("runc".into(), String::new()),
    ]
}

/// Starts a containerd of its own with `config` and says whether its CRI plugin loaded
/// (`ctr plugins ls`: a CRI config containerd refuses leaves the plugin in `error`).
fn cri_plugin_loads(dir: &Path, config: &Path) -> bool {
    let socket = dir.join("containerd.sock");
    let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
    let child = engines::command("containerd")
        .arg("--config")
        .arg(config)
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--address")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting containerd");
    let plugins = first_answer(child, "containerd", &dir.join("containerd.log"), || {
        engines::command("ctr")
            .arg("--address")
            .arg(&socket)
            .args(["plugins", "ls"])
            .output()
            .unwrap()
    });
    // The CRI plugin (`io.containerd.grpc.v1 cri`), and on 2.x the runtime plugin the
    // handlers live in (`io.containerd.cri.v1 runtime`): each must be `ok`.
    let wanted: &[(&str, &str)] = match containerd2() {
        true => &[
            ("io.containerd.grpc.v1", "cri"),
            ("io.containerd.cri.v1", "runtime"),
        ],
        false => &[("io.containerd.grpc.v1", "cri")],
    };
    wanted.iter().all(|(kind, id)| {
        plugins.lines().any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() >= 4
                && fields[0] == *kind
                && fields[1] == *id
                && fields[fields.len() - 1] == "ok"
        })
    })
}

#[test]
fn gpupin_handler_first_then_nvidia_ctk_containerd_keeps_both() {
    let test = "gpupin_handler_first_then_nvidia_ctk_containerd_keeps_both";
    let Some((peers, dir)) = containerd_setup(test) else {
        return;
    };
    let config = dir.path().join("config.toml");
    containerd_default_config(&config);
    append_gpupin_handler(&config);
    nvidia_ctk_containerd(&peers, &config);
    assert_eq!(handlers(&config), both_handlers());
    assert!(cri_plugin_loads(dir.path(), &config));
}

/// The other order. On containerd 1.6/1.7 it loses gpupin's handler: they let the
/// drop-in nvidia-ctk imports replace config.toml's whole CRI section; running nvidia-ctk
/// again (docs/integrations.md, "The runtime handler") copies gpupin's handler into its drop-in, and
/// both are there. containerd 2.x merges the two files key by key: both at once.
#[test]
fn nvidia_ctk_containerd_first_needs_it_again_after_gpupins_handler() {
    let test = "nvidia_ctk_containerd_first_needs_it_again_after_gpupins_handler";
    let Some((peers, dir)) = containerd_setup(test) else {
        return;
    };
    let config = dir.path().join("config.toml");
    containerd_default_config(&config);
    nvidia_ctk_containerd(&peers, &config);
    append_gpupin_handler(&config);
    if containerd2() {
        assert_eq!(handlers(&config), both_handlers());
        assert!(cri_plugin_loads(dir.path(), &config));
        return;
    }
    let names: Vec<String> = handlers(&config).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["nvidia", "runc"], "gpupin's handler is lost");
    nvidia_ctk_containerd(&peers, &config);
    assert_eq!(handlers(&config), both_handlers());
    assert!(cri_plugin_loads(dir.path(), &config));
}
