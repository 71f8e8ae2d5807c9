//! gpupin-runtime under a real containerd (its own root, state dir and socket), run with
//! `ctr run --runc-binary gpupin-runtime`, as containerd's runc shim runs any runc-
//! compatible runtime: a container asking by annotation gets exactly its GPU, and,
//! with the CDI spec NVIDIA's `nvidia-ctk cdi generate` writes for a fake driver root and
//! NVIDIA's mock NVML (gpupin-sandbox harness::toolkit, the peers of tests/peers/build),
//! the driver's files read-only and the real nvidia-cdi-hook run. Root, containerd, ctr,
//! runc, busybox-static (and for CDI the peers) are needed; elsewhere each test says why
//! it skips (under CI=true it fails instead).

mod containerd_support;

use containerd_support::{Containerd, assert_ran, text};
use gpupin_sandbox::harness::toolkit::{
    MockDriver, Peers, assert_toolkit_driver_inside, use_inventory,
};
use gpupin_sandbox::harness::{self, gpu_nodes};
use gpupin_sandbox::{build_busybox_rootfs, find_static_busybox};
use std::path::{Path, PathBuf};
use std::process::Output;

/// containerd for `ctr run --rootfs`, and the busybox rootfs its containers run on.
struct Ctr {
    containerd: Containerd,
    rootfs: PathBuf,
}

impl Ctr {
    fn start(test: &str) -> Option<Ctr> {
        // Only what ctr needs: no CRI plugin, whose start-up needs CNI and takes seconds
        // (containerd 2.x splits it into the runtime and image plugins and the service).
        let cri = if containerd_support::is_v2() {
            r#"["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]"#
        } else {
            r#"["io.containerd.grpc.v1.cri"]"#
        };
        let config =
            |_: &Path| containerd_support::config(&format!("disabled_plugins = {cri}\n"), "");
        let containerd = Containerd::start(test, &[], "", config)?;
        let rootfs = containerd.dir().join("rootfs");
        build_busybox_rootfs(&find_static_busybox().unwrap(), &rootfs).unwrap();
        Some(Ctr { containerd, rootfs })
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
        self.containerd.ctr(&args)
    }

    fn status(&self) -> serde_json::Value {
        self.containerd.status()
    }
}

#[test]
fn ctr_run_through_gpupin_runtime_sees_exactly_its_gpu_and_releases_it() {
    let Some(c) = Ctr::start("ctr_run_through_gpupin_runtime_sees_exactly_its_gpu_and_releases_it")
    else {
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
    let audit = std::fs::read_to_string(c.containerd.gpupin.state_dir.join("audit.log")).unwrap();
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
    let Some(c) = Ctr::start("ctr_run_gets_the_driver_files_of_its_gpu_through_cdi") else {
        return;
    };
    let Some(peers) = harness::required(
        "ctr_run_gets_the_driver_files_of_its_gpu_through_cdi",
        Peers::find(),
    ) else {
        return;
    };
    // gpupin hands out the mock's GPUs, whose spec nvidia-ctk generates.
    let dir = c.containerd.gpupin.dir.path();
    let driver = MockDriver::create(&dir.join("driver"), &peers, "dgxh100").unwrap();
    let inventory = dir.join("driver/machine.json");
    driver.write_inventory(&inventory).unwrap();
    use_inventory(&c.containerd.gpupin.config, &inventory);
    let cdi = dir.join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    driver.generate(&cdi.join("nvidia.yaml"), &[]).unwrap();
    append_config(
        &c.containerd.gpupin.config,
        &format!("driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]"),
    );
    // A first run shows which GPU a container gets (the policy packs: the same one again
    // once it is released).
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
    let chosen = driver.gpus.iter().find(|g| g.minor == minor).unwrap();
    let id = format!("gpupin-ctr-cdi-{}", std::process::id());
    let sh = |script: &str| {
        let out = c.run(&id, &["--annotation", "gpupin.count=1"], script);
        assert_ran("ctr run", &out);
        text(&out.stdout)
    };
    assert_toolkit_driver_inside(&sh, &driver, chosen);
    assert_eq!(c.status()["holders"], serde_json::json!([]));
}

fn append_config(path: &Path, lines: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    writeln!(file, "{lines}").unwrap();
}
