//! gpupin against the CDI spec NVIDIA's own `nvidia-ctk cdi generate` writes (the toolkit
//! built by tests/peers/build, run against NVIDIA's mock NVML and a fake driver root, as
//! an admin runs it: `--output`, default names and `--device-name-strategy=uuid`), under
//! real podman with `gpupin install podman`'s precreate hook: the container gets exactly
//! the chosen GPU's entry of THAT spec (never `all`), the spec-wide edits, and the real
//! `nvidia-cdi-hook create-symlinks` / `update-ldcache` the spec names run in it.
//!
//! With MIG (the mock's A100 80GB cut through go-nvml's own calls), nvidia-ctk's spec has
//! an entry per instance and a container asking for a profile gets exactly that
//! instance's entry.
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
    host_with_mig(test, profile, options, None)
}

/// As `host`, with the mock's GPUs cut into MIG instances as `mig` says (the inventory
/// file lists them, the spec nvidia-ctk generates has their entries).
fn host_with_mig(test: &str, profile: &str, options: &[&str], mig: Option<&str>) -> Option<Host> {
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
    let driver = MockDriver::create_with_mig(dir.path(), &peers, profile, mig).unwrap();
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

/// nvidia-ctk's spec for NVIDIA's mock with MIG (an A100 80GB cut into 3g.40gb, 2g.20gb and
/// two 1g.10gb) has an entry per instance, by `<gpu>:<mig>` and by MIG UUID, with the
/// parent's node and the two capability nodes. A podman container that asks for a
/// `1g.10gb` gets that instance's entry of THAT spec: its GPU's node and exactly its two
/// capability nodes, no other instance's and no other GPU's.
#[test]
fn nvidia_ctks_mig_entry_is_what_a_container_given_an_instance_gets() {
    use gpupin_sandbox::harness::toolkit::{CAPS_MAJOR, mig_cap_minors};
    let test = "nvidia_ctks_mig_entry_is_what_a_container_given_an_instance_gets";
    let geometry = "0:3g.40gb,2g.20gb,1g.10gb,1g.10gb";
    let Some(host) = host_with_mig(test, "dgxa100-80gb", &[], Some(geometry)) else {
        return;
    };
    let spec = std::fs::read_to_string(&host.spec).unwrap();
    let instances = host.driver.mig_instances();
    assert_eq!(instances.len(), 4);
    for (_, m) in &instances {
        let uuid = m["uuid"].as_str().unwrap();
        assert!(
            spec.contains(&format!("- name: {uuid}")),
            "no {uuid}: {spec}"
        );
        assert!(
            spec.contains(&format!("- name: \"0:{}\"", m["index"])),
            "no 0:{}: {spec}",
            m["index"]
        );
    }

    let podman = &host.podman;
    let name = podman.name(0);
    let id = podman.start(&name, &["--annotation", "gpupin.mig=1g.10gb"]);
    // The holder's record names the instance (status lists it under its GPU).
    let status = podman.status();
    let record = gpupin_sandbox::harness::status::holder(&status, &id)
        .unwrap_or_else(|| panic!("{id} holds nothing: {status:#}"));
    let held: Vec<String> = serde_json::from_value(record["gpus"].clone()).unwrap();
    assert_eq!(held.len(), 1, "{record:#}");
    let (gpu, chosen) = instances
        .iter()
        .find(|(_, m)| m["uuid"] == held[0].as_str())
        .unwrap_or_else(|| panic!("{} is none of the mock's instances", held[0]));
    assert_eq!(chosen["profile"], "1g.10gb");
    let caps = |gpu: &Value, m: &Value| {
        mig_cap_minors(
            gpu["minor"].as_u64().unwrap(),
            m["gi"].as_u64().unwrap(),
            m["ci"].as_u64().unwrap(),
        )
    };
    let (gi_minor, ci_minor) = caps(gpu, chosen);

    let sh = |script: &str| {
        let out = podman
            .podman()
            .args(["exec", &name, "sh", "-c", script])
            .output()
            .unwrap();
        assert_success(&format!("podman exec {name}"), &out);
        String::from_utf8(out.stdout).unwrap()
    };
    let mut inside: Vec<String> = sh("ls /dev/nvidia-caps")
        .split_whitespace()
        .map(String::from)
        .collect();
    inside.sort();
    let mut want = vec![
        format!("nvidia-cap{gi_minor}"),
        format!("nvidia-cap{ci_minor}"),
    ];
    want.sort();
    assert_eq!(inside, want);
    let gpus: Vec<String> = sh("ls /dev")
        .split_whitespace()
        .filter(|n| {
            n.starts_with("nvidia") && n.trim_start_matches("nvidia").parse::<u32>().is_ok()
        })
        .map(String::from)
        .collect();
    assert_eq!(gpus, [format!("nvidia{}", gpu["minor"])]);
    for minor in [gi_minor, ci_minor] {
        // busybox stat: major and minor in hex.
        assert_eq!(
            sh(&format!(
                "stat -c '%t:%T' /dev/nvidia-caps/nvidia-cap{minor}"
            ))
            .trim(),
            format!("{CAPS_MAJOR:x}:{minor:x}")
        );
    }

    // The spec's own edits were applied too (CDI, not gpupin's own nodes): the driver's
    // files nvidia-ctk found are mounted.
    let mounts = sh("cat /proc/mounts");
    for file in host.driver.files() {
        assert!(
            mounts
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(file.as_str())),
            "{file} is not mounted: {mounts}"
        );
    }

    // The devices the container ran with: the spec's for that entry, no other instance's.
    let config = oci_config(podman, &name);
    let devices = config["linux"]["devices"].to_string();
    for (g, m) in &instances {
        let (gi, ci) = caps(g, m);
        let present =
            |minor: u32| devices.contains(&format!("/dev/nvidia-caps/nvidia-cap{minor}\""));
        let mine = m["uuid"] == chosen["uuid"];
        assert_eq!(present(gi), mine, "GI cap of {}: {devices}", m["uuid"]);
        assert_eq!(present(ci), mine, "CI cap of {}: {devices}", m["uuid"]);
    }
    podman.remove(&name);
}
