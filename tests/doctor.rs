//! `gpupin doctor` on a host set up as `gpupin install` leaves it, then with one thing
//! broken at a time: the exit status and the exact line a person would read. Doctor must
//! change nothing it looks at. The simulated machine needs no GPU; the procfs case needs
//! root (mknod) for its fake device nodes.

use gpupin_sandbox::harness::{Gpupin, ledger::snapshot, need_root, stderr, stdout};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// A gpupin config with Docker's and podman's files installed beside it, all in one
/// temp dir.
struct Host {
    g: Gpupin,
    daemon_json: PathBuf,
    hooks: PathBuf,
}

impl Host {
    fn dir(&self) -> &Path {
        self.g.dir.path()
    }

    /// `gpupin --config C ARGS`, which must succeed.
    fn gpupin(&self, args: &[&str]) {
        let out = Command::new(&self.g.bin)
            .env_remove("GPUPIN_CONFIG")
            .arg("--config")
            .arg(&self.g.config)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }

    /// `gpupin --config C doctor` on this host's files, plus `extra`.
    fn doctor(&self, extra: &[&str]) -> Output {
        let out = Command::new(&self.g.bin)
            .env_remove("GPUPIN_CONFIG")
            .arg("--config")
            .arg(&self.g.config)
            .arg("doctor")
            .arg("--daemon-json")
            .arg(&self.daemon_json)
            .arg("--hooks-dir")
            .arg(&self.hooks)
            .args(["--nvidia-smi", "/nonexistent/nvidia-smi"])
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(stderr(&out), "", "doctor says everything on stdout");
        out
    }

    fn sibling(&self, name: &str) -> PathBuf {
        self.g.bin.with_file_name(name)
    }
}

/// A simulated machine with gpupin installed for Docker and podman, as an admin would:
/// `gpupin install docker`, `gpupin install podman`, and a first `gpupin gc` that makes
/// the state dir. The runtime gpupin-runtime hands over to is a stand-in for runc.
fn good_host(extra: &str) -> Host {
    let config = format!("cdi_spec_dirs = [\"cdi\"]\nruntime = \"bin/runc\"\n{extra}");
    let g = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", &config);
    let runc = g.dir.path().join("bin/runc");
    std::fs::create_dir_all(runc.parent().unwrap()).unwrap();
    std::fs::write(&runc, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&runc, std::fs::Permissions::from_mode(0o755)).unwrap();
    let host = Host {
        daemon_json: g.dir.path().join("daemon.json"),
        hooks: g.dir.path().join("hooks.d"),
        g,
    };
    let pidfile = host.dir().join("no-dockerd.pid");
    host.gpupin(&[
        "install",
        "docker",
        "--daemon-json",
        host.daemon_json.to_str().unwrap(),
        "--pidfile",
        pidfile.to_str().unwrap(),
    ]);
    host.gpupin(&["install", "podman", "--dir", host.hooks.to_str().unwrap()]);
    host.gpupin(&["gc"]);
    host
}

fn lines(out: &Output) -> Vec<String> {
    stdout(out).lines().map(str::to_string).collect()
}

fn assert_has_line(out: &Output, wanted: &str) {
    let lines = lines(out);
    assert!(
        lines.iter().any(|l| l == wanted),
        "no line\n{wanted}\nin\n{}",
        lines.join("\n")
    );
}

/// How doctor describes the owner of a dir this test made.
fn owner_text() -> String {
    match rustix::process::geteuid().as_raw() {
        0 => "root-owned".to_string(),
        uid => format!("owned by uid {uid} (gpupin's own user)"),
    }
}

