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
