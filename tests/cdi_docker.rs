//! The driver through CDI under a real dockerd: gpupin-runtime (a `gpupin-sN` slot of
//! the docker harness) applies the chosen GPU's entry of the CDI spec NVIDIA's
//! `nvidia-ctk cdi generate` writes for a fake driver root and NVIDIA's mock NVML
//! (gpupin-sandbox harness::toolkit; the peers of tests/peers/build), and the real
//! nvidia-cdi-hook it names runs. Root, dockerd, runc, busybox-static and the peers are
//! needed; elsewhere the test says why it skips (under CI=true it fails instead).

#[allow(unused_imports)] // re-exports this binary does not use
mod docker_support;

use docker_support::{Need, Slot, harness, text};
use gpupin_sandbox::harness::required;
use gpupin_sandbox::harness::toolkit::{MockDriver, Peers, another_machines_spec, use_inventory};
use std::io::Write;

/// A fake driver root for the mock's `dgxa100` and the spec nvidia-ctk generates for it
/// in the slot's dir; the slot's gpupin hands out the mock's GPUs, with `driver = "cdi"`.
fn with_toolkit_driver(slot: &Slot, peers: &Peers) -> MockDriver {
    slot.reset_config(None);
    let _ = std::fs::remove_dir_all(slot.dir.join("driver"));
    let driver = MockDriver::create(&slot.dir.join("driver"), peers, "dgxa100").unwrap();
    let inventory = slot.dir.join("driver/machine.json");
    driver.write_inventory(&inventory).unwrap();
    use_inventory(&slot.config, &inventory);
    let cdi = slot.dir.join("cdi");
    let _ = std::fs::remove_dir_all(&cdi);
    std::fs::create_dir_all(&cdi).unwrap();
    driver.generate(&cdi.join("nvidia.yaml"), &[]).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(&slot.config)
        .unwrap();
    writeln!(config, "driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]").unwrap();
    driver
}

#[test]
fn docker_run_with_gpupin_gets_its_gpus_driver_files_read_only_and_nothing_else() {
    let Some(h) = harness(
        "docker_run_with_gpupin_gets_its_gpus_driver_files_read_only_and_nothing_else",
        Need::Docker,
    ) else {
        return;
    };
    let Some(peers) = required(
        "docker_run_with_gpupin_gets_its_gpus_driver_files_read_only_and_nothing_else",
        Peers::find(),
    ) else {
        return;
    };
    let slot = h.slot();
    let driver = with_toolkit_driver(&slot, &peers);
    docker_support::second_container_sees_its_gpus_driver(h, &slot, &driver);
}

/// The spec nvidia-ctk wrote on another server, copied here: its entries name this
/// machine's device nodes for other GPUs, so gpupin refuses the start, names the spec and
/// says to regenerate it, and holds nothing.
#[test]
fn docker_run_with_another_machines_spec_is_refused_and_holds_nothing() {
    let test = "docker_run_with_another_machines_spec_is_refused_and_holds_nothing";
    let Some(h) = harness(test, Need::Docker) else {
        return;
    };
    let Some(peers) = required(test, Peers::find()) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let cdi = slot.dir.join("cdi");
    let _ = std::fs::remove_dir_all(&cdi);
    let _ = std::fs::remove_dir_all(slot.dir.join("other-machine"));
    let spec = another_machines_spec(&slot.dir.join("other-machine"), &peers, &cdi).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(&slot.config)
        .unwrap();
    writeln!(config, "driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]").unwrap();
    let out = h.run_detached(&slot.runtime, &["-l", "gpupin.count=1"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("CDI spec {}: entry GPU-", spec.display()))
            && err.contains("regenerate the spec (nvidia-ctk cdi generate)"),
        "{err}"
    );
    assert!(slot.holders().is_empty(), "{:?}", slot.holders());
}
