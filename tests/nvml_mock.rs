//! gpupin's NVML backend against NVIDIA's mock NVML: the `libnvidia-ml.so.1` that
//! tests/peers/build makes from go-nvml's mock servers (DGX A100, DGX H100, and NVIDIA's
//! A30 PCIe configuration), found by the loader through LD_LIBRARY_PATH as a real driver's
//! library is found, with `inventory = "nvml"` (and once `auto`).
//!
//! NUMA node, local CPUs and the device majors come from sysfs and /proc on a real host,
//! so each gpupin runs in a private mount namespace (`unshare --mount`, as root) where a
//! fake /proc/devices, /proc/driver/nvidia and /sys/bus/pci/devices are bind-mounted over
//! the host's, as NVIDIA's own CPU-only CI does for its mock: gpupin reads the real paths,
//! with no seam of its own.
//!
//! MIG: with GPUPIN_MOCK_MIG the mock cuts GPUs into instances through go-nvml's own
//! CreateGpuInstance/CreateComputeInstance (NVIDIA's A100 80GB profile tables); the fake
//! /proc then carries the driver's capabilities tree for them (`capabilities/gpu<N>/mig/
//! gi<X>/access`, `.../ci<Y>/access`, nvidia-caps/mig-minors) and the `nvidia-caps` major.
//!
//! What each profile serves is printed by the peer `mocknvml-profile`, straight from
//! NVIDIA's mock server; gpupin's answers are compared with it. With `GPUPIN_BIN_DIR`
//! (.ci/run: the release build) the statically linked gpupin-hook is the one that asks
//! the `gpupin nvml` helper.

mod kubelet_fake;

use gpupin_kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use gpupin_kubelet_api::deviceplugin::{AllocateRequest, ContainerAllocateRequest, Empty};
use gpupin_sandbox::harness::{binary, need_root, required, stdout, text};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
/// The GPU and UVM majors of the fake /proc/devices (the driver's usual numbers).
const GPU_MAJOR: u64 = 195;
const UVM_MAJOR: u64 = 235;
/// The `nvidia-caps` major of the fake /proc/devices where a GPU is in MIG mode.
const CAPS_MAJOR: u64 = 508;

/// Where tests/peers/build put the mock: `<cache>/mocknvml/`.
fn mock_dir() -> Result<PathBuf, String> {
    let cache = match std::env::var_os("GPUPIN_PEERS_CACHE").filter(|c| !c.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var_os("HOME").ok_or("HOME is not set")?)
            .join(".cache/gpupin-peers"),
    };
    let dir = cache.join("mocknvml");
    let lib = dir.join("libnvidia-ml.so.1");
    if !lib.exists() || !dir.join("mocknvml-profile").exists() {
        return Err(format!(
            "no mock NVML at {}: run tests/peers/build (needs Go)",
            lib.display()
        ));
    }
    Ok(dir)
}

/// A machine with the mock NVML: a config, a state dir and the fake /proc and /sys tree.
struct MockHost {
    dir: tempfile::TempDir,
    mock: PathBuf,
    profile: &'static str,
    /// What the mock serves, from NVIDIA's mock server (`mocknvml-profile`).
    served: Value,
    /// The MIG geometry the mock serves (GPUPIN_MOCK_MIG), if any.
    mig: Option<&'static str>,
}

impl MockHost {
    /// `None` (after saying why) where the test cannot run: not root, or no mock built;
    /// under CI=true those fail the test instead.
    fn new(test: &str, profile: &'static str, inventory: &str) -> Option<MockHost> {
        MockHost::with_mig(test, profile, inventory, None)
    }

