//! gpupin-runtime chained with NVIDIA's real `nvidia-container-runtime` (the toolkit built
//! by tests/peers/build) under a real dockerd, in its `cdi` mode, as on a box where
//! `nvidia-ctk runtime configure` made NVIDIA's runtime the one gpupin hands containers
//! over to: gpupin chooses, writes the chosen UUIDs in NVIDIA_VISIBLE_DEVICES, and
//! NVIDIA's runtime gives that GPU's entry of the spec `nvidia-ctk cdi generate` wrote.
//! The container must get exactly gpupin's GPU, never 0..N-1, and the driver's files,
//! with the real nvidia-cdi-hook run.
//!
//! In `cdi` mode NVIDIA's runtime reads the spec `nvidia-ctk cdi generate` wrote; in
//! `jit-cdi` (the default since 1.18) no spec exists and it builds the GPU's entry itself,
//! through NVML, when the container starts. jit-cdi asks nvmlDeviceIsMigDeviceHandle of
//! each GPU (the mock bridge answers it: tests/peers/mocknvml).
//!
//! NVIDIA's runtime reads its config from `$XDG_CONFIG_HOME/nvidia-container-runtime/
//! config.toml` and finds the mock NVML through LD_LIBRARY_PATH: the dockerd of the
//! harness is shared, so a two-line wrapper sets both and execs NVIDIA's binary. Root,
//! dockerd, runc, busybox-static and the peers are needed; elsewhere the test says why it
//! skips (under CI=true it fails instead).

#[allow(unused_imports)] // re-exports this binary does not use
mod docker_support;

use docker_support::{Need, harness, write_script};
use gpupin_sandbox::harness::required;
use gpupin_sandbox::harness::toolkit::{MockDriver, Peers, use_inventory};
use std::io::Write;

/// The chain with NVIDIA's runtime in `mode`.
fn chained(test: &str, mode: &str) {
    let Some(h) = harness(test, Need::Docker) else {
        return;
    };
    let Some(peers) = required(test, Peers::find()) else {
        return;
    };
    let slot = h.slot();
    let dir = slot.dir.join("toolkit");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let profile = "dgxa100";
    let driver = MockDriver::create(&dir, &peers, profile).unwrap();
    let cdi = dir.join("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    if mode == "cdi" {
        driver.generate(&cdi.join("nvidia.yaml"), &[]).unwrap();
    }
    let runc = gpupin_sandbox::find_on_path("runc").unwrap();
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(xdg.join("nvidia-container-runtime")).unwrap();
    std::fs::write(
        xdg.join("nvidia-container-runtime/config.toml"),
        format!(
            "[nvidia-container-cli]\nroot = {root:?}\n\n\
             [nvidia-container-runtime]\nmode = {mode:?}\nruntimes = [{runc:?}]\nlog-level = \"debug\"\ndebug = {log:?}\n\n\
             [nvidia-container-runtime.modes.cdi]\ndefault-kind = \"nvidia.com/gpu\"\nspec-dirs = [{cdi:?}]\n\n\
             [nvidia-ctk]\npath = {ctk:?}\n",
            root = driver.root.display().to_string(),
            runc = runc.display().to_string(),
            log = dir.join("nvidia-container-runtime.log").display().to_string(),
            cdi = cdi.display().to_string(),
            ctk = peers.tool("nvidia-ctk").display().to_string(),
        ),
    )
    .unwrap();
    let wrapper = dir.join("nvidia-container-runtime");
    write_script(
        &wrapper,
        &format!(
            "export XDG_CONFIG_HOME='{}' LD_LIBRARY_PATH='{}' GPUPIN_MOCK_NVML_PROFILE={profile} PATH='{}':\"$PATH\"\nexec '{}' \"$@\"\n",
            xdg.display(),
            peers.mock.display(),
            peers.toolkit.display(),
            peers.tool("nvidia-container-runtime").display()
        ),
    );
    slot.reset_config(Some(&wrapper));
    let inventory = dir.join("machine.json");
    driver.write_inventory(&inventory).unwrap();
    use_inventory(&slot.config, &inventory);
    // gpupin gives no driver itself (no spec in its dirs): NVIDIA's runtime does.
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(&slot.config)
        .unwrap();
    writeln!(config, "cdi_spec_dirs = []").unwrap();

    docker_support::second_container_sees_its_gpus_driver(h, &slot, &driver);
}

#[test]
fn nvidia_container_runtime_in_cdi_mode_gives_exactly_gpupins_gpu() {
    chained(
        "nvidia_container_runtime_in_cdi_mode_gives_exactly_gpupins_gpu",
        "cdi",
    );
}

#[test]
fn nvidia_container_runtime_in_jit_cdi_mode_gives_exactly_gpupins_gpu() {
    chained(
        "nvidia_container_runtime_in_jit_cdi_mode_gives_exactly_gpupins_gpu",
        "jit-cdi",
    );
}

