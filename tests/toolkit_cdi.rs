//! gpupin against the CDI spec NVIDIA's own `nvidia-ctk cdi generate` writes (the toolkit
//! built by tests/peers/build, run against NVIDIA's mock NVML and a fake driver root, as
//! an admin runs it: `--output`, default names and `--device-name-strategy=uuid`), under
//! real podman with `gpupin install podman`'s precreate hook: the container gets exactly
//! the chosen GPU's entry of THAT spec (never `all`), the spec-wide edits, and the real
//! `nvidia-cdi-hook create-symlinks` / `update-ldcache` the spec names run in it.
//!
//! gpupin's inventory is the mock's GPUs (an inventory file written from what NVIDIA's
//! mock server serves), so the spec's UUIDs are the ones gpupin hands out. Root, podman,
//! runc, busybox-static and the built peers are needed; elsewhere the test says why it
//! skips (under CI=true it fails instead).

#[allow(unused_imports)] // re-exports this binary does not use
mod podman_support;

use gpupin_sandbox::harness::toolkit::{MockDriver, Peers, assert_toolkit_driver_inside};
use gpupin_sandbox::harness::{need_root, required};
use podman_support::{Options, Podman, assert_success, setup};
use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;

/// A podman harness whose gpupin hands out the mock profile's GPUs with `driver = "cdi"`,
/// and the spec nvidia-ctk generated for them with `options`.
struct Host {
    podman: Podman,
    driver: MockDriver,
    spec: PathBuf,
    _dir: tempfile::TempDir,
}

fn host(test: &str, profile: &str, options: &[&str]) -> Option<Host> {
    // Root first: the fake driver root's nodes need mknod, before the harness's own check.
    if !need_root(test) {
        return None;
    }
    let peers = required(test, Peers::find())?;
    // The driver root and inventory come before the harness: its config names the inventory.
    let dir = tempfile::Builder::new()
        .prefix("gpupin-toolkit-")
        .tempdir()
        .unwrap();
    let driver = MockDriver::create(dir.path(), &peers, profile).unwrap();
    let inventory = dir.path().join("machine.json");
    driver.write_inventory(&inventory).unwrap();
    let machine: &'static str = Box::leak(inventory.display().to_string().into_boxed_str());
    let podman = setup(
        test,
        Options {
            machine: Some(machine),
            ..Options::default()
        },
    )?;
    let cdi = podman.path("cdi");
    std::fs::create_dir_all(&cdi).unwrap();
    let spec = cdi.join("nvidia.yaml");
    driver.generate(&spec, options).unwrap();
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(podman.config_path())
        .unwrap();
    writeln!(config, "driver = \"cdi\"\ncdi_spec_dirs = [{cdi:?}]").unwrap();
    Some(Host {
        podman,
        driver,
        spec,
        _dir: dir,
    })
}

/// Takes one GPU for a first container and one for a second (so the second's is not GPU
/// 0), and checks what the second sees against the generated spec.
fn second_container_gets_exactly_its_entry(host: &Host) {
    let podman = &host.podman;
    let spec = std::fs::read_to_string(&host.spec).unwrap();
    let first = podman.name(0);
    let first_id = podman.start(&first, &["--annotation", "gpupin.count=1"]);
    let name = podman.name(1);
    let id = podman.start(&name, &["--annotation", "gpupin.count=1"]);
    let held = podman.gpus_of(&id);
    assert_eq!(held.len(), 1, "status: {:#}", podman.status());
    assert_ne!(podman.gpus_of(&first_id), held);
    let chosen = host
        .driver
        .gpus
        .iter()
        .find(|g| g.uuid == held[0].0)
        .unwrap_or_else(|| panic!("{} is none of the mock's GPUs", held[0].0));
    assert!(
        spec.contains(&chosen.uuid),
        "the generated spec has no {}",
        chosen.uuid
    );

    let sh = |script: &str| {
        let out = podman
            .podman()
            .args(["exec", &name, "sh", "-c", script])
            .output()
            .unwrap();
        assert_success(&format!("podman exec {name}"), &out);
        String::from_utf8(out.stdout).unwrap()
    };
    assert_toolkit_driver_inside(&sh, &host.driver, chosen);

    // The OCI config the container ran with: the chosen GPU's own hooks (nvidia-ctk
    // names it by UUID in apply-cuda-memory-limits), no other GPU's.
    let config = oci_config(podman, &name);
    let hooks = config["hooks"].to_string();
    assert!(hooks.contains(&chosen.uuid), "hooks: {hooks}");
    for other in host.driver.gpus.iter().filter(|g| g.uuid != chosen.uuid) {
        assert!(
            !hooks.contains(&other.uuid),
            "{} in hooks: {hooks}",
            other.uuid
        );
    }
    assert!(
        hooks.contains(
            &host
                .driver
                .peers
                .tool("nvidia-cdi-hook")
                .display()
                .to_string()
        ),
        "hooks: {hooks}"
    );
    podman.remove(&name);
    podman.remove(&first);
}

/// The OCI config podman handed the runtime for `name`.
fn oci_config(podman: &Podman, name: &str) -> Value {
    let out = podman
        .podman()
        .args(["inspect", "--format", "{{.OCIConfigPath}}", name])
        .output()
        .unwrap();
    assert_success("podman inspect", &out);
    let path = String::from_utf8(out.stdout).unwrap();
    serde_json::from_slice(&std::fs::read(path.trim()).unwrap()).unwrap()
}

#[test]
fn the_default_spec_of_nvidia_ctk_gives_the_chosen_gpus_entry_only() {
    let test = "the_default_spec_of_nvidia_ctk_gives_the_chosen_gpus_entry_only";
    let Some(host) = host(test, "dgxa100", &[]) else {
        return;
    };
    let spec = std::fs::read_to_string(&host.spec).unwrap();
    // What an admin gets by default: index names, UUID names and `all`.
    for name in ["- name: \"0\"", "- name: all"] {
        assert!(spec.contains(name), "{name}\n{spec}");
    }
    second_container_gets_exactly_its_entry(&host);
}

#[test]
fn the_uuid_named_spec_of_nvidia_ctk_gives_the_chosen_gpus_entry_only() {
    let test = "the_uuid_named_spec_of_nvidia_ctk_gives_the_chosen_gpus_entry_only";
    let Some(host) = host(test, "dgxh100", &["--device-name-strategy=uuid"]) else {
        return;
    };
    let spec = std::fs::read_to_string(&host.spec).unwrap();
    assert!(!spec.contains("- name: \"0\""), "{spec}");
    second_container_gets_exactly_its_entry(&host);
}