    /// As `new`, with the mock's GPUs cut into MIG instances as `mig` says
    /// (GPUPIN_MOCK_MIG), and the driver's capabilities tree for them in the fake /proc.
    fn with_mig(
        test: &str,
        profile: &'static str,
        inventory: &str,
        mig: Option<&'static str>,
    ) -> Option<MockHost> {
        if !need_root(test) {
            return None;
        }
        let mock = required(test, mock_dir())?;
        let out = Command::new(mock.join("mocknvml-profile"))
            .arg(profile)
            .env("GPUPIN_MOCK_MIG", mig.unwrap_or_default())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let served: Value = serde_json::from_slice(&out.stdout).unwrap();
        let dir = tempfile::Builder::new()
            .prefix("gpupin-nvml-mock")
            .tempdir()
            .unwrap();
        let host = MockHost {
            dir,
            mock,
            profile,
            served,
            mig,
        };
        host.write_fake_host();
        let state = host.root().join("state");
        std::fs::write(
            host.config(),
            format!(
                "state_dir = {state:?}\naudit_log = {:?}\ninventory = {inventory:?}\npolicy = \"pack\"\n\
                 # Every allocation asks NVML again: the tests change the figures between runs.\n\
                 live_cache = \"0s\"\n",
                state.join("audit.log")
            ),
        )
        .unwrap();
        Some(host)
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn config(&self) -> PathBuf {
        self.root().join("gpupin.toml")
    }

    fn live_file(&self) -> PathBuf {
        self.root().join("mock-live.json")
    }

    fn gpus(&self) -> &Vec<Value> {
        self.served["gpus"].as_array().unwrap()
    }

    /// GPU i's NUMA node and local CPUs in the fake sysfs: the first half of the GPUs on
    /// node 0, the rest on node 1, as on a two-socket server.
    fn locality(&self, i: usize) -> (u64, &'static str) {
        match i < self.gpus().len() / 2 {
            true => (0, "0-15,32-47"),
            false => (1, "16-31,48-63"),
        }
    }

    /// The fake /proc/devices, /proc/driver/nvidia (one `information` file per GPU, and
    /// `version`) and /sys/bus/pci/devices, and the script that mounts them and runs gpupin.
    fn write_fake_host(&self) {
        let root = self.root();
        // A driver with MIG support registers nvidia-caps.
        let caps = match self.mig {
            Some(_) => format!("{CAPS_MAJOR} nvidia-caps\n"),
            None => String::new(),
        };
        std::fs::write(
            root.join("devices"),
            format!(
                "Character devices:\n  1 mem\n  4 tty\n{GPU_MAJOR} nvidia-frontend\n{GPU_MAJOR} nvidia\n\
                 {UVM_MAJOR} nvidia-uvm\n{caps}\nBlock devices:\n  8 sd\n"
            ),
        )
        .unwrap();
        self.write_capabilities();
        let driver = root.join("driver/nvidia");
        std::fs::create_dir_all(driver.join("gpus")).unwrap();
        std::fs::write(
            driver.join("version"),
            format!(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {}  Tue Feb 20 00:00:00 UTC 2024\n",
                self.served["driver"].as_str().unwrap()
            ),
        )
        .unwrap();
        let pci = root.join("pci");
        for (i, gpu) in self.gpus().iter().enumerate() {
            let bus = gpu["pci_bus_id"].as_str().unwrap();
            let info = driver.join("gpus").join(bus);
            std::fs::create_dir_all(&info).unwrap();
            std::fs::write(
                info.join("information"),
                format!(
                    "Model: \t\t {}\nIRQ:   \t\t 0\nGPU UUID: \t {}\nVideo BIOS: \t ??.??.??.??.??\n\
                     Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
                     Bus Location: \t {bus}\nDevice Minor: \t {}\nGPU Excluded:\t No\n",
                    gpu["name"].as_str().unwrap(),
                    gpu["uuid"].as_str().unwrap(),
                    gpu["minor"]
                ),
            )
            .unwrap();
            let dev = pci.join(bus);
            std::fs::create_dir_all(&dev).unwrap();
            let (node, cpus) = self.locality(i);
            std::fs::write(dev.join("numa_node"), format!("{node}\n")).unwrap();
            std::fs::write(dev.join("local_cpulist"), format!("{cpus}\n")).unwrap();
        }
        let script = root.join("on-mock-host");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nset -e\n\
                 mount --bind {root}/driver /proc/driver\n\
                 mount --bind {root}/devices /proc/devices\n\
                 mount --bind {root}/pci /sys/bus/pci/devices\n\
                 exec \"$@\"\n",
                root = root.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// `gpupin --config <ours> ARGS` on the mock host.
    fn run(&self, args: &[&str]) -> Output {
        self.run_with(&self.config(), args)
    }

    /// `gpupin --config CONFIG ARGS` on the mock host.
    fn run_with(&self, config: &Path, args: &[&str]) -> Output {
        self.command(config, args).output().unwrap()
    }

    /// The command that runs `gpupin --config CONFIG ARGS` on the mock host.
    fn command(&self, config: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private"])
            .arg(self.root().join("on-mock-host"))
            .arg(binary(GPUPIN))
            .arg("--config")
            .arg(config)
            .args(args)
            .env("LD_LIBRARY_PATH", &self.mock)
            .env("GPUPIN_MOCK_NVML_PROFILE", self.profile)
            .env("GPUPIN_MOCK_MIG", self.mig.unwrap_or_default())
            .stdin(Stdio::null());
        if self.live_file().exists() {
            cmd.env("GPUPIN_MOCK_NVML_LIVE", self.live_file());
        }
        if self.health_file().exists() {
            cmd.env("GPUPIN_MOCK_NVML_HEALTH", self.health_file());
        }
        if self.nvml_open().exists() {
            cmd.env("GPUPIN_MOCK_NVML_OPEN", self.nvml_open());
        }
        cmd
    }

    /// Where the mock marks each process that has NVML open (tests/peers/mocknvml/open.go),
    /// once a test made it.
    fn nvml_open(&self) -> PathBuf {
        self.root().join("nvml-open")
    }

    /// The mock's health file (events and error counters; tests/peers/mocknvml/health.go).
    fn health_file(&self) -> PathBuf {
        self.root().join("mock-health.json")
    }

    /// Rewrites the health file whole (renamed into place: the mock reads it at every
    /// call and must never see half of it).
    fn set_health(&self, health: &Value) {
        let temp = self.root().join(".mock-health.json");
        std::fs::write(&temp, health.to_string()).unwrap();
        std::fs::rename(&temp, self.health_file()).unwrap();
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "gpupin {args:?} on {}: {}{}",
            self.profile,
            stdout(&out),
            text(&out.stderr)
        );
        stdout(&out)
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    /// Sets the figures the mock answers from the next gpupin on.
    /// GPU `gpu`'s fence as `gpupin status --json` shows it (null: none).
    fn fence_of(&self, gpu: usize) -> Value {
        self.json(&["status", "--json"])["gpus"][gpu]["fence"].clone()
    }

    fn set_live(&self, figures: Value) {
        std::fs::write(self.live_file(), figures.to_string()).unwrap();
    }

    /// GPU i's bus id as NVML writes it (8-digit domain, upper case): the mock keeps the
    /// 4-digit sysfs form, which gpupin normalizes.
    fn nvml_bus_id(&self, i: usize) -> String {
        let bus = self.gpus()[i]["pci_bus_id"].as_str().unwrap();
        format!("0000{}", bus.to_ascii_uppercase())
    }

    /// What `gpupin inventory --json` must print for GPU i.
    fn expected_gpu(&self, i: usize) -> Value {
        let gpu = &self.gpus()[i];
        let (node, cpus) = self.locality(i);
        json!({
            "index": gpu["index"],
            "uuid": gpu["uuid"],
            "name": gpu["name"],
            "memory_bytes": gpu["memory_bytes"],
            "pci_bus_id": self.nvml_bus_id(i),
            "minor": gpu["minor"],
            "numa_node": node,
            "local_cpus": cpus,
        })
    }
}

fn control_nodes() -> Value {
    json!([
        {"path": "/dev/nvidiactl", "major": GPU_MAJOR, "minor": 255},
        {"path": "/dev/nvidia-uvm", "major": UVM_MAJOR, "minor": 0},
        {"path": "/dev/nvidia-uvm-tools", "major": UVM_MAJOR, "minor": 1},
    ])
}

/// `gpupin inventory --json` and the `gpupin nvml inventory` helper (what the static hook
/// and shim ask) equal what the profile serves: every GPU's UUID, name, memory, bus id and
/// minor from NVML, NUMA and CPUs from sysfs, majors from /proc/devices. NVIDIA's mock
/// models no NVLink and no PCIe topology (every such query answers NOT_SUPPORTED), so the
/// link matrix is left out rather than guessed.
fn inventory_equals_the_profile(test: &str, profile: &'static str) {
    let Some(host) = MockHost::new(test, profile, "nvml") else {
        return;
    };
    assert_eq!(host.gpus().len(), 8, "{}", host.served);
    let inv = host.json(&["inventory", "--json"]);
    let expected: Vec<Value> = (0..8).map(|i| host.expected_gpu(i)).collect();
    assert_eq!(inv["source"], "nvml");
    assert_eq!(inv["gpus"], json!(expected), "{inv:#}");
    assert_eq!(inv["gpu_major"], GPU_MAJOR);
    assert_eq!(inv["control_nodes"], control_nodes());
    assert_eq!(inv["links"], Value::Null);

    // The helper prints the inventory file format (`memory`, not `memory_bytes`).
    let helper = host.json(&["nvml", "inventory"]);
    let from_helper: Vec<Value> = helper["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let mut g = g.clone();
            let memory = g.as_object_mut().unwrap().remove("memory").unwrap();
            g["memory_bytes"] = memory;
            g
        })
        .collect();
    assert_eq!(json!(from_helper), json!(expected), "{helper:#}");
    assert_eq!(helper["gpu_major"], GPU_MAJOR);
    assert_eq!(helper["control_nodes"], control_nodes());
    assert_eq!(
        helper.get("links").cloned().unwrap_or(Value::Null),
        Value::Null
    );

    // A second probe (the cache is bypassed) answers the same GPUs: the mock's UUIDs are
    // fixed per profile, as a real driver's are.
    let again = host.json(&["inventory", "--refresh", "--json"]);
    assert_eq!(again["gpus"], inv["gpus"]);
}

#[test]
fn dgx_a100_inventory_equals_the_profile() {
    inventory_equals_the_profile("dgx_a100_inventory_equals_the_profile", "dgxa100");
}

#[test]
fn dgx_h100_inventory_equals_the_profile() {
    inventory_equals_the_profile("dgx_h100_inventory_equals_the_profile", "dgxh100");
}

#[test]
fn a30_pcie_inventory_equals_the_profile() {
    inventory_equals_the_profile("a30_pcie_inventory_equals_the_profile", "a30pcie");
}

/// `inventory = "auto"` takes NVML first when it loads, not the procfs files beside it.
#[test]
fn auto_takes_nvml_on_a_mock_host() {
    let Some(host) = MockHost::new("auto_takes_nvml_on_a_mock_host", "dgxa100", "auto") else {
        return;
    };
    let inv = host.json(&["inventory", "--json"]);
    assert_eq!(inv["source"], "nvml");
    // procfs has no memory figure: a nonzero one says NVML answered.
    assert_eq!(inv["gpus"][0], host.expected_gpu(0));
    let text = host.ok(&["inventory"]);
    assert!(
        text.contains(host.gpus()[7]["uuid"].as_str().unwrap()),
        "{text}"
    );
}

const GIB: u64 = 1 << 30;

/// One GPU's figures in the mock's live file.
fn figures(index: usize, utilization: u32, used_gib: u64) -> Value {
    json!({"index": index, "utilization": utilization, "memory_used": used_gib * GIB})
}

/// Live figures through NVML equal what the mock answers, in `gpupin nvml live`, `gpupin
/// status` and the least-loaded and most-free picks, and follow it when it changes.
#[test]
fn live_figures_come_from_nvml_and_follow_the_mock() {
    let Some(host) = MockHost::new(
        "live_figures_come_from_nvml_and_follow_the_mock",
        "dgxh100",
        "nvml",
    ) else {
        return;
    };
    let total = host.gpus()[0]["memory_bytes"].as_u64().unwrap();
    let mut gpus: Vec<Value> = (0..8).map(|i| figures(i, 50, 10)).collect();
    gpus[2] = json!({"index": 2, "utilization": 97, "memory_used": 70 * GIB,
        "temperature": 71, "power_mw": 612_400,
        "processes": [{"pid": 4242, "used_memory": 60 * GIB}, {"pid": 4343, "used_memory": 10 * GIB}]});
    gpus[5] = figures(5, 3, 40);
    gpus[6] = figures(6, 20, 1);
    host.set_live(json!({ "gpus": gpus }));

    let live = host.json(&["nvml", "live"]);
    let uuid = |i: usize| host.gpus()[i]["uuid"].clone();
    assert_eq!(
        live["gpus"][2],
        json!({"uuid": uuid(2), "utilization": 97, "memory_free": total - 70 * GIB,
            // NVML says milliwatts; gpupin rounds to watts.
            "temperature": 71, "power": 612,
            "processes": [{"pid": 4242, "used_memory": 60 * GIB}, {"pid": 4343, "used_memory": 10 * GIB}]}),
        "{live:#}"
    );
    // Figures the mock does not answer stay unknown rather than zero.
    assert_eq!(
        live["gpus"][5],
        json!({"uuid": uuid(5), "utilization": 3, "memory_free": total - 40 * GIB,
            "temperature": null, "power": null, "processes": null})
    );

    let status = host.json(&["status", "--json"]);
    let gpu2 = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == 2)
        .unwrap_or_else(|| panic!("{status:#}"));
    let shown = gpu2.to_string();
    for wanted in [
        "\"utilization\":97",
        &format!("\"memory_free\":{}", total - 70 * GIB),
        "\"temperature\":71",
        "\"power\":612",
        "\"pid\":4242",
    ] {
        assert!(shown.contains(wanted), "{wanted} not in {gpu2:#}");
    }
    let table = host.ok(&["status", "--long"]);
    assert!(
        table.lines().any(|l| l.starts_with("2 ")
            && l.contains("97%")
            && l.contains("71C")
            && l.contains("612W")),
        "{table}"
    );

    let pick = |policy: &str, count: &str| {
        let v = host.json(&["pick", "--policy", policy, "--count", count, "--json"]);
        v["gpus"]
            .as_array()
            .unwrap_or_else(|| panic!("{v:#}"))
            .iter()
            .map(|g| g.as_u64().unwrap_or_else(|| g["index"].as_u64().unwrap()))
            .collect::<Vec<u64>>()
    };
    // Least loaded: GPU 5 (3%), then 6 (20%).
    assert_eq!(pick("least-loaded", "2"), [5, 6]);
    // Most free: GPU 6 (1 GiB used).
    assert_eq!(pick("most-free", "1"), [6]);

    // The mock changes: GPU 5 is busy now, GPU 1 idle and empty.
    gpus[5] = figures(5, 99, 79);
    gpus[1] = figures(1, 0, 0);
    host.set_live(json!({ "gpus": gpus }));
    assert_eq!(pick("least-loaded", "2"), [1, 6]);
    assert_eq!(pick("most-free", "1"), [1]);
    let live = host.json(&["nvml", "live"]);
    assert_eq!(live["gpus"][5]["utilization"], 99);
    assert_eq!(live["gpus"][1]["memory_free"], total);
}

