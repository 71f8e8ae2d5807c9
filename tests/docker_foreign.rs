//! GPUs that reach a Docker container around gpupin (issue 10, part 3), through a private
//! dockerd and gpupin-runtime on a simulated 8-GPU machine: GPU nodes passed with
//! `--device` (as Docker's `--gpus N` resolved as CDI puts them into the spec) give way to
//! gpupin's choice or become a request, and `NVIDIA_VISIBLE_DEVICES=all` without a request
//! runs as `void`. Root, dockerd, runc and busybox-static are needed; elsewhere the tests
//! say why they skip (under CI=true they fail instead).

mod docker_support;

use docker_support::{Need, Slot, harness};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

/// Host character nodes with the simulated machine's numbers (major 195, minor = index),
/// for `docker --device`, which stats its source; in the slot's dir, since the tests
/// share the harness's and run at once.
fn device_args(slot: &Slot, minors: &[u32]) -> Vec<String> {
    let dir = slot.dir.join("host-dev");
    std::fs::create_dir_all(&dir).unwrap();
    minors
        .iter()
        .flat_map(|minor| {
            let path: PathBuf = dir.join(format!("nvidia{minor}"));
            if !path.exists() {
                let made = Command::new("mknod")
                    .arg(&path)
                    .args(["c", "195", &minor.to_string()])
                    .status()
                    .expect("running mknod");
                assert!(made.success(), "mknod {}", path.display());
            }
            [
                "--device".to_string(),
                format!("{}:/dev/nvidia{minor}", path.display()),
            ]
        })
        .collect()
}

/// The `nvidia<minor>` names of the GPUs the ledger gives `id`.
fn held_nodes(slot: &Slot, id: &str) -> Vec<String> {
    let minors = slot.minors();
    let mut nodes: Vec<String> = slot.holders()[id]
        .iter()
        .map(|uuid| format!("nvidia{}", minors[uuid]))
        .collect();
    nodes.sort();
    nodes
}

#[test]
fn devices_beside_a_label_request_give_way_to_gpupins_choice() {
    let Some(h) = harness(
        "devices_beside_a_label_request_give_way_to_gpupins_choice",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let first = h.start(&slot.runtime, &["-l", "gpupin.devices=0,1"]);
    let mut args = device_args(&slot, &[0, 1, 2, 3]);
    args.extend(["-l".into(), "gpupin.count=1".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = h.start(&slot.runtime, &args);
    let held = held_nodes(&slot, &c.id);
    assert_eq!(held.len(), 1, "{:?}", slot.holders());
    assert_eq!(
        c.gpu_nodes(),
        held,
        "only gpupin's choice is in the container"
    );
    let taken = BTreeSet::from(["nvidia0".to_string(), "nvidia1".to_string()]);
    assert!(
        !taken.contains(&held[0]),
        "{held:?} is held by {}",
        first.id
    );
}

#[test]
fn devices_without_a_request_become_one_for_as_many_gpus() {
    let Some(h) = harness(
        "devices_without_a_request_become_one_for_as_many_gpus",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let first = h.start(&slot.runtime, &["-l", "gpupin.devices=0"]);
    let args = device_args(&slot, &[0, 1]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let c = h.start(&slot.runtime, &args);
    let held = held_nodes(&slot, &c.id);
    assert_eq!(held.len(), 2, "{:?}", slot.holders());
    assert_eq!(c.gpu_nodes(), held);
    assert!(!held.contains(&"nvidia0".into()), "held by {}", first.id);
    assert_eq!(
        c.visible().len(),
        2,
        "NVIDIA_VISIBLE_DEVICES names gpupin's two"
    );
}

#[test]
fn nvidia_visible_devices_all_without_a_request_runs_as_void() {
    let Some(h) = harness(
        "nvidia_visible_devices_all_without_a_request_runs_as_void",
        Need::Docker,
    ) else {
        return;
    };
    let slot = h.slot();
    slot.reset_config(None);
    let c = h.start(&slot.runtime, &["-e", "NVIDIA_VISIBLE_DEVICES=all"]);
    let visible: Vec<String> = c
        .init_env()
        .into_iter()
        .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert_eq!(visible, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(c.gpu_nodes().is_empty());
    assert!(slot.holders().is_empty(), "{:?}", slot.holders());
}
