//! gpupin-runtime under a real containerd (its own root, state dir and socket), run with
//! `ctr run --runc-binary gpupin-runtime`, as containerd's runc shim runs any runc-
//! compatible runtime: a container asking by annotation gets exactly its GPU, and,
//! with the CDI spec nvidia-ctk would write for a fake driver root, the driver's files
//! read-only. Root, containerd, ctr, runc and busybox-static are needed; elsewhere each
//! test says why it skips (under CI=true it fails instead).

use gpupin_sandbox::harness::driver::{DriverRoot, FakeGpu, assert_driver_inside};
use gpupin_sandbox::harness::{self, Gpupin, gpu_nodes, status};
use gpupin_sandbox::{build_busybox_rootfs, find_on_path, find_static_busybox, is_root};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
/// How long containerd may take to answer after it starts (a readiness wait).
const START_WAIT: Duration = Duration::from_secs(60);

/// A private containerd, stopped (and its dir removed) when dropped.
struct Containerd {
    child: Child,
    socket: PathBuf,
    rootfs: PathBuf,
    gpupin: Gpupin,
}

fn requirements() -> Result<(), String> {
    if !is_root() {
        return Err("needs root (containerd, runc, device nodes)".into());
    }
    for tool in ["containerd", "ctr", "runc", "containerd-shim-runc-v2"] {
        find_on_path(tool).ok_or(format!("{tool} is not installed"))?;
    }
    find_static_busybox().map(|_| ())
}

impl Containerd {
    /// containerd with gpupin's config in its environment (GPUPIN_CONFIG), which the
    /// shim and so gpupin-runtime inherit; `extra` config lines for gpupin.
    fn start(test: &str, extra: &str) -> Option<Containerd> {
        harness::required(test, requirements())?;
        let gpupin = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", extra);
        let dir = gpupin.dir.path();
        let socket = dir.join("containerd.sock");
        let config = dir.join("containerd.toml");
        // Only what ctr needs: no CRI plugin, whose start-up needs CNI and takes seconds.
        std::fs::write(
            &config,
            "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let child = Command::new("containerd")
            .arg("--config")
            .arg(&config)
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
        let rootfs = dir.join("rootfs");
        build_busybox_rootfs(&find_static_busybox().unwrap(), &rootfs).unwrap();
        let c = Containerd {
            child,
            socket,
            rootfs,
            gpupin,
        };
        let started = Instant::now();
        while !c.ctr(&["version"]).status.success() {
            assert!(
                started.elapsed() < START_WAIT,
                "containerd did not answer: {}",
                std::fs::read_to_string(c.gpupin.dir.path().join("containerd.log")).unwrap()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(c)
    }

    fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `ctr run --rm --runc-binary gpupin-runtime --rootfs ROOTFS OPTIONS ID sh -c SCRIPT`.
    fn run(&self, id: &str, options: &[&str], script: &str) -> Output {
        let runtime = harness::binary(env!("CARGO_BIN_EXE_gpupin-runtime"));
        let mut args = vec!["run", "--rm", "--runc-binary", runtime.to_str().unwrap()];
        // A --rootfs container gets no image config, so no PATH.
        args.extend(["--env", "PATH=/bin:/sbin:/usr/bin:/usr/sbin"]);
        args.extend(options);
        let rootfs = self.rootfs.to_str().unwrap();
        args.extend(["--rootfs", rootfs, id, "/bin/sh", "-c", script]);
        self.ctr(&args)
    }

    fn status(&self) -> serde_json::Value {
        status::query(&self.gpupin.bin, &self.gpupin.config)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn assert_ran(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn ctr_run_through_gpupin_runtime_sees_exactly_its_gpu_and_releases_it() {
    let Some(c) = Containerd::start(
        "ctr_run_through_gpupin_runtime_sees_exactly_its_gpu_and_releases_it",
        "",
    ) else {
        return;
    };
    let id = format!("gpupin-ctr-{}", std::process::id());
    let out = c.run(
        &id,
        &["--annotation", "gpupin.count=2"],
        "ls /dev; echo ---; tr '\\0' '\\n' < /proc/1/environ; echo end",
    );
    assert_ran("ctr run", &out);
    let stdout = text(&out.stdout);
    let (dev, env) = stdout.split_once("---\n").expect("separator");
    let nodes = gpu_nodes(dev.split_whitespace());
    assert_eq!(nodes.len(), 2, "{stdout}");
    let visible = env
        .lines()
        .find_map(|l| l.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .unwrap_or_else(|| panic!("no NVIDIA_VISIBLE_DEVICES in the env: {stdout}"));
    assert_eq!(visible.split(',').count(), 2, "{env}");
    // The audit log names the container, its engine (containerd's runc shim gives its
    // own runc root) and its GPUs; `--rm` released them.
    let audit = std::fs::read_to_string(c.gpupin.state_dir.join("audit.log")).unwrap();
    let allocation: serde_json::Value = audit
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .find(|l| l["event"] == "allocate" && l["holder"] == id.as_str())
        .unwrap_or_else(|| panic!("no allocate line for {id}: {audit}"));
    assert_eq!(allocation["engine"], "containerd", "{allocation}");
    let mut logged: Vec<&str> = allocation["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap())
        .collect();
    let mut seen: Vec<&str> = visible.split(',').collect();
    logged.sort();
    seen.sort();
    assert_eq!(logged, seen, "{allocation}");
    let status = c.status();
    assert_eq!(status["holders"], serde_json::json!([]), "{status:#}");
}

#[test]
fn ctr_run_gets_the_driver_files_of_its_gpu_through_cdi() {
    let Some(c) = Containerd::start("ctr_run_gets_the_driver_files_of_its_gpu_through_cdi", "")
    else {
        return;
    };
    let gpus = FakeGpu::from_status(&c.status());
    let dir = c.gpupin.dir.path();
    let root = DriverRoot::create(&dir.join("driver"), &gpus).unwrap();
    let cdi = dir.join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    root.write_cdi_spec(&cdi, &gpus).unwrap();
    append_config(
        &c.gpupin.config,
        &format!("driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]"),
    );
    // A first run shows which GPU a container gets (the policy packs: the same one again
    // once it is released); the stand-in hook's calls are told apart by container id.
    let probe = c.run(
        &format!("gpupin-ctr-probe-{}", std::process::id()),
        &["--annotation", "gpupin.count=1"],
        "ls /dev",
    );
    assert_ran("ctr run (probe)", &probe);
    let probe = text(&probe.stdout);
    let minor: u32 = gpu_nodes(probe.split_whitespace())
        .first()
        .and_then(|n| n.strip_prefix("nvidia"))
        .and_then(|m| m.parse().ok())
        .expect("one GPU node");
    let chosen = gpus.iter().find(|g| g.minor == minor).unwrap();
    let id = format!("gpupin-ctr-cdi-{}", std::process::id());
    let sh = |script: &str| {
        let out = c.run(&id, &["--annotation", "gpupin.count=1"], script);
        assert_ran("ctr run", &out);
        text(&out.stdout)
    };
    assert_driver_inside(&sh, &root, chosen, &gpus, &id);
    assert_eq!(c.status()["holders"], serde_json::json!([]));
}

fn append_config(path: &Path, lines: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    writeln!(file, "{lines}").unwrap();
}