/// A GPU whose utilization NVML does not report (NOT_SUPPORTED: NVIDIA's mock for every
/// GPU the test gives no utilization, a real driver for a GPU in MIG mode) keeps its
/// other figures and the other GPUs theirs: `nvml live` and `status` show it unknown,
/// most-free still chooses by memory, least-loaded takes GPUs with a known load first.
#[test]
fn a_gpu_without_utilization_keeps_the_other_figures() {
    let Some(host) = MockHost::new(
        "a_gpu_without_utilization_keeps_the_other_figures",
        "dgxa100",
        "nvml",
    ) else {
        return;
    };
    let total = host.gpus()[0]["memory_bytes"].as_u64().unwrap();
    // GPUs 0-3 without utilization; GPU 1 has the most free memory, GPU 6 the least load.
    let gpus: Vec<Value> = (0..8)
        .map(|i| match i {
            0 | 2 | 3 => json!({"index": i, "memory_used": 20 * GIB}),
            1 => json!({"index": i, "memory_used": GIB}),
            6 => figures(i, 10, 30),
            _ => figures(i, 60, 20),
        })
        .collect();
    host.set_live(json!({ "gpus": gpus }));

    let live = host.json(&["nvml", "live"]);
    assert_eq!(live["gpus"][1]["utilization"], Value::Null, "{live:#}");
    assert_eq!(live["gpus"][1]["memory_free"], total - GIB, "{live:#}");
    assert_eq!(live["gpus"][6]["utilization"], 10, "{live:#}");

    let table = host.ok(&["status", "--long"]);
    assert!(!table.contains("no live figures"), "{table}");
    let row = |i: usize| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{i} ")) && l.contains("GiB"))
            .unwrap_or_else(|| panic!("no figures of GPU {i} in {table}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(row(1)[1], "-", "{table}");
    assert_eq!(row(6)[1], "10%", "{table}");
    let status = host.json(&["status", "--json"]);
    let gpu1 = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == 1)
        .unwrap()
        .to_string();
    assert!(gpu1.contains("\"utilization\":null"), "{gpu1}");

    let pick = |policy: &str, count: &str| {
        let out = host.run(&["pick", "--policy", policy, "--count", count]);
        assert!(out.status.success(), "{out:?}");
        let line = stdout(&out).lines().next().unwrap_or_default().to_string();
        line.rsplit(' ').next().unwrap_or_default().to_string()
    };
    // gpupin metrics: the memory gauges from NVML, no utilization sample for GPU 1.
    let metrics = host.ok(&["metrics"]);
    for wanted in [
        format!("gpupin_gpu_memory_total_bytes{{gpu=\"1\"}} {total}"),
        format!("gpupin_gpu_memory_free_bytes{{gpu=\"1\"}} {}", total - GIB),
        "gpupin_gpu_utilization_ratio{gpu=\"6\"} 0.1".to_string(),
    ] {
        assert!(
            metrics.lines().any(|l| l == wanted),
            "{wanted} not in {metrics}"
        );
    }
    assert!(
        !metrics.contains("gpupin_gpu_utilization_ratio{gpu=\"1\"}"),
        "{metrics}"
    );

    assert_eq!(pick("most-free", "1"), "1");
    // Known loads first (6 at 10%, then 4, 5, 7 at 60%), unknown ones after them.
    assert_eq!(pick("least-loaded", "4"), "4,5,6,7");
    assert_eq!(pick("least-loaded", "5"), "1,4,5,6,7");
}

/// `gpupin doctor` on the mock host: the driver, NVML and CUDA versions NVML gives, the
/// inventory it found, and NVML and procfs agreeing on UUIDs, minors and bus ids (the
/// bus ids in the mock's 4-digit form and /proc's are compared normalized).
#[test]
fn doctor_reads_the_mock() {
    let Some(host) = MockHost::new("doctor_reads_the_mock", "dgxh100", "nvml") else {
        return;
    };
    // Doctor exits non-zero here: the mock host has no /dev/nvidia* nodes.
    let out = host.run(&["doctor"]);
    let report = stdout(&out);
    let driver = host.served["driver"].as_str().unwrap();
    let nvml = host.served["nvml"].as_str().unwrap();
    assert!(
        report.lines().any(|l| l.starts_with("ok")
            && l.contains(&format!("driver {driver}: NVML {nvml} loads, CUDA 12.4"))),
        "{report}{}",
        text(&out.stderr)
    );
    let name = host.gpus()[0]["name"].as_str().unwrap();
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("ok") && l.contains(&format!("inventory nvml: 8 GPUs ({name})"))),
        "{report}"
    );
    // The fake /proc/driver/nvidia says what the mock says, as a driver's does.
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("NVML and procfs agree on 8 GPUs")),
        "{report}"
    );
}

/// The multiarch library directory the loader searches without LD_LIBRARY_PATH.
const SYSTEM_LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

impl MockHost {
    /// `gpupin serve` on the mock host, watching the GPUs' health (`[health]` with a 1 s
    /// poll, and `health` lines besides) from an empty health file; returns once its
    /// socket is there.
    fn serve(&self, health: &str) -> Serve {
        self.set_health(&json!({"events": [], "gpus": []}));
        let socket = self.root().join("gpupin.sock");
        let mut config = std::fs::read_to_string(self.config()).unwrap();
        config.push_str(&format!(
            "socket = {socket:?}\n[health]\npoll = \"1s\"\n{health}"
        ));
        std::fs::write(self.config(), config).unwrap();
        let log = self.root().join("serve.log");
        let child = self
            .command(&self.config(), &["serve"])
            .env("GPUPIN_LOG", "info")
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let serve = Serve { child, log };
        let started = std::time::Instant::now();
        while !socket.exists() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "no socket from gpupin serve:\n{}",
                serve.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        serve
    }

    /// Whether the mock can be overlaid on the loader's default directory (hooks and
    /// runtimes run with an empty environment); `None` (after saying why) where not.
    fn overlay_possible(&self, test: &str) -> Option<()> {
        required(
            test,
            Path::new(SYSTEM_LIB_DIR)
                .is_dir()
                .then_some(())
                .ok_or(format!("no {SYSTEM_LIB_DIR} to overlay the mock on")),
        )
    }

    /// A sandbox whose gpupin config (`extra` lines besides) takes the inventory from
    /// NVML and whose runc runs on the mock host (`runc_wrapper`), with the real runc's
    /// path; `None` where the test cannot run.
    fn sandbox(
        &self,
        test: &str,
        extra: &str,
    ) -> Option<(gpupin_sandbox::harness::Sandbox, PathBuf)> {
        self.overlay_possible(test)?;
        let mut sb = gpupin_sandbox::harness::Sandbox::with_config(GPUPIN, test, "nvml", extra)?;
        let runc = sb.runc.binary.clone();
        let root = sb.runc.root.clone();
        sb.runc = gpupin_sandbox::Runc::new(&self.runc_wrapper(&runc, true), &root);
        Some((sb, runc))
    }

    /// A `runc` that runs the real one (`runc`) on the mock host, with the mock in the
    /// loader's default search path: an overlay of `<root>/lib` (a copy of the library,
    /// the profile's name and the live figures beside it) on SYSTEM_LIB_DIR, since runc
    /// runs hooks with an empty environment and gpupin-hook's NVML helper inherits it.
    /// `with_nvml: false` leaves NVML out, as on a host whose driver is gone.
    fn runc_wrapper(&self, runc: &Path, with_nvml: bool) -> PathBuf {
        let name = if with_nvml {
            "runc"
        } else {
            "runc-without-nvml"
        };
        self.wrapper(name, &[runc.display().to_string()], with_nvml)
    }

    /// A script `name` that runs `program` with its own arguments after them on the mock
    /// host, NVML overlaid as for `runc_wrapper`.
    fn wrapper(&self, name: &str, program: &[String], with_nvml: bool) -> PathBuf {
        let lib = self.root().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::copy(
            self.mock.join("libnvidia-ml.so.1"),
            lib.join("libnvidia-ml.so.1"),
        )
        .unwrap();
        std::fs::write(lib.join("mock-nvml.profile"), self.profile).unwrap();
        if let Some(mig) = self.mig {
            std::fs::write(lib.join("mock-nvml-mig"), mig).unwrap();
        }
        let overlay = match with_nvml {
            true => format!(
                "mount -t overlay overlay -o lowerdir={}:{SYSTEM_LIB_DIR} {SYSTEM_LIB_DIR}; ",
                lib.display()
            ),
            false => String::new(),
        };
        let program: Vec<String> = program.iter().map(|a| format!("'{a}'")).collect();
        let script = self.root().join(name);
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nexec unshare --mount --propagation private /bin/sh -e -c '{overlay}exec \"$@\"' mock-host '{}' {} \"$@\"\n",
                self.root().join("on-mock-host").display(),
                program.join(" ")
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script
    }

    /// Sets the figures the mock answers to hooks (the file beside the overlaid library).
    fn set_hook_live(&self, figures: Value) {
        let lib = self.root().join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        std::fs::write(lib.join("mock-nvml-live.json"), figures.to_string()).unwrap();
    }
}

