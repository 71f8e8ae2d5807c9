//! GPUs that reach a podman container around gpupin (issue 10, part 3), with real podman,
//! runc and gpupin's precreate hook on a simulated 8-GPU machine: GPU nodes passed with
//! `--device` (as CDI's `--device nvidia.com/gpu=...` puts them into the spec) give way to
//! gpupin's choice, and `NVIDIA_VISIBLE_DEVICES=all` without a request is voided. Root,
//! podman, runc and busybox-static are needed; elsewhere the tests say why they skip
//! (under CI=true they fail instead).

mod podman_support;

use gpupin_sandbox::harness::toolkit::{MockDriver, Peers};
use gpupin_sandbox::harness::{need_root, required};
use podman_support::{Options, Podman, assert_success, combined, env_value, gpu_nodes, setup};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use tempfile::TempDir;

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

/// Where podman 4 reads CDI specs (it has no setting for another dir); the runs that
/// need one get a private tmpfs there, in a mount namespace of their own.
const CDI_DIR: &str = "/run/cdi";

/// A harness whose gpupin hands out the GPUs of NVIDIA's mock NVML (`dgxa100`: minor =
/// index, as on the simulated machine), and the CDI spec NVIDIA's `nvidia-ctk cdi
/// generate` writes for them and a fake driver root (gpupin-sandbox harness::toolkit):
/// devices by index, by UUID and `all`, and the real nvidia-cdi-hook, which podman runs
/// for the devices it injects itself.
fn setup_with_toolkit(test: &str, options: Options) -> Option<(Podman, PathBuf, TempDir)> {
    // Root first: the fake driver root's nodes need mknod, before the harness's own check.
    if !need_root(test) {
        return None;
    }
    let peers = required(test, Peers::find())?;
    let dir = tempfile::Builder::new()
        .prefix("gpupin-podman-foreign-")
        .tempdir()
        .unwrap();
    let driver = MockDriver::create(dir.path(), &peers, "dgxa100").unwrap();
    let inventory = dir.path().join("machine.json");
    driver.write_inventory(&inventory).unwrap();
    let machine: &'static str = Box::leak(inventory.display().to_string().into_boxed_str());
    let podman = setup(
        test,
        Options {
            machine: Some(machine),
            ..options
        },
    )?;
    let spec = podman.path("nvidia.yaml");
    driver.generate(&spec, &[]).unwrap();
    Some((podman, spec, dir))
}

/// `podman run --rm OPTIONS ROOTFS sh -c SCRIPT` with the CDI spec at `spec` in podman's
/// spec dir, seen by this run only (a private mount namespace with a tmpfs on CDI_DIR).
fn run_with_cdi(
    podman: &Podman,
    spec: &Path,
    name: &str,
    options: &[&str],
    script: &str,
) -> Output {
    // The mount point must exist on the host, and stays (an empty dir is what CDI reads
    // as no specs): removing it would detach the tmpfs of a run still going.
    let _ = std::fs::create_dir(CDI_DIR);
    let mut inner = podman.podman();
    inner
        .args(["run", "--rm", "--name", name, "--network", "none"])
        .args(options)
        .arg("--rootfs")
        .arg(podman.rootfs())
        .args(["sh", "-c", script]);
    let mut outer = Command::new("unshare");
    outer
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs -o mode=755 gpupin-test-cdi {CDI_DIR} && cp \"$0\" {CDI_DIR}/nvidia.yaml && exec \"$@\""
        ))
        .arg(spec)
        .arg(inner.get_program())
        .args(inner.get_args());
    for (key, value) in inner.get_envs() {
        match value {
            Some(value) => outer.env(key, value),
            None => outer.env_remove(key),
        };
    }
    outer.output().expect("running podman under unshare")
}

/// Others hold the GPUs of `minors`, one container each.
fn hold(podman: &Podman, minors: &[u32]) -> Vec<String> {
    minors
        .iter()
        .map(|minor| {
            let name = podman.name(*minor as usize);
            podman.start(&name, &["--annotation", &format!("gpupin.devices={minor}")]);
            name
        })
        .collect()
}

/// What the container shows: its /dev and its env. The last command is not `tr`: busybox
/// sh would exec it as pid 1, and pid 1's env is the one to read.
const SHOW: &str = "ls /dev; echo ---; tr '\\0' '\\n' < /proc/1/environ; echo rc=$?";

#[test]
fn cdi_all_beside_a_count_of_one_gives_the_container_one_gpu_gpupins() {
    let Some((podman, spec, _driver)) = setup_with_toolkit(
        "cdi_all_beside_a_count_of_one_gives_the_container_one_gpu_gpupins",
        Options::default(),
    ) else {
        return;
    };
    // GPUs 0-6 are held: gpupin's one free GPU is 7.
    let others = hold(&podman, &[0, 1, 2, 3, 4, 5, 6]);
    let out = run_with_cdi(
        &podman,
        &spec,
        &podman.name(100),
        &[
            "--device",
            "nvidia.com/gpu=all",
            "--annotation",
            "gpupin.count=1",
        ],
        SHOW,
    );
    assert_success("podman run --device nvidia.com/gpu=all", &out);
    let text = combined(&out);
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    assert_eq!(gpu_nodes(text.lines()), ["nvidia7"], "{text}");
    // The CDI spec in podman's dir is in gpupin's default cdi_spec_dirs too (/var/run/cdi
    // is /run/cdi), so gpupin gives the driver through it: NVIDIA_VISIBLE_DEVICES is the
    // spec's `void`, and the ledger names the GPU.
    let visible = env_value(&lines, "NVIDIA_VISIBLE_DEVICES").unwrap_or_default();
    assert_eq!(visible, "void", "{text}");
    let status = podman.status();
    let seventh = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["minor"] == 7)
        .and_then(|g| g["uuid"].as_str())
        .unwrap()
        .to_string();
    let log = podman.audit_log();
    assert!(log.contains(&seventh), "gpupin recorded {seventh}: {log}");
    for other in others {
        podman.remove(&other);
    }
}

#[test]
fn cdi_devices_without_a_request_become_a_count_gpupin_picks() {
    let Some((podman, spec, _driver)) = setup_with_toolkit(
        "cdi_devices_without_a_request_become_a_count_gpupin_picks",
        Options {
            always: true,
            ..Options::default()
        },
    ) else {
        return;
    };
    let others = hold(&podman, &[0, 1]);
    let out = run_with_cdi(
        &podman,
        &spec,
        &podman.name(100),
        &[
            "--device",
            "nvidia.com/gpu=0",
            "--device",
            "nvidia.com/gpu=1",
        ],
        SHOW,
    );
    assert_success("podman run --device nvidia.com/gpu=0,1", &out);
    let text = combined(&out);
    let nodes = gpu_nodes(text.lines());
    assert_eq!(nodes.len(), 2, "{text}");
    assert!(
        !nodes.contains(&"nvidia0".into()) && !nodes.contains(&"nvidia1".into()),
        "GPUs 0 and 1 are held by others: {text}"
    );
    let lines: Vec<String> = text.lines().map(str::to_string).collect();
    // The driver through the CDI spec (in gpupin's default dirs too): `void`.
    let visible = env_value(&lines, "NVIDIA_VISIBLE_DEVICES").unwrap_or_default();
    assert_eq!(visible, "void", "{text}");
    for other in others {
        podman.remove(&other);
    }
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
