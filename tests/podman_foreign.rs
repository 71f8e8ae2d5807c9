//! GPUs that reach a podman container around gpupin (issue 10, part 3), with real podman,
//! runc and gpupin's precreate hook on a simulated 8-GPU machine: GPU nodes passed with
//! `--device` (as CDI's `--device nvidia.com/gpu=...` puts them into the spec) give way to
//! gpupin's choice, and `NVIDIA_VISIBLE_DEVICES=all` without a request is voided. Root,
//! podman, runc and busybox-static are needed; elsewhere the tests say why they skip
//! (under CI=true they fail instead).

mod podman_support;

use podman_support::{Options, Podman, env_value, gpu_nodes, setup};
use std::path::PathBuf;
use std::process::Command;

/// Host character nodes `/.../nvidia<minor>` with the simulated machine's numbers (major
/// 195, minor = index), for `podman --device`, which stats its source.
fn fake_gpu_nodes(podman: &Podman, minors: &[u32]) -> Vec<PathBuf> {
    let dir = podman.path("host-dev");
    std::fs::create_dir_all(&dir).unwrap();
    minors
        .iter()
        .map(|minor| {
            let path = dir.join(format!("nvidia{minor}"));
            if !path.exists() {
                let made = Command::new("mknod")
                    .arg(&path)
                    .args(["c", "195", &minor.to_string()])
                    .status()
                    .expect("running mknod");
                assert!(made.success(), "mknod {}", path.display());
            }
            path
        })
        .collect()
}

/// `--device HOST:/dev/nvidiaN` for each of `minors`.
fn device_args(podman: &Podman, minors: &[u32]) -> Vec<String> {
    fake_gpu_nodes(podman, minors)
        .iter()
        .zip(minors)
        .flat_map(|(host, minor)| {
            [
                "--device".to_string(),
                format!("{}:/dev/nvidia{minor}", host.display()),
            ]
        })
        .collect()
}

/// The GPU nodes a running container sees and the GPU nodes the ledger gives its id.
fn seen_and_held(podman: &Podman, name: &str, id: &str) -> (Vec<String>, Vec<String>) {
    let (dev, _) = podman.inside(name);
    let mut held: Vec<String> = podman
        .gpus_of(id)
        .iter()
        .map(|(_, minor)| format!("nvidia{minor}"))
        .collect();
    held.sort();
    (gpu_nodes(dev.iter().map(String::as_str)), held)
}

#[test]
fn devices_passed_beside_a_request_give_way_to_gpupins_choice() {
    let Some(podman) = setup(
        "devices_passed_beside_a_request_give_way_to_gpupins_choice",
        Options::default(),
    ) else {
        return;
    };
    // Others hold GPUs 0 and 1, which the container's --device names. (podman splits an
    // annotation's value at commas: one GPU each.)
    let others: Vec<String> = (0..2)
        .map(|gpu| {
            let other = podman.name(gpu);
            podman.start(&other, &["--annotation", &format!("gpupin.devices={gpu}")]);
            other
        })
        .collect();
    let name = podman.name(2);
    let mut args = device_args(&podman, &[0, 1, 2, 3]);
    args.extend(["--annotation".into(), "gpupin.count=1".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = podman.start(&name, &args);
    let (seen, held) = seen_and_held(&podman, &name, &id);
    assert_eq!(held.len(), 1, "status: {:#}", podman.status());
    assert_eq!(seen, held, "only gpupin's choice is in the container");
    assert!(!held.contains(&"nvidia0".into()) && !held.contains(&"nvidia1".into()));
    podman.remove(&name);
    for other in others {
        podman.remove(&other);
    }
}

#[test]
fn devices_passed_without_a_request_become_one_for_as_many_gpus() {
    let Some(podman) = setup(
        "devices_passed_without_a_request_become_one_for_as_many_gpus",
        Options {
            always: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    let first = podman.name(0);
    let first_id = podman.start(&first, &["--annotation", "gpupin.devices=0"]);
    assert_eq!(podman.gpus_of(&first_id).len(), 1);
    let name = podman.name(1);
    let args = device_args(&podman, &[0, 1]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let id = podman.start(&name, &args);
    let (seen, held) = seen_and_held(&podman, &name, &id);
    assert_eq!(held.len(), 2, "status: {:#}", podman.status());
    assert_eq!(seen, held);
    assert!(
        !held.contains(&"nvidia0".into()),
        "GPU 0 is held by {first}"
    );
    podman.remove(&name);
    podman.remove(&first);
}

#[test]
fn nvidia_visible_devices_all_without_a_request_is_voided_and_holds_nothing() {
    let Some(podman) = setup(
        "nvidia_visible_devices_all_without_a_request_is_voided_and_holds_nothing",
        Options {
            always: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    let name = podman.name(0);
    podman.start(&name, &["-e", "NVIDIA_VISIBLE_DEVICES=all"]);
    let (dev, env) = podman.inside(&name);
    assert_eq!(env_value(&env, "NVIDIA_VISIBLE_DEVICES"), Some("void"));
    assert_eq!(
        env.iter()
            .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
            .count(),
        1,
        "{env:?}"
    );
    assert!(gpu_nodes(dev.iter().map(String::as_str)).is_empty());
    assert_eq!(podman.holders(), Vec::<serde_json::Value>::new());
    podman.remove(&name);
}
