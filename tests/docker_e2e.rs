//! gpupin-runtime under a real dockerd and docker-compose, on a simulated 8-GPU machine.
//!
//! Needs root, dockerd, docker, runc, busybox (and docker-compose for the compose
//! tests); without them each test prints why it is skipped, and fails under CI=true.
//! Every test has its own runtime entry and ledger (see docker_support), so they run in
//! parallel: `cargo test --test docker_e2e -- --test-threads=2`.

mod docker_support;

use docker_support::{
    ComposeProject, Harness, IMAGE, Need, Slot, gpu_nodes, harness, ok, text, visible, write,
    write_capture_script,
};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const CONTROL_NODES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// The container holds exactly `count` GPUs in the ledger, sees exactly their nodes and
/// the control nodes, and its NVIDIA_VISIBLE_DEVICES names exactly their UUIDs.
fn assert_pinned(slot: &Slot, c: &docker_support::Container, count: usize) -> Vec<String> {
    let holders = slot.holders();
    let gpus = holders
        .get(&c.id)
        .unwrap_or_else(|| panic!("no record for {}: {holders:?}", c.id));
    assert_eq!(gpus.len(), count, "record of {}: {gpus:?}", c.id);
    assert_eq!(
        c.visible(),
        *gpus,
        "NVIDIA_VISIBLE_DEVICES vs gpupin status"
    );
    let minors = slot.minors();
    let want: BTreeSet<String> = gpus
        .iter()
        .map(|u| format!("nvidia{}", minors[u]))
        .collect();
    let seen: BTreeSet<String> = c.gpu_nodes().into_iter().collect();
    assert_eq!(seen, want, "GPU nodes in /dev");
    let dev = c.exec(&["ls", "/dev"]);
    for node in CONTROL_NODES {
        assert!(
            dev.split_whitespace().any(|n| n == node),
            "{node} missing from /dev: {dev}"
        );
    }
    gpus.clone()
}

#[test]
fn label_count_pins_two_gpus() {
    let Some(h) = harness("label_count_pins_two_gpus", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let c = h.start(&slot.runtime, &["-l", "gpupin.count=2"]);
    assert_pinned(&slot, &c, 2);
    drop(c);
    assert!(
        slot.holders().is_empty(),
        "rm -f released: {:?}",
        slot.holders()
    );
}

#[test]
fn status_and_audit_name_the_docker_container_and_its_image() {
    let Some(h) = harness(
        "status_and_audit_name_the_docker_container_and_its_image",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    let name = format!("gpupin-named-{}", std::process::id());
    let c = h.start(&slot.runtime, &["--name", &name, "-l", "gpupin.count=1"]);
    let status = slot.status();
    let holder = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["id"] == c.id.as_str())
        .unwrap_or_else(|| panic!("no holder {}: {status:#}", c.id));
    assert_eq!(holder["kind"], "container", "{status:#}");
    assert_eq!(
        holder["container"],
        serde_json::json!({"engine": "docker", "name": name, "image": IMAGE}),
        "{status:#}"
    );
    let audit = std::fs::read_to_string(slot.state.join("audit.log")).unwrap();
    let allocation: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|l| l["event"] == "allocate" && l["holder"] == c.id.as_str())
        .unwrap_or_else(|| panic!("no allocate line for {}: {audit}", c.id));
    assert_eq!(allocation["engine"], "docker", "{allocation}");
    assert_eq!(allocation["name"], name.as_str(), "{allocation}");
    assert_eq!(allocation["image"], IMAGE, "{allocation}");
    let table = ok(Command::new(docker_support::gpupin_bin())
        .arg("--config")
        .arg(&slot.config)
        .args(["status", "--long"])
        .env_remove("GPUPIN_CONFIG"));
    let row = table
        .lines()
        .find(|l| l.contains(&name))
        .unwrap_or_else(|| panic!("no row names {name}: {table}"));
    assert!(row.contains(" docker ") && row.contains(IMAGE), "{table}");
}