/// gpupin-hook in a runc container start with `inventory = "nvml"`: it never loads NVML
/// itself but asks `gpupin nvml inventory|live` beside it. The first start misses the
/// inventory cache and gets the mock's GPUs through the helper, with least-loaded
/// choosing by the mock's figures; the next start, with NVML gone, is served from the
/// cache the first one wrote.
#[test]
fn the_hook_gets_the_mock_through_the_helper_then_from_its_cache() {
    use gpupin_sandbox::Runc;
    use gpupin_sandbox::harness::status::{held_minors, holder};
    use gpupin_sandbox::harness::{char_node, nvidia_gpu_nodes, stat_node};
    let test = "the_hook_gets_the_mock_through_the_helper_then_from_its_cache";
    let Some(host) = MockHost::new(test, "dgxh100", "nvml") else {
        return;
    };
    let Some((mut sb, runc)) = host.sandbox(test, "live_cache = \"0s\"") else {
        return;
    };
    let root = sb.runc.root.clone();
    // GPU 5 the least loaded, then GPU 2; the rest busy.
    let gpus: Vec<Value> = (0..8)
        .map(|i| match i {
            5 => figures(i, 1, 10),
            2 => figures(i, 2, 10),
            _ => figures(i, 70, 10),
        })
        .collect();
    host.set_hook_live(json!({ "gpus": gpus }));
    let cache = sb.gpupin.state_dir.join("inventory.json");
    assert!(!cache.exists());

    let id = sb.id("nvml-miss");
    let spec = sb
        .spec()
        .annotation("gpupin.count", "2")
        .annotation("gpupin.policy", "least-loaded");
    // `gpupin status` on the mock host, for the sandbox's ledger.
    let status = || {
        let out = host.run_with(&sb.gpupin.config, &["status", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let c = sb.start(&id, &spec).unwrap();
    // The first start on a host without a state dir made it and cached the inventory
    // (read before `gpupin status`, which would cache it too).
    let cached: Value = serde_json::from_slice(&std::fs::read(&cache).unwrap()).unwrap();
    assert_eq!(cached["backend"], "nvml", "{cached:#}");
    assert_eq!(held_minors(&status(), &id), [2, 5]);
    assert_eq!(nvidia_gpu_nodes(&c), ["nvidia2", "nvidia5"]);
    for minor in [2, 5] {
        assert_eq!(
            stat_node(&c, &format!("/dev/nvidia{minor}")),
            char_node(GPU_MAJOR as u32, minor)
        );
    }
    assert_eq!(
        stat_node(&c, "/dev/nvidiactl"),
        char_node(GPU_MAJOR as u32, 255)
    );
    let holder = holder(&status(), &id).expect("held while running");
    let uuid = |i: usize| host.gpus()[i]["uuid"].clone();
    assert_eq!(holder["gpus"], json!([uuid(2), uuid(5)]), "{holder:#}");
    assert_eq!(
        cached["inventory"]["gpus"][7]["uuid"],
        uuid(7),
        "{cached:#}"
    );
    c.stop().unwrap();

    // The inventory from the cache, the live figures from the helper again.
    let id = sb.id("nvml-live-again");
    let c = sb
        .start(
            &id,
            &sb.spec()
                .annotation("gpupin.count", "1")
                .annotation("gpupin.policy", "least-loaded"),
        )
        .unwrap();
    assert_eq!(held_minors(&status(), &id), [5]);
    c.stop().unwrap();

    // NVML gone: the cache alone answers the next start.
    sb.runc = Runc::new(&host.runc_wrapper(&runc, false), &root);
    let id = sb.id("nvml-hit");
    let c = sb
        .start(&id, &sb.spec().annotation("gpupin.count", "1"))
        .unwrap();
    assert_eq!(sb.gpupin.held_minors(&id), [0]);
    assert_eq!(nvidia_gpu_nodes(&c), ["nvidia0"]);
    let holder = sb.gpupin.holder(&id).expect("held while running");
    assert_eq!(holder["gpus"], json!([uuid(0)]), "{holder:#}");
    c.stop().unwrap();
}

/// gpupin-runtime (the runtime Docker and containerd run; statically linked in release
/// builds) with `inventory = "nvml"`: it pins on `run` through the `gpupin nvml` helper
/// beside it and hands the container to runc; most-free chooses by the mock's memory.
#[test]
fn the_runtime_gets_the_mock_through_the_helper() {
    use gpupin_sandbox::harness::status::{held_minors, holder};
    use gpupin_sandbox::harness::{Sandbox, char_node, nvidia_gpu_nodes, stat_node};
    use gpupin_sandbox::{BundleSpec, Runc};
    let test = "the_runtime_gets_the_mock_through_the_helper";
    let Some(host) = MockHost::new(test, "a30pcie", "nvml") else {
        return;
    };
    if host.overlay_possible(test).is_none() {
        return;
    }
    let Some(mut sb) = Sandbox::with_config(GPUPIN, test, "nvml", "live_cache = \"0s\"") else {
        return;
    };
    let runtime = sb.gpupin.bin.with_file_name("gpupin-runtime");
    let program = [
        runtime.display().to_string(),
        "--gpupin-config".to_string(),
        sb.gpupin.config.display().to_string(),
        "--gpupin-runtime".to_string(),
        sb.runc.binary.display().to_string(),
    ];
    let root = sb.runc.root.clone();
    sb.runc = Runc::new(&host.wrapper("gpupin-runtime", &program, true), &root);
    // GPU 3 has the most free memory, then GPU 6.
    let gpus: Vec<Value> = (0..8)
        .map(|i| match i {
            3 => figures(i, 50, 1),
            6 => figures(i, 50, 2),
            _ => figures(i, 50, 20),
        })
        .collect();
    host.set_hook_live(json!({ "gpus": gpus }));

    let id = sb.id("runtime");
    let spec = BundleSpec::sleeper(&sb.rootfs)
        .annotation("gpupin.count", "2")
        .annotation("gpupin.policy", "most-free");
    let c = sb.start(&id, &spec).unwrap();
    let out = host.run_with(&sb.gpupin.config, &["status", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(held_minors(&status, &id), [3, 6], "{status:#}");
    let uuid = |i: usize| host.gpus()[i]["uuid"].clone();
    let held = holder(&status, &id).expect("held while running");
    assert_eq!(held["gpus"], json!([uuid(3), uuid(6)]), "{held:#}");
    assert_eq!(nvidia_gpu_nodes(&c), ["nvidia3", "nvidia6"]);
    assert_eq!(
        stat_node(&c, "/dev/nvidia6"),
        char_node(GPU_MAJOR as u32, 6)
    );
    c.stop().unwrap();
}

/// The device plugin's view of a mock host, as the kubelet gets it: every GPU by the
/// UUID NVML gives, in NVML's order, with the NUMA node sysfs gives; an Allocate of one
/// GPU gets its node by NVML's minor number and its UUID in NVIDIA_VISIBLE_DEVICES, and
/// `gpupin status` holds it. (The real kubelet's side is tests/kubelet_e2e.rs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_plugin_offers_the_mocks_gpus() {
    let test = "the_device_plugin_offers_the_mocks_gpus";
    let Some(host) = MockHost::new(test, "dgxh100", "nvml") else {
        return;
    };
    let plugin_dir = host.root().join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let mut registered = kubelet_fake::serve_registration(&plugin_dir);
    let log = host.root().join("device-plugin.log");
    let plugin_dir_arg = plugin_dir.display().to_string();
    // No pod-resources socket: the plugin then releases nothing, which this test needs.
    let no_pods = host.root().join("no-pod-resources.sock");
    let mut plugin = host
        .command(
            &host.config(),
            &[
                "device-plugin",
                "--plugin-dir",
                &plugin_dir_arg,
                "--pod-resources-socket",
                no_pods.to_str().unwrap(),
            ],
        )
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let plugin_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let patience = std::time::Duration::from_secs(120);
    let request = tokio::time::timeout(patience, registered.recv())
        .await
        .unwrap_or_else(|_| panic!("the plugin never registered; its log:\n{}", plugin_log()))
        .unwrap();
    let mut client =
        DevicePluginClient::new(kubelet_fake::connect(&plugin_dir.join(&request.endpoint)).await);
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = tokio::time::timeout(patience, stream.message())
        .await
        .unwrap_or_else(|_| panic!("no device list; plugin log:\n{}", plugin_log()))
        .unwrap()
        .expect("the stream stays open");
    let offered: Vec<(String, String, i64)> = list
        .devices
        .iter()
        .map(|d| {
            let node = d.topology.as_ref().unwrap().nodes[0].id;
            (d.id.clone(), d.health.clone(), node)
        })
        .collect();
    let expected: Vec<(String, String, i64)> = (0..host.gpus().len())
        .map(|i| {
            let uuid = host.gpus()[i]["uuid"].as_str().unwrap().to_string();
            (uuid, "Healthy".to_string(), host.locality(i).0 as i64)
        })
        .collect();
    assert_eq!(offered, expected);

    let last = host.gpus().len() - 1;
    let gpu = &host.gpus()[last];
    let uuid = gpu["uuid"].as_str().unwrap().to_string();
    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuid.clone()],
            }],
        })
        .await
        .unwrap_or_else(|s| panic!("Allocate failed: {}; log:\n{}", s.message(), plugin_log()))
        .into_inner();
    let response = &allocated.container_responses[0];
    assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], uuid);
    let nodes: Vec<&str> = response
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    assert_eq!(
        nodes[0],
        format!("/dev/nvidia{}", gpu["minor"]),
        "{nodes:?}"
    );
    let status = host.json(&["status", "--json"]);
    let held: Vec<&Value> = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["source"] == "device-plugin")
        .collect();
    assert_eq!(held.len(), 1, "{status}");
    assert_eq!(held[0]["gpus"], json!([uuid]));
    let _ = plugin.kill();
    let _ = plugin.wait();
}

/// The geometry of the MIG tests: an A100 80GB's GPU 0 cut as admins often cut it, GPU 7
/// in MIG mode with no instances.
const MIG_GEOMETRY: &str = "0:3g.40gb,2g.20gb,1g.10gb,1g.10gb;7:";

/// The capability minors the driver gives GPU instance `gi` (and its compute instance
/// `ci`) of the GPU with minor `gpu_minor`: its fixed table, the one
/// /proc/driver/nvidia-caps/mig-minors lists.
fn cap_minors(gpu_minor: u64, gi: u64, ci: u64) -> (u64, u64) {
    let gi_minor = 3 + gpu_minor * 15 * 9 + gi * 9;
    (gi_minor, gi_minor + 1 + ci)
}