#[test]
fn a_host_set_up_by_gpupin_install_has_no_problem() {
    let host = good_host("");
    let before = snapshot(host.dir());
    let out = host.doctor(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let config = host.g.config.display();
    let state = host.g.state_dir.display();
    assert_has_line(
        &out,
        &format!(
            "ok      config {config}: inventory sim:nvswitch8, driver auto, confine auto, state dir {state}"
        ),
    );
    assert_has_line(
        &out,
        &format!("ok      state dir {state}: {}, 0755", owner_text()),
    );
    assert_has_line(
        &out,
        "ok      ledger: 0 live holders, 0 waiting in the queue",
    );
    assert_has_line(
        &out,
        &format!(
            "ok      docker: {}: runtime \"gpupin\" runs {} with config {config}, handing over to {}",
            host.daemon_json.display(),
            host.sibling("gpupin-runtime").display(),
            host.dir().join("bin/runc").display()
        ),
    );
    // Installed without --default: a container started without --runtime gpupin would
    // get no GPU and no word from gpupin; doctor says how to close that.
    assert_has_line(
        &out,
        &format!(
            "warn    docker: \"gpupin\" is not Docker's default runtime: a container started without --runtime gpupin (docker run -l gpupin.count=1 ...) gets no GPU, and gpupin never sees it to say so; fix: gpupin --config {config} install docker --default"
        ),
    );
    assert_has_line(
        &out,
        &format!(
            "ok      hooks: {}: precreate, prestart and poststop run {} for containers with a gpupin.* annotation (podman --label and -e GPUPIN_* never reach it: use --annotation, or `gpupin install podman --always` for env requests)",
            host.hooks.display(),
            host.sibling("gpupin-hook").display()
        ),
    );
    assert_has_line(
        &out,
        "ok      device nodes: sim:nvswitch8 is simulated: containers get nodes 195:N that gpupin makes; the host's /dev is not used",
    );
    for line in lines(&out) {
        let status = line.split_whitespace().next().unwrap_or_default();
        assert!(["ok", "warn"].contains(&status), "{line}");
    }
    assert_eq!(snapshot(host.dir()), before, "doctor changed nothing");
}

#[test]
fn json_says_the_same_for_scripts() {
    let host = good_host("");
    let out = host.doctor(&["--json"]);
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["problems"], 0);
    let findings = report["findings"].as_array().unwrap();
    let state = findings.iter().find(|f| f["check"] == "state_dir").unwrap();
    assert_eq!(state["status"], "ok");
    assert_eq!(
        state["what"],
        format!(
            "state dir {}: {}, 0755",
            host.g.state_dir.display(),
            owner_text()
        )
    );
    assert_eq!(state["fix"], Value::Null);
    assert_eq!(report["nvml_vs_nvidia_smi"], serde_json::json!([]));
}

/// Each broken variant: exit status 1 and its line, nothing changed by looking.
fn assert_problem(host: &Host, wanted: &str) {
    let before = snapshot(host.dir());
    let out = host.doctor(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert_has_line(&out, wanted);
    assert_eq!(snapshot(host.dir()), before, "doctor changed nothing");
}

#[test]
fn a_symlinked_state_dir_is_a_problem() {
    let host = good_host("");
    let state = &host.g.state_dir;
    let real = host.dir().join("state-real");
    std::fs::rename(state, &real).unwrap();
    std::os::unix::fs::symlink(&real, state).unwrap();
    assert_problem(
        &host,
        &format!(
            "problem state dir {}: it is a symlink (to {}); gpupin refuses it; fix: set state_dir in {} to a real directory, or remove the link (gpupin makes the directory)",
            state.display(),
            real.display(),
            host.g.config.display()
        ),
    );
}

#[test]
fn a_node_secret_others_can_read_is_a_problem() {
    let host = good_host("");
    let secret = host.g.state_dir.join("within.secret");
    std::fs::create_dir_all(&host.g.state_dir).unwrap();
    std::fs::write(&secret, format!("{}\n", "ab".repeat(32))).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_problem(
        &host,
        &format!(
            "problem {0}: not a root-only regular file (mode 600), so every request that presents a holder's key is refused; fix: rm {0} (gpupin makes a new one; keys given out so far stop working)",
            secret.display()
        ),
    );
}

#[test]
fn a_daemon_json_without_the_runtime_is_a_problem() {
    let host = good_host("");
    std::fs::write(&host.daemon_json, "{\"log-level\": \"warn\"}\n").unwrap();
    assert_problem(
        &host,
        &format!(
            "problem docker: {0} has no \"gpupin\" runtime; fix: gpupin --config {1} install docker --daemon-json {0}",
            host.daemon_json.display(),
            host.g.config.display()
        ),
    );
}

#[test]
fn a_hook_pointing_at_a_missing_binary_is_a_problem() {
    let host = good_host("");
    let file = host.hooks.join("gpupin-prestart.json");
    let mut hook: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let gone = host.dir().join("gone/gpupin-hook");
    hook["hook"]["path"] = gone.to_str().unwrap().into();
    std::fs::write(&file, hook.to_string()).unwrap();
    assert_problem(
        &host,
        &format!(
            "problem hooks: {} runs {}, which does not exist; fix: gpupin --config {} install podman --dir {}",
            file.display(),
            gone.display(),
            host.g.config.display(),
            host.hooks.display()
        ),
    );
}

#[test]
fn a_corrupt_record_is_a_problem_with_the_release_that_clears_it() {
    let host = good_host("");
    let holders = host.g.state_dir.join("holders");
    std::fs::create_dir_all(&holders).unwrap();
    std::fs::write(holders.join("c1.json"), "{not json").unwrap();
    assert_problem(
        &host,
        &format!(
            "problem ledger: corrupt record {}: key must be a string at line 1 column 2; every allocation fails until it is gone; fix: inspect it (it may hold GPUs of a live container), then gpupin --config {} release c1",
            holders.join("c1.json").display(),
            host.g.config.display()
        ),
    );
}

#[test]
fn a_record_changed_in_place_behind_the_ledgers_index_is_a_problem_gc_fixes() {
    let host = good_host("");
    host.gpupin(&["hold", "maint", "--devices", "0", "--until-release"]);
    // An editor writing the record in place: holders/ keeps the stamp gpupin gave it with
    // the index, so allocations would still decide on the index's counts.
    let record = host.g.state_dir.join("holders/maint.json");
    let text = std::fs::read_to_string(&record).unwrap();
    let moved = text.replace("\"GPU-", "\"GPU-X");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&record)
        .unwrap();
    std::io::Write::write_all(&mut file, moved.as_bytes()).unwrap();
    drop(file);
    assert_problem(
        &host,
        &format!(
            "problem ledger: holders.index does not count what the records hold (a record changed in place, by hand?); allocations are decided on the index until it is written anew; fix: gpupin --config {} gc",
            host.g.config.display()
        ),
    );
    host.gpupin(&["gc"]);
    let out = host.doctor(&[]);
    assert!(!stdout(&out).contains("holders.index"), "{}", stdout(&out));
}

