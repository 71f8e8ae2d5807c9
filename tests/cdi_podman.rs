//! The driver through CDI under real podman: `gpupin install podman`'s hooks, a fake
//! driver root with the CDI spec NVIDIA's `nvidia-ctk cdi generate` writes for it against
//! NVIDIA's mock NVML (gpupin-sandbox harness::toolkit, the peers of tests/peers/build;
//! here the PCIe profile a30pcie), and gpupin's precreate hook applying the chosen GPU's
//! entry, whose real nvidia-cdi-hook runs. Root, podman, runc, busybox-static and the
//! peers are needed; elsewhere the test says why it skips (under CI=true it fails
//! instead). tests/toolkit_cdi.rs has the DGX profiles and the UUID-named spec.

#[allow(unused_imports)] // re-exports this binary does not use
mod podman_support;

use gpupin_sandbox::harness::toolkit::{
    MockDriver, Peers, another_machines_spec, assert_toolkit_driver_inside,
};
use gpupin_sandbox::harness::{need_root, required};
use podman_support::{Options, assert_success, combined, setup};
use std::io::Write;
use std::path::PathBuf;

#[test]
fn a_pinned_container_gets_its_gpus_driver_files_read_only_and_nothing_else() {
    let test = "a_pinned_container_gets_its_gpus_driver_files_read_only_and_nothing_else";
    // Root first: the fake driver root's nodes need mknod, before the harness's own check.
    if !need_root(test) {
        return;
    }
    let Some(peers) = required(test, Peers::find()) else {
        return;
    };
    // gpupin hands out the mock's GPUs: its inventory file comes before the harness.
    let dir = tempfile::Builder::new()
        .prefix("gpupin-cdi-podman-")
        .tempdir()
        .unwrap();
    let driver = MockDriver::create(dir.path(), &peers, "a30pcie").unwrap();
    let inventory = dir.path().join("machine.json");
    driver.write_inventory(&inventory).unwrap();
    let machine: &'static str = Box::leak(inventory.display().to_string().into_boxed_str());
    let Some(podman) = setup(
        test,
        Options {
            machine: Some(machine),
            ..Options::default()
        },
    ) else {
        return;
    };
    let cdi: PathBuf = podman.path("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    driver.generate(&cdi.join("nvidia.yaml"), &[]).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(podman.config_path())
        .unwrap();
    writeln!(config, "driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]").unwrap();
    // A GPU taken first, so the container's is not GPU 0: index names would be wrong.
    let first = podman.name(0);
    let first_id = podman.start(&first, &["--annotation", "gpupin.count=1"]);
    let name = podman.name(1);
    let id = podman.start(&name, &["--annotation", "gpupin.count=1"]);
    let held = podman.gpus_of(&id);
    assert_eq!(held.len(), 1, "status: {:#}", podman.status());
    let chosen = driver.gpus.iter().find(|g| g.uuid == held[0].0).unwrap();
    assert_ne!(podman.gpus_of(&first_id), held);
    let sh = |script: &str| {
        let out = podman
            .podman()
            .args(["exec", &name, "sh", "-c", script])
            .output()
            .unwrap();
        assert_success(&format!("podman exec {name}"), &out);
        String::from_utf8(out.stdout).unwrap()
    };
    assert_toolkit_driver_inside(&sh, &driver, chosen);
    let annotations = podman
        .podman()
        .args([
            "inspect",
            "--format",
            "{{index .Config.Annotations \"gpupin.assigned\"}}",
            &name,
        ])
        .output()
        .unwrap();
    assert_success("podman inspect", &annotations);
    assert_eq!(
        String::from_utf8_lossy(&annotations.stdout).trim(),
        chosen.uuid
    );
    podman.remove(&name);
    podman.remove(&first);
}

/// The spec nvidia-ctk wrote on another server, copied here: its entries name this
/// machine's device nodes for other GPUs, so gpupin refuses the start, names the spec and
/// says to regenerate it, and holds nothing.
#[test]
fn another_machines_spec_refuses_the_run_and_holds_nothing() {
    let test = "another_machines_spec_refuses_the_run_and_holds_nothing";
    let Some(podman) = setup(test, Options::default()) else {
        return;
    };
    let Some(peers) = required(test, Peers::find()) else {
        return;
    };
    let cdi: PathBuf = podman.path("cdi");
    let spec = another_machines_spec(&podman.path("other-machine"), &peers, &cdi).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(podman.config_path())
        .unwrap();
    writeln!(config, "driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]").unwrap();
    let out = podman.run(
        &[],
        &podman.name(0),
        &["--rm", "--annotation", "gpupin.count=1"],
        &["true"],
    );
    assert!(!out.status.success());
    let output = combined(&out);
    let line = output
        .lines()
        .find(|l| l.contains("gpupin: "))
        .unwrap_or_else(|| panic!("no gpupin line: {output}"));
    assert!(
        line.contains(&format!("CDI spec {}: entry GPU-", spec.display()))
            && line.contains("regenerate the spec (nvidia-ctk cdi generate)"),
        "{output}"
    );
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
}