#[test]
fn env_count_pins_two_gpus() {
    let Some(h) = harness("env_count_pins_two_gpus", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let c = h.start(&slot.runtime, &["-e", "GPUPIN_COUNT=2"]);
    assert_pinned(&slot, &c, 2);
}

/// Docker >= 24 passes `--annotation` into the spec; the server must be that new, not
/// only the client (an older daemon drops them).
fn docker_passes_annotations(h: &Harness) -> bool {
    let server = ok(h.docker().args(["version", "-f", "{{.Server.Version}}"]));
    let major: u32 = server
        .trim()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let help = ok(h.docker().args(["run", "--help"]));
    major >= 24 && help.contains("--annotation")
}

#[test]
fn annotation_count_pins_two_gpus() {
    let Some(h) = harness("annotation_count_pins_two_gpus", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    if docker_passes_annotations(h) {
        let c = h.start(&slot.runtime, &["--annotation", "gpupin.count=2"]);
        assert_pinned(&slot, &c, 2);
        return;
    }
    docker_support::say(
        "annotation_count_pins_two_gpus: docker < 24 cannot pass annotations; \
         driving gpupin-runtime directly as runc would be driven",
    );
    annotation_through_the_shim(h, &slot);
}

/// gpupin-runtime run as containerd runs runc: create on a bundle whose spec carries
/// `gpupin.count=2`, then start, state, kill, delete.
fn annotation_through_the_shim(h: &Harness, slot: &Slot) {
    let bundle = RuncBundle::new(h, slot, "gpupin-annotation-test");
    bundle.shim(&[
        "create",
        "--bundle",
        bundle.dir.to_str().unwrap(),
        &bundle.id,
    ]);
    let holders = slot.holders();
    let gpus = holders.get(&bundle.id).expect("create allocated");
    assert_eq!(gpus.len(), 2);
    bundle.runc(&["start", &bundle.id]);
    let env = ok(&mut bundle.runc_cmd(&["exec", &bundle.id, "cat", "/proc/1/environ"]));
    let env: Vec<String> = env
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect();
    assert_eq!(visible(&env), *gpus);
    let minors = slot.minors();
    let want: BTreeSet<String> = gpus
        .iter()
        .map(|u| format!("nvidia{}", minors[u]))
        .collect();
    let ls = ok(&mut bundle.runc_cmd(&["exec", &bundle.id, "ls", "/dev"]));
    let seen: BTreeSet<String> = gpu_nodes(ls.split_whitespace()).into_iter().collect();
    assert_eq!(seen, want);
    bundle.runc(&["kill", &bundle.id, "KILL"]);
    bundle.wait_stopped();
    bundle.shim(&["delete", &bundle.id]);
    assert!(
        slot.holders().is_empty(),
        "delete released: {:?}",
        slot.holders()
    );
}

/// A runc bundle over the harness's busybox rootfs, deleted (runc delete -f) on drop.
struct RuncBundle {
    dir: PathBuf,
    root: PathBuf,
    id: String,
    config: PathBuf,
}

impl RuncBundle {
    fn new(h: &Harness, slot: &Slot, id: &str) -> RuncBundle {
        let dir = slot.dir.join("bundle");
        std::fs::create_dir_all(&dir).unwrap();
        ok(gpupin_sandbox::harness::engines::command("runc")
            .args(["spec", "--bundle"])
            .arg(&dir));
        let path = dir.join("config.json");
        let mut spec: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        spec["root"]["path"] = Value::from(h.rootfs.to_str().unwrap());
        spec["process"]["terminal"] = Value::Bool(false);
        spec["process"]["args"] = serde_json::json!(["sleep", "1000000"]);
        spec["annotations"] = serde_json::json!({"gpupin.count": "2"});
        write(&path, &spec.to_string());
        RuncBundle {
            root: slot.dir.join("runc-root"),
            dir,
            id: id.into(),
            config: slot.config.clone(),
        }
    }

    /// gpupin-runtime with runc's global options before the command, as containerd
    /// passes them. The container inherits stdio: files, so nothing waits on a pipe.
    fn shim(&self, args: &[&str]) {
        let log = std::fs::File::create(self.dir.join(format!("{}.log", args[0]))).unwrap();
        let status = Command::new(docker_support::runtime_bin())
            // The runc it runs is the engines' generation's, as under containerd.
            .env("PATH", gpupin_sandbox::harness::engines::path())
            .arg("--gpupin-config")
            .arg(&self.config)
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .status()
            .unwrap();
        let log = std::fs::read_to_string(self.dir.join(format!("{}.log", args[0]))).unwrap();
        assert!(status.success(), "gpupin-runtime {args:?}: {status}: {log}");
    }

    fn runc_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = gpupin_sandbox::harness::engines::command("runc");
        cmd.arg("--root").arg(&self.root).args(args);
        cmd
    }

    fn runc(&self, args: &[&str]) {
        ok(self.runc_cmd(args).stdin(Stdio::null()));
    }

    /// Waits until runc reports the killed container stopped (no deadline: a hang is a
    /// bug the test runner's own timeout shows).
    fn wait_stopped(&self) {
        loop {
            let state: Value =
                serde_json::from_str(&ok(&mut self.runc_cmd(&["state", &self.id]))).unwrap();
            if state["status"] == "stopped" {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

impl Drop for RuncBundle {
    fn drop(&mut self) {
        let _ = self.runc_cmd(&["delete", "-f", &self.id]).output();
    }
}

fn compose_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docker")
        .join(name)
}

fn up<'h>(h: &'h Harness, project: &str, file: &str, extra: &[&str]) -> ComposeProject<'h> {
    let p = ComposeProject {
        harness: h,
        project: project.into(),
        file: compose_file(file),
    };
    ok(p.cmd().args(["up", "-d"]).args(extra));
    p
}

#[test]
fn compose_label_gets_one_gpu() {
    let Some(h) = harness("compose_label_gets_one_gpu", Need::Compose) else {
        return;
    };
    let (_lock, slot) = h.compose_slot();
    let p = up(h, "gpupinlabels", "compose-labels.yml", &[]);
    let ids = p.ids();
    assert_eq!(ids.len(), 1);
    let holders = slot.holders();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[&ids[0]].len(), 1);
    ok(p.cmd().args(["down", "--timeout", "1"]));
    assert!(
        slot.holders().is_empty(),
        "down released: {:?}",
        slot.holders()
    );
}

#[test]
fn compose_scaled_workers_get_distinct_gpus() {
    let Some(h) = harness("compose_scaled_workers_get_distinct_gpus", Need::Compose) else {
        return;
    };
    let (_lock, slot) = h.compose_slot();
    let p = up(
        h,
        "gpupinscaled",
        "compose-scaled.yml",
        &["--scale", "worker=4"],
    );
    let ids: BTreeSet<String> = p.ids().into_iter().collect();
    assert_eq!(ids.len(), 4);
    let holders = slot.holders();
    assert_eq!(holders.keys().cloned().collect::<BTreeSet<_>>(), ids);
    let gpus: BTreeSet<&String> = holders.values().flatten().collect();
    assert_eq!(gpus.len(), 4, "4 workers, 4 different GPUs: {holders:?}");
    ok(p.cmd().args(["down", "--timeout", "1"]));
    assert!(
        slot.holders().is_empty(),
        "down released all 4: {:?}",
        slot.holders()
    );
}

#[test]
fn compose_device_reservation_is_pinned() {
    let Some(h) = harness("compose_device_reservation_is_pinned", Need::Compose) else {
        return;
    };
    let (_lock, slot) = h.compose_slot();
    let p = up(h, "gpupinreserve", "compose-reservations.yml", &[]);
    let ids = p.ids();
    assert_eq!(ids.len(), 1);
    let status = slot.status();
    let holder = &status["holders"][0];
    assert_eq!(holder["id"], ids[0].as_str());
    assert_eq!(holder["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(holder["request"]["origin"], "docker_gpus");
    // deploy.resources.reservations.devices is --gpus: NVIDIA's hook reads gpupin's choice.
    let uuids: Vec<&str> = holder["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(
        h.nvidia_hook_saw(&ids[0]),
        [format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))]
    );
    ok(p.cmd().args(["down", "--timeout", "1"]));
    assert!(slot.holders().is_empty());
}

#[test]
fn run_rm_and_rm_f_release() {
    let Some(h) = harness("run_rm_and_rm_f_release", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let out = ok(h
        .docker()
        .args([
            "run",
            "--rm",
            "--network",
            "none",
            "--runtime",
            &slot.runtime,
        ])
        .args(["-l", "gpupin.count=1", IMAGE, "ls", "/dev"]));
    assert_eq!(
        gpu_nodes(out.split_whitespace()).len(),
        1,
        "the container saw its GPU: {out}"
    );
    assert!(
        slot.holders().is_empty(),
        "--rm released: {:?}",
        slot.holders()
    );
    let c = h.start(&slot.runtime, &["-l", "gpupin.count=1"]);
    assert_eq!(slot.holders().len(), 1);
    ok(h.docker().args(["rm", "-f", &c.id]));
    assert!(
        slot.holders().is_empty(),
        "rm -f released: {:?}",
        slot.holders()
    );
}

#[test]
fn restart_keeps_one_record() {
    let Some(h) = harness("restart_keeps_one_record", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let c = h.start(&slot.runtime, &["-l", "gpupin.count=2"]);
    assert_pinned(&slot, &c, 2);
    ok(h.docker().args(["restart", "-t", "1", &c.id]));
    assert_eq!(
        slot.holders().len(),
        1,
        "one record after restart: {:?}",
        slot.holders()
    );
    assert_pinned(&slot, &c, 2);
}

#[test]
fn ninth_container_on_eight_gpus_fails_visibly() {
    let Some(h) = harness("ninth_container_on_eight_gpus_fails_visibly", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let running: Vec<_> = (0..8)
        .map(|_| h.start(&slot.runtime, &["-l", "gpupin.count=1"]))
        .collect();
    let gpus: BTreeSet<String> = slot.holders().into_values().flatten().collect();
    assert_eq!(gpus.len(), 8);
    let name = format!("gpupin-ninth-{}", std::process::id());
    let _ninth = NamedContainer {
        harness: h,
        name: name.clone(),
    };
    let out = h.run_detached(&slot.runtime, &["--name", &name, "-l", "gpupin.count=1"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("gpupin: cannot allocate 1 GPU") && stderr.contains("8 of 8 GPUs held"),
        "{stderr}"
    );
    let state = ok(h.docker().args([
        "inspect",
        "-f",
        "{{.State.Running}} {{.State.StartedAt}}",
        &name,
    ]));
    assert!(
        state.starts_with("false 0001-01-01"),
        "the 9th never ran: {state}"
    );
    assert_eq!(slot.holders().len(), 8);
    drop(running);
}

/// A container known by name, force-removed on drop (it may not exist).
struct NamedContainer<'h> {
    harness: &'h Harness,
    name: String,
}

impl Drop for NamedContainer<'_> {
    fn drop(&mut self) {
        let _ = self
            .harness
            .docker()
            .args(["rm", "-f", &self.name])
            .output();
    }
}

#[test]
fn gpus_flag_gets_free_gpus_not_zero_and_one() {
    let Some(h) = harness("gpus_flag_gets_free_gpus_not_zero_and_one", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let first = h.start(&slot.runtime, &["-l", "gpupin.devices=0,1"]);
    let taken = BTreeSet::from([slot.uuid_of(0), slot.uuid_of(1)]);
    assert_eq!(
        slot.holders()[&first.id]
            .iter()
            .cloned()
            .collect::<BTreeSet<_>>(),
        taken
    );
    let c = h.start(&slot.runtime, &["--gpus", "2"]);
    let gpus = assert_pinned(&slot, &c, 2);
    assert!(
        gpus.iter().all(|g| !taken.contains(g)),
        "{gpus:?} overlaps GPUs 0 and 1"
    );
    // Docker adds NVIDIA's prestart hook for --gpus and appends NVIDIA_VISIBLE_DEVICES=0,1
    // to the env; the hook must find gpupin's choice, and only that.
    assert_eq!(
        h.nvidia_hook_saw(&c.id),
        [format!("NVIDIA_VISIBLE_DEVICES={}", gpus.join(","))],
        "what NVIDIA's hook read"
    );
}

#[test]
fn no_request_runs_as_under_runc() {
    let Some(h) = harness("no_request_runs_as_under_runc", Need::Docker) else {
        return;
    };
    let slot = h.slot();
    let run = |runtime: &str| {
        ok(h.docker()
            .args([
                "run",
                "--rm",
                "--network",
                "none",
                "--hostname",
                "same",
                "--runtime",
                runtime,
            ])
            .args([IMAGE, "sh", "-c", "ls /dev; env | sort"]))
    };
    assert_eq!(run(&slot.runtime), run("runc"));
    assert!(slot.holders().is_empty());
    assert!(
        !slot.state.join("holders").exists()
            || std::fs::read_dir(slot.state.join("holders"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn shim_keeps_dockers_spec() {
    let Some(h) = harness("shim_keeps_dockers_spec", Need::Docker) else {
        return;
    };
    let slot = h.capture_slot();
    let specs = slot.dir.join("specs");
    let post = h.bin.join("capture-post");
    write_capture_script(
        &post,
        &specs,
        "post",
        gpupin_sandbox::find_on_path("runc")
            .unwrap()
            .to_str()
            .unwrap(),
    );
    slot.reset_config(Some(&post));
    let c = h.start(&slot.runtime, &["-l", "gpupin.count=1", "-e", "KEEP=me"]);
    let read = |tag: &str| -> Value {
        let text = std::fs::read_to_string(specs.join(format!("{}.{tag}.json", c.id))).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let (pre, post) = (read("pre"), read("post"));
    assert_kept(&pre, &post, "");
    let gpus = slot.holders()[&c.id].clone();
    let env: Vec<String> = post["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().into())
        .collect();
    assert_eq!(visible(&env), gpus);
    assert_eq!(post["annotations"]["gpupin.assigned"], gpus.join(","));
}

/// Every key path of Docker's spec is in gpupin's output with the same value. Lists
/// gpupin adds to (env, devices, device rules, hooks) keep every original element;
/// only NVIDIA_VISIBLE_DEVICES may be replaced.
fn assert_kept(pre: &Value, post: &Value, path: &str) {
    match (pre, post) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let sub = format!("{path}/{k}");
                let got = b.get(k).unwrap_or_else(|| panic!("{sub} dropped"));
                assert_kept(v, got, &sub);
            }
        }
        (Value::Array(a), Value::Array(b)) if grows(path) => {
            for item in a.iter().filter(|i| {
                !i.as_str()
                    .is_some_and(|s| s.starts_with("NVIDIA_VISIBLE_DEVICES="))
            }) {
                assert!(b.contains(item), "{path}: {item} dropped");
            }
        }
        _ => assert_eq!(pre, post, "{path} changed"),
    }
}

fn grows(path: &str) -> bool {
    ["/process/env", "/linux/devices", "/linux/resources/devices"].contains(&path)
        || path.starts_with("/hooks/")
}

#[test]
fn install_keeps_other_settings_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let daemon_json = dir.path().join("daemon.json");
    let original = r#"{"log-level": "warn", "runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}"#;
    write(&daemon_json, original);
    let config = dir.path().join("gpupin.toml");
    write(&config, "inventory = \"sim:nvswitch8\"\n");
    let gpupin = |args: &[&str]| {
        ok(Command::new(docker_support::gpupin_bin())
            .arg("--config")
            .arg(&config)
            .args(args)
            .arg("--daemon-json")
            .arg(&daemon_json)
            .arg("--pidfile")
            .arg(dir.path().join("no.pid")))
    };
    let first = gpupin(&["install", "docker", "--default"]);
    assert!(first.contains("previous file saved as"), "{first}");
    assert!(first.contains("dockerd is not running"), "{first}");
    let backup = dir.path().join("daemon.json.gpupin-backup");
    assert_eq!(std::fs::read_to_string(&backup).unwrap(), original);
    let installed: Value =
        serde_json::from_str(&std::fs::read_to_string(&daemon_json).unwrap()).unwrap();
    assert_eq!(installed["log-level"], "warn");
    assert_eq!(installed["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
    assert_eq!(installed["default-runtime"], "gpupin");
    let entry = &installed["runtimes"]["gpupin"];
    assert_eq!(
        entry["path"],
        Path::new(&docker_support::runtime_bin())
            .canonicalize()
            .unwrap()
            .to_str()
            .unwrap()
    );
    assert_eq!(
        entry["runtimeArgs"],
        serde_json::json!(["--gpupin-config", config.to_str().unwrap()])
    );

    let backup_time = std::fs::metadata(&backup).unwrap().modified().unwrap();
    let second = gpupin(&["install", "docker", "--default"]);
    assert!(second.contains("no change"), "{second}");
    assert_eq!(
        std::fs::metadata(&backup).unwrap().modified().unwrap(),
        backup_time
    );
    assert_eq!(
        serde_json::from_str::<Value>(&std::fs::read_to_string(&daemon_json).unwrap()).unwrap(),
        installed
    );

    gpupin(&["uninstall", "docker"]);
    let restored: Value =
        serde_json::from_str(&std::fs::read_to_string(&daemon_json).unwrap()).unwrap();
    assert_eq!(restored, serde_json::from_str::<Value>(original).unwrap());
}

/// `gpupin install docker` on a daemon.json where NVIDIA's toolkit registered its runtime
/// (`nvidia-ctk runtime configure --set-as-default`): NVIDIA's entry and default stay, and
/// gpupin's entry hands over to it; gpupin-runtime then really runs what
/// `--gpupin-runtime` names.
#[test]
fn install_hands_over_to_nvidias_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let daemon_json = dir.path().join("daemon.json");
    let original = r#"{"default-runtime": "nvidia", "runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}"#;
    write(&daemon_json, original);
    let config = dir.path().join("gpupin.toml");
    write(&config, "inventory = \"sim:nvswitch8\"\n");
    let out = Command::new(docker_support::gpupin_bin())
        .arg("--config")
        .arg(&config)
        .args(["install", "docker", "--daemon-json"])
        .arg(&daemon_json)
        .arg("--pidfile")
        .arg(dir.path().join("no.pid"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let note = text(&out.stderr);
    assert!(
        note.contains("daemon.json has NVIDIA's runtime \"nvidia\" (nvidia-container-runtime, the default): gpupin-runtime hands containers over to it"),
        "{note}"
    );
    let installed: Value =
        serde_json::from_str(&std::fs::read_to_string(&daemon_json).unwrap()).unwrap();
    assert_eq!(installed["default-runtime"], "nvidia");
    assert_eq!(
        installed["runtimes"]["nvidia"],
        serde_json::json!({"args": [], "path": "nvidia-container-runtime"})
    );
    let args = &installed["runtimes"]["gpupin"]["runtimeArgs"];
    assert_eq!(
        args,
        &serde_json::json!([
            "--gpupin-config",
            config.to_str().unwrap(),
            "--gpupin-runtime",
            "nvidia-container-runtime"
        ])
    );

    // What dockerd then runs: the runtime named there gets runc's arguments unchanged.
    let log = dir.path().join("argv.log");
    let stand_in = dir.path().join("nvidia-container-runtime");
    write(
        &stand_in,
        &format!("#!/bin/sh\necho \"$@\" >> {}\n", log.display()),
    );
    std::fs::set_permissions(
        &stand_in,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let run = Command::new(docker_support::runtime_bin())
        .args([
            "--gpupin-config",
            config.to_str().unwrap(),
            "--gpupin-runtime",
        ])
        .arg(&stand_in)
        .args(["--root", "/run/x", "state", "abc"])
        .output()
        .unwrap();
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "--root /run/x state abc\n"
    );
}

/// `gpupin CONFIG ARGS` as root, with the harness's dockerd as docker's default.
fn gpupin_at(h: &docker_support::Harness, config: &Path, args: &[&str]) -> std::process::Output {
    Command::new(docker_support::gpupin_bin())
        .arg("--config")
        .arg(config)
        .args(args)
        .env("DOCKER_HOST", &h.host)
        .output()
        .unwrap()
}

/// What an admin runs against a running container (issue: `release` freed a running
/// container's GPUs without a word, and the next container got the same GPU): by its
/// name, short id or full id `release` refuses while it runs, naming it and saying what
/// to do, and holds on; an unknown name exits 1. `evict` stops it through Docker and
/// releases its GPU, with an audit line saying who evicted it; the GPU then goes to the
/// next container, and never while the first ran.
#[test]
fn release_refuses_a_running_container_and_evict_stops_it_first() {
    let Some(h) = harness(
        "release_refuses_a_running_container_and_evict_stops_it_first",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let name = format!("pinned-{}", std::process::id());
    let c = h.start(&slot.runtime, &["--name", &name, "-l", "gpupin.count=1"]);
    let held = slot.holders()[&c.id].clone();
    let short = &c.id[..12];
    for given in [name.as_str(), short, c.id.as_str()] {
        let out = gpupin_at(h, &slot.config, &["release", given]);
        assert_eq!(out.status.code(), Some(1), "release {given}: {out:?}");
        let err = text(&out.stderr);
        assert!(
            err.starts_with(&format!("gpupin: {name} still runs (docker container"))
                && err.contains(&format!(
                    "end it with gpupin evict {name}, which releases them once it is gone"
                ))
                && err.lines().count() == 1,
            "{err}"
        );
        assert_eq!(
            slot.holders()[&c.id],
            held,
            "still held after release {given}"
        );
    }
    let out = gpupin_at(h, &slot.config, &["release", "no-such-holder"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(text(&out.stderr).starts_with("gpupin: no holder \"no-such-holder\""));

    // A second container gets another GPU while the first runs.
    let other = h.start(&slot.runtime, &["-l", "gpupin.count=1"]);
    assert_ne!(slot.holders()[&other.id], held);
    drop(other);

    let out = gpupin_at(h, &slot.config, &["evict", &name, "--grace", "1s"]);
    assert!(out.status.success(), "evict: {out:?}");
    let said = text(&out.stdout);
    assert!(
        said.starts_with(&format!(
            "evicted {name} (stopped with docker stop -t 1 {})",
            c.id
        )) && said
            .trim_end()
            .ends_with(&format!("released {}", held.join(","))),
        "{said}"
    );
    let state = ok(h
        .docker()
        .args(["inspect", "--format", "{{.State.Running}}", &c.id]));
    assert_eq!(state.trim(), "false");
    assert!(!slot.holders().contains_key(&c.id), "{:?}", slot.holders());
    let log = std::fs::read_to_string(slot.state.join("audit.log")).unwrap();
    let evict: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "evict")
        .expect("an evict line");
    assert_eq!(evict["holder"], c.id);
    assert!(
        evict["reason"]
            .as_str()
            .unwrap()
            .starts_with("gpupin evict by root"),
        "{evict}"
    );
    // The evicted container's GPU goes to the next one that names it.
    let devices = format!("gpupin.devices={}", held[0]);
    let next = h.start(&slot.runtime, &["-l", &devices]);
    assert_eq!(slot.holders()[&next.id], held);
}

/// One typo in gpupin's config (a top-level key under [limits]) no longer stops every
/// container on the box: one that asks for no GPU starts, one that asks for a GPU is
/// refused with the error's line, table and the key meant, and nothing is held.
#[test]
fn a_config_typo_stops_only_gpu_containers_and_says_where() {
    let Some(h) = harness(
        "a_config_typo_stops_only_gpu_containers_and_says_where",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let mut config = std::fs::read_to_string(&slot.config).unwrap();
    config.push_str("\n[limits]\nmax_gpus_per_user = 2\npolcy = \"pack\"\n");
    std::fs::write(&slot.config, &config).unwrap();
    let line = config.lines().position(|l| l.starts_with("polcy")).unwrap() + 1;
    let plain = h.start(&slot.runtime, &[]);
    assert!(!plain.id.is_empty());
    let out = h.run_detached(&slot.runtime, &["-l", "gpupin.count=1"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!(
            "gpupin: invalid config {}: line {line} in [limits]: unknown key \"polcy\" in [limits]; did you mean the top-level \"policy\"? Top-level keys go above the first [table]",
            slot.config.display()
        )),
        "{err}"
    );
    assert!(!slot.state.join("holders").exists() || slot.holders().is_empty());
}

/// A spawner that sets `gpupin.user` on the containers it starts (JupyterHub's
/// DockerSpawner, a portal), on a host whose admin trusts that label: the container is
/// that user's in status, and `[limits]` apply to it as to the user's own jobs. Where the
/// label is not trusted, a container carrying it is refused in one line, never started
/// as nobody's (issue 23 item 4, issue 25 item 3).
#[test]
fn a_trusted_user_label_makes_a_container_the_users_and_limits_apply() {
    let Some(h) = harness(
        "a_trusted_user_label_makes_a_container_the_users_and_limits_apply",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    // Untrusted: refused, nothing held.
    let out = h.run_detached(
        &slot.runtime,
        &["-l", "gpupin.count=1", "-l", "gpupin.user=nobody"],
    );
    assert!(!out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("gpupin: label gpupin.user=\"nobody\" is not trusted on this host (trusted_user_label is not set): remove the label, or ask the admin to trust it"),
        "{err}"
    );
    assert!(slot.holders().is_empty());

    let mut config = std::fs::read_to_string(&slot.config).unwrap();
    config.push_str("trusted_user_label = \"gpupin.user\"\n[limits]\nmax_gpus_per_user = 1\n");
    std::fs::write(&slot.config, config).unwrap();
    let first = h.start(
        &slot.runtime,
        &["-l", "gpupin.count=1", "-l", "gpupin.user=nobody"],
    );
    let status = slot.status();
    let holder = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["holders"].as_array().unwrap())
        .find(|r| r["id"] == first.id.as_str())
        .unwrap_or_else(|| panic!("{status:#}"));
    assert_eq!(holder["owner"]["user"], "nobody", "{status:#}");
    let table = text(&gpupin_at(h, &slot.config, &["status"]).stdout);
    let row = table
        .lines()
        .find(|l| l.contains(&first.id[..12]) || l.contains("nobody"));
    assert!(row.is_some_and(|r| r.contains("nobody")), "{table}");

    // The user's second container is over the limit; another user's is not.
    let out = h.run_detached(
        &slot.runtime,
        &["-l", "gpupin.count=1", "-l", "gpupin.user=nobody"],
    );
    assert!(!out.status.success(), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("nobody holds 1 GPU and nobody asks for 1 more; their limit is 1 (limits.max_gpus_per_user)"),
        "{err}"
    );
    let root = h.start(
        &slot.runtime,
        &["-l", "gpupin.count=1", "-l", "gpupin.user=root"],
    );
    assert_eq!(slot.holders().len(), 2);
    // A name that is no user of this host is refused, not taken as nobody's.
    let out = h.run_detached(
        &slot.runtime,
        &["-l", "gpupin.count=1", "-l", "gpupin.user=no-such-user"],
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        text(&out.stderr).contains("label gpupin.user=\"no-such-user\" names no user of this host"),
        "{}",
        text(&out.stderr)
    );
    drop(root);
    drop(first);
}

/// `docker run --runtime gpupin -l gpupin.mig=1g.10gb` on the simulated A100 with MIG:
/// the shim gives the container its instance's GPU node and exactly its two capability
/// nodes, and NVIDIA_VISIBLE_DEVICES names the instance; `--gpus device=MIG-...` takes
/// the named instance.
#[test]
fn the_shim_gives_a_mig_instance_its_capability_nodes_and_uuid() {
    let Some(h) = harness(
        "the_shim_gives_a_mig_instance_its_capability_nodes_and_uuid",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let text_config = std::fs::read_to_string(&slot.config).unwrap();
    write(
        &slot.config,
        &text_config.replace("sim:nvswitch8", "sim:dgxa100mig"),
    );
    let c = h.start(&slot.runtime, &["-l", "gpupin.mig=1g.10gb"]);
    let held = slot.holders()[&c.id].clone();
    assert_eq!(held.len(), 1);
    assert!(held[0].starts_with("MIG-"), "{held:?}");
    assert_eq!(c.visible(), held, "NVIDIA_VISIBLE_DEVICES vs gpupin status");
    let caps: BTreeSet<String> = c
        .exec(&["ls", "/dev/nvidia-caps"])
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(
        caps,
        BTreeSet::from(["nvidia-cap84".to_string(), "nvidia-cap85".to_string()])
    );
    assert_eq!(c.gpu_nodes(), ["nvidia0"]);
    // Docker's own --gpus with a MIG UUID: that instance, by the same rules.
    let named = "MIG-5a1e000a-0000-4000-8000-000000000000";
    let d = h.start(&slot.runtime, &["--gpus", &format!("\"device={named}\"")]);
    assert_eq!(slot.holders()[&d.id], [named]);
    let caps = d.exec(&["ls", "/dev/nvidia-caps"]);
    assert_eq!(
        caps.split_whitespace().collect::<Vec<_>>(),
        ["nvidia-cap21", "nvidia-cap22"]
    );
}