#[test]
fn a_config_that_does_not_load_is_a_problem_and_the_other_checks_still_run() {
    let host = good_host("");
    std::fs::write(&host.g.config, "bogus = 1\n").unwrap();
    let out = host.doctor(&[]);
    assert_eq!(out.status.code(), Some(1));
    let lines = lines(&out);
    assert!(
        lines[0].starts_with(&format!(
            "problem invalid config {}: line 1: unknown key \"bogus\"",
            host.g.config.display()
        )) && lines[0].ends_with(&format!(
            "; the checks below use the defaults; fix: correct {}",
            host.g.config.display()
        )),
        "{}",
        lines[0]
    );
    assert!(
        lines.iter().any(|l| l.contains(" state dir /run/gpupin")),
        "{lines:?}"
    );
}

/// A fake procfs, sysfs and /dev of a two-GPU host: what the driver writes, device nodes
/// made with mknod.
struct FakeDriver {
    proc: PathBuf,
    sys: PathBuf,
    dev: PathBuf,
}

fn fake_driver(dir: &Path) -> FakeDriver {
    let fake = FakeDriver {
        proc: dir.join("proc"),
        sys: dir.join("sys"),
        dev: dir.join("dev"),
    };
    let gpus = fake.proc.join("driver/nvidia/gpus");
    for (bus, minor) in [("0000:17:00.0", 1), ("0000:b1:00.0", 0)] {
        let info = format!(
            "Model: \t\t NVIDIA A100-SXM4-40GB\nIRQ:   \t\t 40\nGPU UUID: \t {}\n\
             Bus Type: \t PCIe\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n",
            fake_uuid(minor)
        );
        std::fs::create_dir_all(gpus.join(bus)).unwrap();
        std::fs::write(gpus.join(bus).join("information"), info).unwrap();
    }
    std::fs::write(
        fake.proc.join("driver/nvidia/version"),
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
    )
    .unwrap();
    std::fs::write(
        fake.proc.join("devices"),
        "Character devices:\n  1 mem\n195 nvidia\n195 nvidiactl\n510 nvidia-uvm\n\nBlock devices:\n  7 loop\n",
    )
    .unwrap();
    // The cgroup checks read the mounts: this host's own.
    std::fs::create_dir_all(fake.proc.join("self")).unwrap();
    std::fs::copy("/proc/self/mountinfo", fake.proc.join("self/mountinfo")).unwrap();
    std::fs::create_dir_all(fake.sys.join("bus/pci/devices")).unwrap();
    std::fs::create_dir_all(&fake.dev).unwrap();
    for (name, major, minor) in [
        ("nvidia0", 195, 0),
        ("nvidia1", 195, 1),
        ("nvidiactl", 195, 255),
        ("nvidia-uvm", 510, 0),
        ("nvidia-uvm-tools", 510, 1),
    ] {
        mknod(&fake.dev.join(name), major, minor);
    }
    fake
}