impl MockHost {
    /// The MIG devices the mock serves for GPU i (`mocknvml-profile`); none when not in
    /// MIG mode.
    fn migs(&self, i: usize) -> Vec<Value> {
        self.gpus()[i]["mig"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// The driver's capabilities tree for the mock's MIG devices, in its formats:
    /// `capabilities/gpu<minor>/mig/gi<X>/access` and `.../ci<Y>/access`
    /// (`DeviceFileMinor: N`), and nvidia-caps/mig-minors with its lines for them.
    fn write_capabilities(&self) {
        if self.mig.is_none() {
            return;
        }
        let driver = self.root().join("driver");
        let access = |minor: u64| {
            format!("DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        };
        let mut minors = String::from("config 1\nmonitor 2\n");
        for gpu in self.gpus() {
            let gpu_minor = gpu["minor"].as_u64().unwrap();
            for m in gpu["mig"].as_array().into_iter().flatten() {
                let (gi, ci) = (m["gi"].as_u64().unwrap(), m["ci"].as_u64().unwrap());
                let (gi_minor, ci_minor) = cap_minors(gpu_minor, gi, ci);
                let gi_dir = driver.join(format!("nvidia/capabilities/gpu{gpu_minor}/mig/gi{gi}"));
                std::fs::create_dir_all(gi_dir.join(format!("ci{ci}"))).unwrap();
                std::fs::write(gi_dir.join("access"), access(gi_minor)).unwrap();
                std::fs::write(gi_dir.join(format!("ci{ci}/access")), access(ci_minor)).unwrap();
                minors.push_str(&format!(
                    "gpu{gpu_minor}/gi{gi}/access {gi_minor}\ngpu{gpu_minor}/gi{gi}/ci{ci}/access {ci_minor}\n"
                ));
            }
        }
        std::fs::create_dir_all(driver.join("nvidia-caps")).unwrap();
        std::fs::write(driver.join("nvidia-caps/mig-minors"), minors).unwrap();
    }

    /// What `gpupin inventory --json` must list under GPU i: the mock's MIG devices, with
    /// their capability minors from the fake capabilities tree.
    fn expected_migs(&self, i: usize) -> Vec<Value> {
        let gpu = &self.gpus()[i];
        self.migs(i)
            .iter()
            .map(|m| {
                let (gi_minor, ci_minor) = cap_minors(
                    gpu["minor"].as_u64().unwrap(),
                    m["gi"].as_u64().unwrap(),
                    m["ci"].as_u64().unwrap(),
                );
                json!({
                    "index": m["index"],
                    "uuid": m["uuid"],
                    "profile": m["profile"],
                    "memory_bytes": m["memory_bytes"],
                    "access": {"gi": m["gi"], "ci": m["ci"], "gi_minor": gi_minor, "ci_minor": ci_minor},
                    "parent_index": gpu["index"],
                    "parent_uuid": gpu["uuid"],
                    "parent_minor": gpu["minor"],
                })
            })
            .collect()
    }
}

/// `gpupin inventory` through NVML on NVIDIA's mock with MIG (GPU instances and compute
/// instances created through the mock's own calls): the instances under their parent with
/// NVML's UUIDs, profiles, memory and GI/CI ids, and the capability minors from the
/// driver's capabilities tree; a GPU in MIG mode with no instances is said to be so; the
/// `gpupin nvml` helper (what the static hook asks) says the same.
#[test]
fn mig_instances_come_from_nvml_under_their_parent() {
    let test = "mig_instances_come_from_nvml_under_their_parent";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    assert_eq!(host.migs(0).len(), 4, "{}", host.served);
    let inv = host.json(&["inventory", "--json"]);
    assert_eq!(inv["source"], "nvml");
    assert_eq!(
        inv["gpus"][0]["mig"],
        json!(host.expected_migs(0)),
        "{inv:#}"
    );
    assert_eq!(inv["gpus"][7]["mig"], json!([]), "{inv:#}");
    assert_eq!(inv["caps_major"], CAPS_MAJOR, "{inv:#}");
    for i in 1..7 {
        assert_eq!(inv["gpus"][i].get("mig"), None, "GPU {i}: {inv:#}");
        assert_eq!(inv["gpus"][i], host.expected_gpu(i));
    }
    let profiles: Vec<String> = host
        .migs(0)
        .iter()
        .map(|m| m["profile"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(profiles, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]);

    let text = host.ok(&["inventory"]);
    for (m, want) in host.migs(0).iter().zip(host.expected_migs(0)) {
        let uuid = m["uuid"].as_str().unwrap();
        let line = text
            .lines()
            .find(|l| l.contains(uuid))
            .unwrap_or_else(|| panic!("no line for {uuid}: {text}"));
        let caps = format!(
            "nvidia-cap{},{}",
            want["access"]["gi_minor"], want["access"]["ci_minor"]
        );
        assert!(
            line.trim_start().starts_with(&format!("0:{}", m["index"]))
                && line.contains(&format!("MIG {}", m["profile"].as_str().unwrap()))
                && line.contains(&caps),
            "{line}"
        );
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("7 ") && l.contains("[MIG mode, no instances]")),
        "{text}"
    );

    // The helper's file format carries the same instances (memory as `memory`).
    let helper = host.json(&["nvml", "inventory"]);
    let mig = helper["gpus"][0]["mig"].as_array().unwrap();
    assert_eq!(mig.len(), 4, "{helper:#}");
    for (got, want) in mig.iter().zip(host.expected_migs(0)) {
        assert_eq!(got["uuid"], want["uuid"]);
        assert_eq!(got["profile"], want["profile"]);
        assert_eq!(got["memory"], want["memory_bytes"]);
        for key in ["gi", "ci", "gi_minor", "ci_minor"] {
            assert_eq!(got[key], want["access"][key], "{key}: {helper:#}");
        }
    }
    assert_eq!(helper["gpus"][7]["mig"], json!([]));
    // The capability nodes' major, from /proc/devices.
    assert_eq!(helper["caps_major"], CAPS_MAJOR, "{helper:#}");
}

/// A GPU in MIG mode whose instances cannot be read (here: the driver's capabilities tree
/// lost the minors of one GPU instance) is said so in one line, and neither `nvml` nor
/// `auto` (which must not fall back to procfs, where that GPU would look whole) gives an
/// inventory that hands it out.
#[test]
fn a_mig_gpu_whose_instances_cannot_be_read_is_refused_in_one_line() {
    let test = "a_mig_gpu_whose_instances_cannot_be_read_is_refused_in_one_line";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    let gi = host.migs(0)[1]["gi"].as_u64().unwrap();
    let driver = host.root().join("driver");
    std::fs::remove_file(driver.join(format!("nvidia/capabilities/gpu0/mig/gi{gi}/access")))
        .unwrap();
    std::fs::write(
        driver.join("nvidia-caps/mig-minors"),
        "config 1\nmonitor 2\n",
    )
    .unwrap();
    let gpu0 = host.gpus()[0]["uuid"].as_str().unwrap().to_string();
    let auto = host.root().join("auto.toml");
    let text = std::fs::read_to_string(host.config())
        .unwrap()
        .replace("inventory = \"nvml\"", "inventory = \"auto\"");
    std::fs::write(&auto, text).unwrap();
    for config in [host.config(), auto] {
        let out = host.run_with(&config, &["inventory", "--refresh"]);
        let err = text_of(&out.stderr);
        assert!(!out.status.success(), "{}", stdout(&out));
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!(
                "GPU 0 ({gpu0}) is in MIG mode but its instances cannot be read, so nothing of it is handed out"
            )) && err.contains(&format!("gpu0/mig/gi{gi}/access")),
            "{err}"
        );
    }
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `gpupin doctor` beside the mock with MIG: NVML and procfs still agree on the GPUs (a
/// GPU in MIG mode is no mismatch), and doctor reads the MIG inventory.
#[test]
fn doctor_beside_the_mock_with_mig_finds_no_mismatch() {
    let test = "doctor_beside_the_mock_with_mig_finds_no_mismatch";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    let out = host.run(&["doctor"]);
    let report = stdout(&out);
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("NVML and procfs agree on 8 GPUs")),
        "{report}{}",
        text(&out.stderr)
    );
    assert!(
        !report
            .lines()
            .any(|l| l.starts_with("problem") && l.contains("inventory")),
        "{report}"
    );
}

/// A runc container (gpupin-hook, which asks the `gpupin nvml` helper) given a MIG
/// instance on the NVML inventory of the mock with MIG: it sees its GPU's node and its two
/// capability nodes, with the minors of the driver's capabilities tree and the
/// nvidia-caps major of /proc/devices, and the instance's NVML UUID in
/// NVIDIA_VISIBLE_DEVICES; a second container gets the other 1g.10gb, never GPU 0 whole.
#[test]
fn a_container_given_an_nvml_mig_instance_sees_its_caps_and_uuid() {
    use gpupin_sandbox::harness::status::holder;
    use gpupin_sandbox::harness::{char_node, nvidia_gpu_nodes, stat_node};
    let test = "a_container_given_an_nvml_mig_instance_sees_its_caps_and_uuid";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    let Some((sb, _)) = host.sandbox(test, "live_cache = \"0s\"") else {
        return;
    };
    let status = || {
        let out = host.run_with(&sb.gpupin.config, &["status", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let ones: Vec<Value> = host
        .expected_migs(0)
        .into_iter()
        .filter(|m| m["profile"] == "1g.10gb")
        .collect();
    assert_eq!(ones.len(), 2);
    let mut given = Vec::new();
    let mut containers = Vec::new();
    for n in 0..2 {
        let id = sb.id(&format!("nvml-mig{n}"));
        let c = sb
            .start(&id, &sb.spec().annotation("gpupin.mig", "1g.10gb"))
            .unwrap();
        let held = holder(&status(), &id).expect("held while running");
        let uuids: Vec<String> = serde_json::from_value(held["gpus"].clone()).unwrap();
        assert_eq!(uuids.len(), 1, "{held:#}");
        let instance = ones
            .iter()
            .find(|m| m["uuid"] == uuids[0])
            .unwrap_or_else(|| panic!("{} is no 1g.10gb of the mock: {held:#}", uuids[0]));
        let (gi_minor, ci_minor) = (
            instance["access"]["gi_minor"].as_u64().unwrap() as u32,
            instance["access"]["ci_minor"].as_u64().unwrap() as u32,
        );
        let caps: Vec<String> = c
            .exec_stdout(&["ls", "/dev/nvidia-caps"])
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let mut want = vec![
            format!("nvidia-cap{gi_minor}"),
            format!("nvidia-cap{ci_minor}"),
        ];
        want.sort();
        assert_eq!(caps, want);
        for minor in [gi_minor, ci_minor] {
            assert_eq!(
                stat_node(&c, &format!("/dev/nvidia-caps/nvidia-cap{minor}")),
                char_node(CAPS_MAJOR as u32, minor)
            );
        }
        assert_eq!(nvidia_gpu_nodes(&c), ["nvidia0"]);
        assert_eq!(
            stat_node(&c, "/dev/nvidia0"),
            char_node(GPU_MAJOR as u32, 0)
        );
        let env = c.exec_stdout(&["env"]).unwrap();
        let config = std::fs::read_to_string(sb.bundle_dir(&id).join("config.json")).unwrap();
        let visible = format!("NVIDIA_VISIBLE_DEVICES={}", uuids[0]);
        assert!(
            env.contains(&visible) || config.contains(&visible),
            "no {visible}: {env}"
        );
        given.push(uuids[0].clone());
        containers.push(c);
    }
    assert_ne!(given[0], given[1]);
    for c in containers {
        c.stop().unwrap();
    }
}

/// A `gpupin exec` job on a MIG instance of the NVML inventory of the mock with MIG opens
/// its GPU's node and its own two capability nodes only (fake nodes, a real device
/// cgroup; the caps major from /proc/devices, the minors from the capabilities tree), and
/// is told the instance's NVML UUID in CUDA_VISIBLE_DEVICES and NVIDIA_VISIBLE_DEVICES.
#[test]
fn a_job_on_an_nvml_mig_instance_opens_only_its_gpu_and_its_own_caps() {
    let test = "a_job_on_an_nvml_mig_instance_opens_only_its_gpu_and_its_own_caps";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    let has = |fstype: &str, option: Option<&str>| {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f[2] == fstype && option.is_none_or(|o| f[3].split(',').any(|x| x == o))
            })
    };
    let (mode, what) = match has("cgroup2", None) {
        true => ("v2", "a cgroup2 hierarchy"),
        false => ("v1", "a cgroup v1 devices hierarchy"),
    };
    let mounted = (mode == "v2" || has("cgroup", Some("devices")))
        .then_some(())
        .ok_or_else(|| format!("this machine has no {what} mounted"));
    if required(test, mounted).is_none() {
        return;
    }
    let config = host.root().join("confined.toml");
    let text = std::fs::read_to_string(host.config()).unwrap();
    std::fs::write(&config, format!("{text}confine = {mode:?}\n")).unwrap();
    let dev = host.root().join("job-dev");
    std::fs::create_dir(&dev).unwrap();
    let mknod = |name: String, major: u64, minor: u64| {
        let out = Command::new("mknod")
            .args(["-m", "666"])
            .arg(dev.join(&name))
            .args(["c", &major.to_string(), &minor.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mknod: {}", text_of(&out.stderr));
    };
    for minor in 0..8 {
        mknod(format!("nvidia{minor}"), GPU_MAJOR, minor);
    }
    let instances = host.expected_migs(0);
    for m in &instances {
        for key in ["gi_minor", "ci_minor"] {
            let minor = m["access"][key].as_u64().unwrap();
            mknod(format!("nvidia-cap{minor}"), CAPS_MAJOR, minor);
        }
    }
    let d = dev.display();
    let probe = format!(
        "echo \"CUDA $CUDA_VISIBLE_DEVICES\"; echo \"NV $NVIDIA_VISIBLE_DEVICES\"; \
         for n in $(ls {d}); do echo \"NODE $n $(cat {d}/$n 2>&1)\"; done"
    );
    let out = host
        .command(
            &config,
            &["exec", "--mig", "2g.20gb", "--", "sh", "-c", &probe],
        )
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    let stdout = stdout(&out);
    assert!(out.status.success(), "{stdout}{}", text_of(&out.stderr));
    let chosen = instances
        .iter()
        .find(|m| m["profile"] == "2g.20gb")
        .unwrap();
    let mine = [
        "nvidia0".to_string(),
        format!("nvidia-cap{}", chosen["access"]["gi_minor"]),
        format!("nvidia-cap{}", chosen["access"]["ci_minor"]),
    ];
    let mut opened: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("NODE "))
        .filter(|l| l.ends_with("No such device or address"))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    opened.sort();
    let mut want: Vec<&str> = mine.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(opened, want, "{stdout}");
    let denied = stdout
        .lines()
        .filter(|l| l.starts_with("NODE ") && l.ends_with("Operation not permitted"))
        .count();
    assert_eq!(denied, 7 + 6, "{stdout}");
    let uuid = chosen["uuid"].as_str().unwrap();
    assert!(
        stdout.lines().any(|l| l == format!("CUDA {uuid}")),
        "{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == format!("NV {uuid}")),
        "{stdout}"
    );
}

/// `gpupin serve` watching the mock's GPUs' health, a scenario per class of event: an XID
/// whose action is a reboot (79) or a reset (48) fences its GPU (status, refusals, metrics
/// say why; the audit log has the fence by `gpupin serve`); one whose action is to restart
/// the application (13) fences nothing and is told in the audit log; a pending row remap
/// fences its GPU until the mock no longer reports it (as after a reset), then the GPU is
/// back by itself; a GPU fallen off the bus needs a reboot; an ignored XID (45) leaves no
/// trace; a thermal slowdown is told when it starts and ends; `gpupin undrain` puts an
/// XID-fenced GPU back.
#[test]
fn serve_fences_the_gpus_whose_health_needs_a_reset_or_a_reboot() {
    let test = "serve_fences_the_gpus_whose_health_needs_a_reset_or_a_reboot";
    let Some(host) = MockHost::new(test, "dgxa100", "nvml") else {
        return;
    };
    let serve = host.serve("");
    let fence_of = |gpu: usize| host.fence_of(gpu);
    let until = |what: &str, done: &dyn Fn() -> bool| serve.until(what, done);

    // Each rewrite of the file keeps the events fired: the mock delivers each once.
    let fired = json!([
        {"index": 0, "type": "xid", "xid": 45},
        {"index": 2, "type": "xid", "xid": 79},
        {"index": 1, "type": "xid", "xid": 13},
        {"index": 3, "type": "xid", "xid": 48},
    ]);
    host.set_health(&json!({"events": fired, "gpus": []}));
    until("GPU 3 fenced", &|| !fence_of(3).is_null());
    let reboot = fence_of(2);
    assert_eq!(reboot["state"], "needs-reboot", "{reboot}");
    assert_eq!(reboot["reason"], "XID 79");
    assert_eq!(reboot["by"], "gpupin serve");
    assert_eq!(fence_of(3)["state"], "needs-reset");
    assert!(
        fence_of(1).is_null(),
        "XID 13 restarts the app, fences nothing"
    );
    assert!(fence_of(0).is_null(), "XID 45 is ignored");
    let status = host.ok(&["status"]);
    assert!(status.contains("NEEDS RESET: XID 48"), "{status}");
    assert!(status.contains("NEEDS REBOOT: XID 79"), "{status}");
    let refused = host.run(&["exec", "--devices", "3", "--", "true"]);
    let line = String::from_utf8_lossy(&refused.stderr);
    assert!(
        line.contains(
            "it needs a reset (XID 48); it comes back after the reset, or with gpupin undrain 3"
        ),
        "{line}"
    );
    let metrics = host.ok(&["metrics"]);
    let uuid = |i: usize| host.gpus()[i]["uuid"].as_str().unwrap().to_string();
    assert!(
        metrics.contains(&format!(
            "gpupin_gpu_fenced{{gpu=\"2\",uuid=\"{}\",state=\"needs-reboot\"}} 1",
            uuid(2)
        )),
        "{metrics}"
    );
    let audit = std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    let events: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let told = events
        .iter()
        .find(|e| e["event"] == "health")
        .unwrap_or_else(|| panic!("no health line: {audit}"));
    assert!(
        !events.iter().any(|e| e["holder"] == "gpu-0"),
        "nothing of the ignored XID 45 in the trail: {audit}"
    );
    assert_eq!(told["holder"], "gpu-1");
    assert_eq!(told["code"], "restart-app");
    assert_eq!(told["reason"], "XID 13");
    assert!(
        events.iter().any(|e| e["event"] == "drain"
            && e["holder"] == "gpu-2"
            && e["user"] == "gpupin serve"
            && e["code"] == "needs-reboot"),
        "{audit}"
    );

    // A pending row remap: out until the mock no longer reports it.
    host.set_health(&json!({"events": fired, "gpus": [{"index": 4, "remap_pending": true}]}));
    until("GPU 4 fenced", &|| !fence_of(4).is_null());
    assert_eq!(fence_of(4)["reason"], "row remap pending");
    assert_eq!(fence_of(4)["state"], "needs-reset");
    host.set_health(&json!({"events": fired, "gpus": []}));
    until("GPU 4 back", &|| fence_of(4).is_null());

    // A thermal slowdown is told, not fenced, once when it starts and once when it ends.
    let audit_events = || -> Vec<Value> {
        std::fs::read_to_string(host.root().join("state/audit.log"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let health_of = |gpu: &str| -> Vec<(String, String)> {
        audit_events()
            .iter()
            .filter(|e| e["event"] == "health" && e["holder"] == gpu)
            .map(|e| {
                (
                    e["code"].as_str().unwrap().to_string(),
                    e["reason"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    host.set_health(&json!({"events": fired, "gpus": [{"index": 7, "throttle": 64}]}));
    until("GPU 7's slowdown told", &|| !health_of("gpu-7").is_empty());
    host.set_health(&json!({"events": fired, "gpus": []}));
    until("GPU 7's slowdown ended", &|| health_of("gpu-7").len() == 2);
    let thermal = "thermal slowdown (hardware)".to_string();
    assert_eq!(
        health_of("gpu-7"),
        [
            ("slowdown".to_string(), thermal.clone()),
            ("slowdown-ended".to_string(), thermal)
        ]
    );
    assert!(fence_of(7).is_null(), "a slowdown fences nothing");

    // A GPU fallen off the bus (NVML answers GPU_IS_LOST) needs a reboot.
    host.set_health(&json!({"events": fired, "gpus": [{"index": 6, "lost": true}]}));
    until("GPU 6 fenced", &|| !fence_of(6).is_null());
    assert_eq!(fence_of(6)["state"], "needs-reboot");
    assert_eq!(fence_of(6)["reason"], "fallen off the bus");

    // An admin's undrain puts an XID-fenced GPU back.
    let said = host.ok(&["undrain", "3"]);
    assert_eq!(
        said,
        "undrained GPU 3 (was needs-reset by gpupin serve: XID 48): it is handed out again\n"
    );
    assert!(fence_of(3).is_null());
}

/// The driver says what a GPU needs (its GPU recovery action): a GPU it asks to reset or
/// reboot is fenced; an XID's fence it agrees with follows it; and once the driver reads
/// none again, after the reset, the GPU is handed out again. An XID's fence on a driver
/// without the field stays until an admin's undrain.
#[test]
fn a_gpu_the_driver_asks_to_reset_comes_back_after_the_reset() {
    let test = "a_gpu_the_driver_asks_to_reset_comes_back_after_the_reset";
    let Some(host) = MockHost::new(test, "dgxa100", "nvml") else {
        return;
    };
    let serve = host.serve("");
    let fence_of = |gpu: usize| host.fence_of(gpu);
    let fired = json!([
        {"index": 2, "type": "xid", "xid": 48},
        {"index": 5, "type": "xid", "xid": 48},
    ]);
    // GPU 2's driver lacks the field; GPU 5's asks for a reset; GPU 6's for a reboot
    // with no XID told.
    let asking = json!([
        {"index": 2, "recovery_action": -1},
        {"index": 5, "recovery_action": 1},
        {"index": 6, "recovery_action": 2},
    ]);
    host.set_health(&json!({"events": fired, "gpus": asking}));
    serve.until("GPU 5's fence follows the driver", &|| {
        fence_of(5)["reason"] == "XID 48; the driver asks for a GPU reset"
    });
    serve.until("GPU 6 fenced", &|| !fence_of(6).is_null());
    assert_eq!(fence_of(6)["state"], "needs-reboot");
    assert_eq!(fence_of(6)["reason"], "the driver asks for a node reboot");
    let status = host.ok(&["status", "--long"]);
    assert!(
        status.contains("NEEDS RESET: XID 48; the driver asks for a GPU reset"),
        "{status}"
    );

    // The reset: the driver reads none again on GPUs 5 and 6 (and on GPU 2 it still
    // cannot say).
    let reset = json!([{"index": 2, "recovery_action": -1}]);
    host.set_health(&json!({"events": fired, "gpus": reset}));
    serve.until("GPUs 5 and 6 back", &|| {
        fence_of(5).is_null() && fence_of(6).is_null()
    });
    // The poll that put GPU 5 back looked at GPU 2 first.
    assert_eq!(fence_of(2)["reason"], "XID 48", "{}", serve.log());
    let out = host.run(&["exec", "--devices", "5", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let audit = std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    let back: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "undrain" && e["user"] == "gpupin serve")
        .collect();
    let holders: Vec<&str> = back.iter().map(|e| e["holder"].as_str().unwrap()).collect();
    assert_eq!(holders, ["gpu-5", "gpu-6"], "{audit}");
}

/// An XID the driver attributes to a MIG GPU instance takes that instance out alone: status
/// shows it on the instance's line, a request naming it is told why, its GPU's other
/// instances are handed out, the device plugin's metric has its series, and undrain by its
/// address brings it back.
#[test]
fn an_xid_on_a_mig_instance_fences_that_instance_alone() {
    let test = "an_xid_on_a_mig_instance_fences_that_instance_alone";
    let Some(host) = MockHost::with_mig(test, "dgxa100-80gb", "nvml", Some(MIG_GEOMETRY)) else {
        return;
    };
    let serve = host.serve("");
    let migs = host.migs(0);
    let (sick, sibling) = (&migs[2], &migs[3]);
    assert_eq!(
        (&sick["profile"], &sibling["profile"]),
        (&json!("1g.10gb"), &json!("1g.10gb"))
    );
    let address = format!("0:{}", sick["index"]);
    host.set_health(&json!({
        "events": [{"index": 0, "type": "xid", "xid": 48, "gi": sick["gi"], "ci": sick["ci"]}],
        "gpus": [],
    }));
    let status = || host.json(&["status", "--json"]);
    serve.until("the instance fenced", &|| {
        !status()["gpus"][0]["mig"][2]["fence"].is_null()
    });
    let st = status();
    let fence = &st["gpus"][0]["mig"][2]["fence"];
    assert_eq!(fence["state"], "needs-reset", "{fence}");
    assert_eq!(fence["reason"], "XID 48");
    assert_eq!(fence["uuid"], sick["uuid"]);
    assert!(
        st["gpus"][0]["fence"].is_null(),
        "the GPU is not fenced: {st:#}"
    );
    assert!(st["gpus"][0]["mig"][3]["fence"].is_null());
    let long = host.ok(&["status", "--long"]);
    assert!(
        long.lines()
            .any(|l| l.trim_start().starts_with(&address) && l.contains("NEEDS RESET: XID 48")),
        "{long}"
    );
    let table = host.ok(&["status"]);
    let line = |i: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!(" {i} ")))
            .unwrap()
    };
    assert!(line(&address).contains("NEEDS RESET: XID 48"), "{table}");
    assert!(!line("0:3").contains("NEEDS"), "{table}");
    assert!(table.contains("3 of 4 MIG instances free"), "{table}");

    let refused = host.run(&["hold", "named", "--devices", &address, "--until-release"]);
    let line = String::from_utf8_lossy(&refused.stderr);
    assert!(
        line.contains(&format!(
            "it needs a reset (XID 48); it comes back after the reset, or with gpupin undrain {address}"
        )),
        "{line}"
    );
    host.ok(&["hold", "one", "--mig", "1g.10gb", "--until-release"]);
    let st = status();
    assert_eq!(st["gpus"][0]["mig"][3]["holders"][0]["id"], "one", "{st:#}");
    let metrics = host.ok(&["metrics"]);
    assert!(
        metrics.contains(&format!(
            "gpupin_gpu_fenced{{gpu=\"{address}\",uuid=\"{}\",state=\"needs-reset\"}} 1",
            sick["uuid"].as_str().unwrap()
        )),
        "{metrics}"
    );
    let audit = std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    assert!(
        audit
            .lines()
            .any(|l| l.contains(&format!("\"holder\":\"gpu-{address}\""))
                && l.contains("\"event\":\"drain\"")),
        "{audit}"
    );

    let said = host.ok(&["undrain", &address]);
    assert_eq!(
        said,
        format!(
            "undrained MIG instance {address} (was needs-reset by gpupin serve: XID 48): it is handed out again\n"
        )
    );
    host.ok(&["hold", "two", "--devices", &address, "--until-release"]);
}

/// A stand-in for `nvidia-smi --gpu-reset` (no driver here): it logs its arguments to
/// `log` and, as the driver does, refuses while any live process has NVML open (the
/// mock's marks), in nvidia-smi's words.
fn reset_stand_in(dir: &Path, marks: &Path, log: &Path) -> PathBuf {
    let smi = dir.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!(
            "#!/bin/sh\necho \"$*\" >> {log:?}\nfor mark in {marks:?}/*; do\n  [ -e \"$mark\" ] || continue\n  if kill -0 \"$(basename \"$mark\")\" 2>/dev/null; then\n    echo 'The following GPUs could not be reset:'\n    echo '  GPU 00000000:07:00.0: In use by another client'\n    exit 255\n  fi\ndone\necho 'GPU 00000000:07:00.0 was successfully reset.'\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&smi, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    smi
}

/// `gpupin reset` resets a GPU its health took out (XID 48) with nvidia-smi, once `gpupin
/// serve`'s health watch has let go of NVML (the stand-in refuses while any process has
/// it open, as the driver does), and the GPU is handed out again; the watch then takes
/// NVML again and sees the next XID. A held GPU is refused, an admin's drain stays, and
/// a reset that fails leaves the fence as it was.
#[test]
fn reset_lets_go_of_nvml_resets_the_gpu_and_hands_it_out_again() {
    let test = "reset_lets_go_of_nvml_resets_the_gpu_and_hands_it_out_again";
    let Some(host) = MockHost::new(test, "dgxa100", "nvml") else {
        return;
    };
    std::fs::create_dir(host.nvml_open()).unwrap();
    let log = host.root().join("smi.log");
    let smi = reset_stand_in(host.root(), &host.nvml_open(), &log);
    let smi = smi.to_str().unwrap();
    let serve = host.serve("");
    let fence_of = |gpu: usize| host.fence_of(gpu);
    let uuid = |i: usize| host.gpus()[i]["uuid"].as_str().unwrap().to_string();
    host.set_health(&json!({"events": [{"index": 3, "type": "xid", "xid": 48}], "gpus": []}));
    serve.until("GPU 3 fenced", &|| !fence_of(3).is_null());
    // Delivered: a new event set (after the reset) must not see it again.
    host.set_health(&json!({"events": [], "gpus": []}));
    let marks: Vec<String> = std::fs::read_dir(host.nvml_open())
        .unwrap()
        .map(|m| m.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        marks,
        [serve.child.id().to_string()],
        "the watch has NVML open"
    );

    // Someone holds GPU 4: refused, nothing run, no fence left behind.
    host.ok(&["hold", "busy", "--devices", "4", "--until-release"]);
    let out = host.run(&["reset", "4", "--nvidia-smi", smi]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "gpupin: cannot reset GPU 4: busy still holds it, and a reset ends their work; wait for them (gpupin drain 4 --wait) or gpupin evict them first\n"
    );
    assert!(!log.exists(), "nvidia-smi was not run");
    assert!(fence_of(4).is_null());
    let trail = || std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    assert!(!trail().contains("\"holder\":\"gpu-4\""), "{}", trail());

    let said = host.ok(&["reset", "3", "--nvidia-smi", smi]);
    assert_eq!(
        said,
        format!(
            "reset GPU 3 ({}) (was needs-reset: XID 48): it is handed out again\n",
            uuid(3)
        ),
        "{}",
        serve.log()
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        format!("--gpu-reset -i {}\n", uuid(3))
    );
    assert!(fence_of(3).is_null());
    host.ok(&["hold", "after", "--devices", "3", "--until-release"]);
    let audit = std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    assert!(
        audit.lines().any(|l| {
            let e: Value = serde_json::from_str(l).unwrap();
            e["event"] == "undrain"
                && e["holder"] == "gpu-3"
                && e["user"] == "root"
                && e["reason"] == "reset; was needs-reset: XID 48"
        }),
        "{audit}"
    );
    // The watch took NVML again: the next XID is seen.
    host.set_health(&json!({"events": [{"index": 5, "type": "xid", "xid": 48}], "gpus": []}));
    serve.until("GPU 5 fenced after the reset", &|| !fence_of(5).is_null());

    // A reset that fails says why in one line and leaves the fence.
    let failing = host.root().join("failing-smi");
    std::fs::write(
        &failing,
        "#!/bin/sh\necho 'The following GPUs could not be reset:'\necho '  GPU 00000000:0F:00.0: Reset not supported.'\necho\necho 'More text.'\nexit 3\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &failing,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = host.run(&["reset", "5", "--nvidia-smi", failing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "gpupin: could not reset GPU 5 ({}): The following GPUs could not be reset: GPU 00000000:0F:00.0: Reset not supported. (exit status: 3)\n",
            uuid(5)
        )
    );
    assert_eq!(fence_of(5)["reason"], "XID 48");
    assert!(
        trail()
            .lines()
            .any(|l| l.contains("\"holder\":\"gpu-5\"") && l.contains("\"code\":\"reset-failed\"")),
        "{}",
        trail()
    );

    // An admin's drain stays after the reset.
    host.ok(&["drain", "6", "--reason", "fan swap"]);
    let said = host.ok(&["reset", "6", "--nvidia-smi", smi]);
    assert_eq!(
        said,
        format!(
            "reset GPU 6 ({}); it stays drained by root: fan swap (gpupin undrain 6 hands it out)\n",
            uuid(6)
        )
    );
    assert_eq!(fence_of(6)["state"], "drained");
}

/// A shared job's memory reservation becomes a limit the driver enforces on the job's own
/// cgroup (`nvmlDeviceSetMemoryLimits_v1`: the mock logs what was set), cleared before the
/// cgroup goes; where the driver lacks the feature, the job runs and its record says the
/// reservation is accounting only.
#[test]
fn a_shared_jobs_reservation_is_a_limit_the_driver_enforces_on_its_cgroup() {
    let test = "a_shared_jobs_reservation_is_a_limit_the_driver_enforces_on_its_cgroup";
    let Some(host) = MockHost::new(test, "dgxa100", "nvml") else {
        return;
    };
    let limits = host.root().join("mock-limits.log");
    let report = host.root().join("job-status.json");
    // The job reports its own record, as gpupin status shows it, then ends.
    let job = format!(
        "{} --config {} status --json > {}",
        binary(GPUPIN).display(),
        host.config().display(),
        report.display()
    );
    let ask = [
        "exec",
        "--share",
        "shared",
        "--reserve",
        "20GiB",
        "--devices",
        "0",
        "--",
        "sh",
        "-c",
        job.as_str(),
    ];
    let out = host
        .command(&host.config(), &ask)
        .env("GPUPIN_MOCK_NVML_LIMITS", &limits)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let holder = &seen["holders"][0];
    assert_eq!(holder["memory_limit"], "enforced", "{holder:#}");
    let logged: Vec<Value> = std::fs::read_to_string(&limits)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let reserve = 20u64 << 30;
    assert_eq!(logged.len(), 2, "{logged:?}");
    assert_eq!(logged[0]["index"], 0);
    assert_eq!(logged[0]["soft"], reserve);
    assert_eq!(logged[0]["hard"], reserve);
    let cgroup = logged[0]["cgroup"].as_str().unwrap();
    let holder_id = holder["id"].as_str().unwrap();
    assert!(cgroup.ends_with(&format!("gpupin-{holder_id}")), "{cgroup}");
    assert_eq!(logged[1]["cgroup"], cgroup, "cleared on the same cgroup");
    assert_eq!(logged[1]["soft"], 0);
    assert_eq!(logged[1]["hard"], u64::MAX);

    // A driver without the feature: the job runs; its reservation is accounting only.
    let out = host.command(&host.config(), &ask).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(seen["holders"][0]["memory_limit"], "accounting-only");
}

/// A shared container's reservation on the mock host: gpupin-hook (which never loads
/// NVML) has the `gpupin` beside it set the driver's limit on the container's cgroup; the
/// ledger says it is enforced. Without the feature in the driver the container runs and
/// the reservation is accounting only.
#[test]
fn a_shared_containers_reservation_is_a_limit_on_its_cgroup() {
    use gpupin_sandbox::harness::status::holder;
    let test = "a_shared_containers_reservation_is_a_limit_on_its_cgroup";
    let Some(host) = MockHost::new(test, "dgxh100", "nvml") else {
        return;
    };
    let Some((sb, _)) = host.sandbox(test, "") else {
        return;
    };
    // The helper runs with an empty environment, the library on a read-only overlay: a
    // file beside it names the log.
    let limits = host.root().join("mock-limits.log");
    let named = host.root().join("lib/mock-nvml-limits.path");
    std::fs::create_dir_all(host.root().join("lib")).unwrap();
    std::fs::write(&named, limits.display().to_string()).unwrap();
    let status = || {
        let out = host.run_with(&sb.gpupin.config, &["status", "--json"]);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let spec = sb
        .spec()
        .annotation("gpupin.count", "1")
        .annotation("gpupin.share", "shared")
        .annotation("gpupin.reserve", "20GiB");
    let id = sb.id("shared-limit");
    let c = sb.start(&id, &spec).unwrap();
    let record = holder(&status(), &id).expect("held while running");
    assert_eq!(record["memory_limit"], "enforced", "{record:#}");
    let logged: Vec<Value> = std::fs::read_to_string(&limits)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["hard"], 20u64 << 30);
    let cgroup = logged[0]["cgroup"].as_str().unwrap();
    assert!(cgroup.contains(&id), "the container's own cgroup: {cgroup}");
    c.stop().unwrap();

    // A driver without per-cgroup limits: the container runs, accounting only.
    std::fs::remove_file(&named).unwrap();
    let id = sb.id("shared-accounting");
    let c = sb.start(&id, &spec).unwrap();
    let record = holder(&status(), &id).expect("held while running");
    assert_eq!(record["memory_limit"], "accounting-only", "{record:#}");
    c.stop().unwrap();
}

/// `[health] evict = true`: the holder of a GPU the health fences is evicted (its
/// process gets SIGTERM, its GPUs are released), and the trail says by whom and why.
#[test]
fn serve_evicts_the_holders_of_a_fenced_gpu_when_told_to() {
    let test = "serve_evicts_the_holders_of_a_fenced_gpu_when_told_to";
    let Some(host) = MockHost::new(test, "dgxa100", "nvml") else {
        return;
    };
    let serve = host.serve("evict = true\n");
    let serve_log = || serve.log();
    let mut job = Command::new("sleep").arg("600").spawn().unwrap();
    let pid = job.id().to_string();
    host.ok(&["hold", "busy", "--devices", "5", "--pid", &pid]);

    host.set_health(&json!({"events": [{"index": 5, "type": "xid", "xid": 48}], "gpus": []}));
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = job.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "the holder's process still runs\n{}",
            serve_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(15), "SIGTERM");
    let started = std::time::Instant::now();
    while host.json(&["status", "--json"])["holders"]
        .as_array()
        .is_some_and(|h| !h.is_empty())
    {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(60),
            "{}",
            serve_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let audit = std::fs::read_to_string(host.root().join("state/audit.log")).unwrap();
    let evicted: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"] == "evict")
        .unwrap_or_else(|| panic!("no evict line: {audit}"));
    assert_eq!(evicted["holder"], "busy");
    let reason = evicted["reason"].as_str().unwrap();
    assert!(
        reason.contains("gpupin serve") && reason.contains("GPU 5 needs a reset (XID 48)"),
        "{reason}"
    );
}

/// `gpupin serve` on the mock host (`MockHost::serve`), killed when dropped.
struct Serve {
    child: std::process::Child,
    log: PathBuf,
}

impl Serve {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `done`, failing with serve's log after a minute (not a timed
    /// assertion: a bound, so that what never happens fails instead of hanging).
    fn until(&self, what: &str, done: &dyn Fn() -> bool) {
        let started = std::time::Instant::now();
        while !done() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(60),
                "{what}: not seen\n{}",
                self.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