/// NVIDIA's legacy mode: the real `nvidia-container-runtime` adds the real
/// `nvidia-container-runtime-hook` as a prestart hook, and that hook hands the GPUs of
/// NVIDIA_VISIBLE_DEVICES to `nvidia-container-cli` (libnvidia-container, C, in no
/// registry here: the one stand-in left, a script that logs its arguments). The
/// container's spec (saved on its way to runc) must carry gpupin's UUIDs once and only
/// the chosen GPUs' nodes, and the CLI must be asked for exactly those GPUs.
#[test]
fn nvidia_container_runtime_in_legacy_mode_hands_gpupins_gpus_to_the_cli() {
    let test = "nvidia_container_runtime_in_legacy_mode_hands_gpupins_gpus_to_the_cli";
    let Some(h) = harness(test, Need::Docker) else {
        return;
    };
    let Some(peers) = required(test, Peers::find()) else {
        return;
    };
    let slot = h.slot();
    let dir = slot.dir.join("toolkit-legacy");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cli_log = dir.join("nvidia-container-cli.log");
    let cli = dir.join("nvidia-container-cli");
    write_script(&cli, &format!("echo \"$*\" >> '{}'\n", cli_log.display()));
    let seen = dir.join("seen");
    let capture = dir.join("runc-capture");
    let runc = gpupin_sandbox::find_on_path("runc").unwrap();
    docker_support::write_capture_script(&capture, &seen, "runc", runc.to_str().unwrap());
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(xdg.join("nvidia-container-runtime")).unwrap();
    // runc runs hooks with the hook's own environment only: a wrapper gives NVIDIA's hook
    // the config the runtime reads.
    let hook = dir.join("nvidia-container-runtime-hook");
    write_script(
        &hook,
        &format!(
            "export XDG_CONFIG_HOME='{}'\nexec '{}' \"$@\"\n",
            xdg.display(),
            peers.tool("nvidia-container-runtime-hook").display()
        ),
    );
    std::fs::write(
        xdg.join("nvidia-container-runtime/config.toml"),
        format!(
            "[nvidia-container-cli]\npath = {cli:?}\nenvironment = []\nldconfig = \"@/sbin/ldconfig\"\n\n\
             [nvidia-container-runtime]\nmode = \"legacy\"\nruntimes = [{capture:?}]\nlog-level = \"debug\"\ndebug = {log:?}\n\n\
             [nvidia-container-runtime-hook]\npath = {hook:?}\n",
            cli = cli.display().to_string(),
            capture = capture.display().to_string(),
            log = dir.join("nvidia-container-runtime.log").display().to_string(),
            hook = hook.display().to_string(),
        ),
    )
    .unwrap();
    let wrapper = dir.join("nvidia-container-runtime");
    write_script(
        &wrapper,
        &format!(
            "export XDG_CONFIG_HOME='{}'\nexec '{}' \"$@\"\n",
            xdg.display(),
            peers.tool("nvidia-container-runtime").display()
        ),
    );
    slot.reset_config(Some(&wrapper));

    let c = h.start(
        &slot.runtime,
        &["-l", "gpupin.count=2", "-e", "NVIDIA_VISIBLE_DEVICES=all"],
    );
    let gpus = slot.holders()[&c.id].clone();
    assert_eq!(gpus.len(), 2);
    let text = std::fs::read_to_string(seen.join(format!("{}.runc.json", c.id))).unwrap();
    let spec: serde_json::Value = serde_json::from_str(&text).unwrap();
    let env: Vec<&str> = spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e.as_str())
        .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert_eq!(env, [format!("NVIDIA_VISIBLE_DEVICES={}", gpus.join(","))]);
    let minors = slot.minors();
    let mut want: Vec<String> = gpus
        .iter()
        .map(|g| format!("/dev/nvidia{}", minors[g]))
        .collect();
    let mut got: Vec<String> = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["path"].as_str())
        .filter(|p| {
            p.strip_prefix("/dev/")
                .is_some_and(gpupin_sandbox::harness::is_gpu_node)
        })
        .map(str::to_string)
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    let hooks: Vec<&str> = spec["hooks"]["prestart"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["path"].as_str())
        .filter(|p| p.ends_with("nvidia-container-runtime-hook"))
        .collect();
    assert_eq!(
        hooks,
        [hook.to_str().unwrap()],
        "NVIDIA's runtime added its hook"
    );
    // NVIDIA's hook ran and asked the CLI for gpupin's GPUs, once.
    let calls = std::fs::read_to_string(&cli_log).unwrap_or_default();
    let configures: Vec<&str> = calls
        .lines()
        .filter(|l| l.contains(" configure "))
        .collect();
    assert_eq!(configures.len(), 1, "{calls}");
    assert!(
        configures[0].contains(&format!("--device={}", gpus.join(","))),
        "{calls}"
    );
}