fn mknod(path: &Path, major: u32, minor: u32) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(major, minor),
    )
    .unwrap();
}

#[test]
fn procfs_readings_and_device_nodes_are_checked_against_each_other() {
    if !need_root("procfs_readings_and_device_nodes_are_checked_against_each_other") {
        return;
    }
    let host = good_host("");
    let text = std::fs::read_to_string(&host.g.config)
        .unwrap()
        .replace("inventory = \"sim:nvswitch8\"", "inventory = \"procfs\"");
    std::fs::write(&host.g.config, text).unwrap();
    let fake = fake_driver(host.dir());
    let spec = host.dir().join("cdi/nvidia.yaml");
    std::fs::create_dir_all(spec.parent().unwrap()).unwrap();
    std::fs::write(&spec, cdi_spec(&[1, 0])).unwrap();
    let roots = [
        "--proc",
        fake.proc.to_str().unwrap(),
        "--sys",
        fake.sys.to_str().unwrap(),
        "--dev",
        fake.dev.to_str().unwrap(),
    ];
    let out = host.doctor(&roots);
    assert_has_line(
        &out,
        "ok      inventory procfs: 2 GPUs (NVIDIA A100-SXM4-40GB) (procfs knows no memory sizes, no NVLink)",
    );
    assert_has_line(
        &out,
        "ok      device nodes: 2 GPU nodes and 3 control nodes match the inventory; nvidia is major 195, nvidia-uvm 510",
    );
    // With a real driver, NVML answers for the real GPUs instead.
    if !Path::new("/proc/driver/nvidia").exists() {
        let driver = lines(&out)
            .into_iter()
            .find(|l| l.contains(" driver: "))
            .unwrap();
        assert!(
            driver.starts_with(
                "warn    driver: kernel module 550.54.15 loaded, but NVML does not answer: "
            ),
            "{driver}"
        );
    }

    assert_has_line(
        &out,
        &format!(
            "ok      cdi: {}: entries for all 2 GPUs of the inventory",
            spec.display()
        ),
    );

    std::fs::write(&spec, cdi_spec(&[1])).unwrap();
    std::fs::remove_file(fake.dev.join("nvidia1")).unwrap();
    mknod(&fake.dev.join("nvidia1"), 195, 7);
    std::fs::remove_file(fake.dev.join("nvidia-uvm-tools")).unwrap();
    let out = host.doctor(&roots);
    assert_eq!(out.status.code(), Some(1));
    assert_has_line(
        &out,
        &format!(
            "problem device nodes: {} is char 195:7, the inventory says char 195:1; fix: remove it and run nvidia-modprobe -c 1; or, if the inventory is wrong, correct it",
            fake.dev.join("nvidia1").display()
        ),
    );
    assert_has_line(
        &out,
        &format!(
            "problem device nodes: {} is missing (char 510:1 expected); fix: nvidia-modprobe -u -c 0 (or nvidia-smi as root) creates it",
            fake.dev.join("nvidia-uvm-tools").display()
        ),
    );
    assert_has_line(
        &out,
        &format!(
            "problem cdi: GPU 1: no entry for GPU 1 ({}) in CDI spec {1}: neither its UUID nor /dev/nvidia0 is there; regenerate the spec (nvidia-ctk cdi generate); fix: nvidia-ctk cdi generate --output={1}",
            fake_uuid(0),
            spec.display()
        ),
    );
}

fn fake_uuid(minor: u32) -> String {
    format!("GPU-{minor}aaaaaaa-0000-4000-8000-00000000000{minor}")
}

/// An nvidia.com/gpu CDI spec with an entry, by UUID, for the GPUs of `minors`.
fn cdi_spec(minors: &[u32]) -> String {
    let mut spec = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n".to_string();
    for minor in minors {
        spec.push_str(&format!(
            "  - name: {}\n    containerEdits:\n      deviceNodes: [{{path: /dev/nvidia{minor}, major: 195, minor: {minor}}}]\n",
            fake_uuid(*minor)
        ));
    }
    spec.push_str(
        "containerEdits:\n  deviceNodes: [{path: /dev/nvidiactl, major: 195, minor: 255}]\n",
    );
    spec
}
