//! Docker 28+ with CDI on (its default), through gpupin-runtime: dockerd resolves
//! `--gpus N` (and compose's `deploy.resources.reservations.devices`) as the CDI devices
//! nvidia.com/gpu=0..N-1, and `--device nvidia.com/gpu=...` (compose `devices:`) by name,
//! from the CDI spec in its `cdi-spec-dirs`, into the container's spec before the runtime
//! runs. gpupin must replace what Docker chose with its own choice, as with podman: the
//! container sees exactly the GPUs the ledger gives it, never one another container
//! holds, and a request that cannot be met is refused with gpupin's line.
//!
//! The harness is `docker_support::cdi_harness` (a fake driver root's spec in
//! nvidia-ctk's form for the simulated 8-GPU machine; its stand-in nvidia-cdi-hook on
//! dockerd's PATH, which makes dockerd take the CDI path for `--gpus`). Docker 20.10
//! (Debian's) has no CDI: there each test says so and returns; they run in the modern
//! pass (`GPUPIN_ENGINES=modern`: dockerd 29, compose v5). Root, dockerd, docker, runc,
//! busybox-static (and docker-compose) are needed; elsewhere each test says why it skips
//! (under CI=true it fails instead).

mod docker_support;

use docker_support::{
    ComposeProject, Container, Harness, Need, Slot, cdi_harness, ok, text, write,
};
use std::collections::BTreeSet;

/// The `nvidia<minor>` names of the GPUs the ledger gives `id`, sorted.
fn held_nodes(slot: &Slot, id: &str) -> Vec<String> {
    let minors = slot.minors();
    let mut nodes: Vec<String> = slot
        .holders()
        .get(id)
        .map(|uuids| {
            uuids
                .iter()
                .map(|uuid| format!("nvidia{}", minors[uuid]))
                .collect()
        })
        .unwrap_or_default();
    nodes.sort();
    nodes
}

/// The slot's gpupin on the same CDI spec as dockerd (`driver = "cdi"`), as on a host
/// where both read /var/run/cdi: gpupin then applies its GPUs' entries, and knows which
/// DRM nodes are whose.
fn reset_with_cdi(h: &Harness, slot: &Slot) {
    slot.reset_config(None);
    let mut config = std::fs::read_to_string(&slot.config).unwrap();
    config.push_str(&format!(
        "driver = \"cdi\"\ncdi_spec_dirs = [{:?}]\n",
        h.dir.join("cdi")
    ));
    write(&slot.config, &config);
}

/// The DRM nodes (`card<N>`, `renderD<N>`) in container `id`, and those of the GPUs
/// the ledger gives it, both sorted: they must be the same.
fn drm_nodes(h: &Harness, slot: &Slot, id: &str) -> (Vec<String>, Vec<String>) {
    let listing = ok(h.docker().args(["exec", id, "ls", "/dev/dri"]));
    let mut inside: Vec<String> = listing
        .split_whitespace()
        .filter(|n| n.starts_with("card") || n.starts_with("renderD"))
        .map(str::to_string)
        .collect();
    inside.sort();
    let minors = slot.minors();
    let mut expected: Vec<String> = slot.holders()[id]
        .iter()
        .flat_map(|uuid| {
            let gpu = h.cdi_gpus.iter().find(|g| g.minor as u64 == minors[uuid]);
            gpu.unwrap().drm_nodes().map(|(name, _)| name)
        })
        .collect();
    expected.sort();
    (inside, expected)
}

/// What the container sees: its GPU nodes, sorted.
fn seen(c: &Container) -> Vec<String> {
    let mut nodes = c.gpu_nodes();
    nodes.sort();
    nodes
}

/// Docker took the CDI path for the container, not NVIDIA's runtime hook: the hook never
/// saw it, and the CDI spec's stand-in nvidia-cdi-hook ran for it.
fn assert_resolved_through_cdi(h: &Harness, id: &str) {
    assert_eq!(
        h.nvidia_hook_saw(id),
        Vec::<String>::new(),
        "NVIDIA's runtime hook ran: Docker did not resolve the request through CDI"
    );
    let calls =
        std::fs::read_to_string(h.dir.join("driver/nvidia-cdi-hook.log")).unwrap_or_default();
    assert!(
        calls.lines().any(|l| l.starts_with(id)),
        "the CDI spec's hook never ran for {id}: {calls}"
    );
}

/// Holds GPUs `devices` (e.g. "0,1") in `slot` with a container of their own.
fn hold<'h>(h: &'h Harness, slot: &Slot, devices: &str) -> Container<'h> {
    let c = h.start(&slot.runtime, &["-l", &format!("gpupin.devices={devices}")]);
    let expected: Vec<String> = devices.split(',').map(|m| format!("nvidia{m}")).collect();
    assert_eq!(held_nodes(slot, &c.id), expected);
    c
}

#[test]
fn docker_run_gpus_2_resolved_through_cdi_gets_gpupins_choice() {
    let test = "docker_run_gpus_2_resolved_through_cdi_gets_gpupins_choice";
    let Some(h) = cdi_harness(test, Need::Docker) else {
        return;
    };
    let slot = h.slot();
    reset_with_cdi(h, &slot);
    let first = hold(h, &slot, "0");
    let c = h.start(&slot.runtime, &["--gpus", "2"]);
    assert_resolved_through_cdi(h, &c.id);
    let held = held_nodes(&slot, &c.id);
    assert_eq!(held.len(), 2, "{:?}", slot.holders());
    assert!(
        !held.contains(&"nvidia0".to_string()),
        "held by {}",
        first.id
    );
    assert_eq!(seen(&c), held, "only gpupin's choice is in the container");
    let (inside, expected) = drm_nodes(h, &slot, &c.id);
    assert_eq!(inside, expected, "the DRM nodes are those of gpupin's GPUs");
    // gpupin's CDI driver put the devices in the spec; `void`, as NVIDIA's spec says,
    // keeps NVIDIA's runtime (were it next) from adding any.
    assert_eq!(c.visible(), ["void"]);
}

#[test]
fn docker_run_device_nvidia_gpu_all_beside_a_count_gets_exactly_gpupins_choice() {
    let test = "docker_run_device_nvidia_gpu_all_beside_a_count_gets_exactly_gpupins_choice";
    let Some(h) = cdi_harness(test, Need::Docker) else {
        return;
    };
    let slot = h.slot();
    reset_with_cdi(h, &slot);
    let _first = hold(h, &slot, "0,1");
    let c = h.start(
        &slot.runtime,
        &["--device", "nvidia.com/gpu=all", "-l", "gpupin.count=1"],
    );
    let held = held_nodes(&slot, &c.id);
    assert_eq!(held.len(), 1, "{:?}", slot.holders());
    assert!(
        !["nvidia0", "nvidia1"].contains(&held[0].as_str()),
        "{held:?}"
    );
    assert_eq!(seen(&c), held, "only gpupin's choice is in the container");
    let (inside, expected) = drm_nodes(h, &slot, &c.id);
    assert_eq!(inside, expected, "the DRM nodes are those of gpupin's GPUs");
}

#[test]
fn docker_run_device_nvidia_gpu_by_name_without_a_request_is_a_request_for_as_many() {
    let test = "docker_run_device_nvidia_gpu_by_name_without_a_request_is_a_request_for_as_many";
    let Some(h) = cdi_harness(test, Need::Docker) else {
        return;
    };
    let slot = h.slot();
    reset_with_cdi(h, &slot);
    let first = hold(h, &slot, "0");
    // Docker's choice is GPU 0, which another container holds: gpupin picks another.
    let c = h.start(&slot.runtime, &["--device", "nvidia.com/gpu=0"]);
    let held = held_nodes(&slot, &c.id);
    assert_eq!(held.len(), 1, "{:?}", slot.holders());
    assert_ne!(held, ["nvidia0"], "held by {}", first.id);
    assert_eq!(seen(&c), held);
    let (inside, expected) = drm_nodes(h, &slot, &c.id);
    assert_eq!(inside, expected, "the DRM nodes are those of gpupin's GPUs");
    // `all` is a request for every GPU: with one held it cannot be met, and is refused
    // with gpupin's line, holding nothing more.
    let out = h.run_detached(&slot.runtime, &["--device", "nvidia.com/gpu=all"]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(err.contains("gpupin: "), "{err}");
    let holders: BTreeSet<String> = slot.holders().into_keys().collect();
    assert_eq!(holders, BTreeSet::from([first.id.clone(), c.id.clone()]));
}

/// `docker-compose up -d` of `yaml` as project `project`, in the compose slot's dir.
fn up<'h>(h: &'h Harness, slot: &Slot, project: &str, yaml: &str) -> ComposeProject<'h> {
    let file = slot.dir.join(format!("{project}.yml"));
    write(&file, yaml);
    let p = ComposeProject {
        harness: h,
        project: project.into(),
        file,
    };
    ok(p.cmd().args(["up", "-d"]));
    p
}

#[test]
fn compose_cdi_devices_and_gpu_reservations_get_gpupins_choice() {
    let test = "compose_cdi_devices_and_gpu_reservations_get_gpupins_choice";
    let Some(h) = cdi_harness(test, Need::Compose) else {
        return;
    };
    let (_lock, slot) = h.compose_slot();
    reset_with_cdi(h, &slot);
    // `devices:` by CDI name beside a gpupin label, and a reservation with `count`
    // (what `--gpus 2` sends), two replicas of each.
    let p = up(
        h,
        &slot,
        "gpupincdi",
        "services:\n\
         \x20 named:\n\
         \x20   image: busybox:gpupin-test\n\
         \x20   command: [\"sleep\", \"1000000\"]\n\
         \x20   network_mode: none\n\
         \x20   runtime: gpupin\n\
         \x20   labels: {gpupin.count: \"1\"}\n\
         \x20   devices: [\"nvidia.com/gpu=all\"]\n\
         \x20   deploy: {replicas: 2}\n\
         \x20 reserved:\n\
         \x20   image: busybox:gpupin-test\n\
         \x20   command: [\"sleep\", \"1000000\"]\n\
         \x20   network_mode: none\n\
         \x20   runtime: gpupin\n\
         \x20   deploy:\n\
         \x20     replicas: 2\n\
         \x20     resources:\n\
         \x20       reservations:\n\
         \x20         devices:\n\
         \x20           - driver: nvidia\n\
         \x20             count: 2\n\
         \x20             capabilities: [gpu]\n",
    );
    let ids = p.ids();
    assert_eq!(ids.len(), 4, "{ids:?}");
    let holders = slot.holders();
    let mut counts: Vec<usize> = ids.iter().map(|id| holders[id].len()).collect();
    counts.sort();
    assert_eq!(counts, [1, 1, 2, 2], "{holders:?}");
    let all: Vec<&String> = holders.values().flatten().collect();
    let distinct: BTreeSet<&&String> = all.iter().collect();
    assert_eq!(distinct.len(), 6, "six GPUs, none given twice: {holders:?}");
    for id in &ids {
        let inside = ok(h.docker().args(["exec", id, "ls", "/dev"]));
        let mut inside = docker_support::gpu_nodes(inside.split_whitespace());
        inside.sort();
        assert_eq!(inside, held_nodes(&slot, id), "{id} sees only its GPUs");
        let (inside, expected) = drm_nodes(h, &slot, id);
        assert_eq!(inside, expected, "{id}'s DRM nodes are its GPUs'");
        if holders[id].len() == 2 {
            assert_resolved_through_cdi(h, id);
        }
    }
    ok(p.cmd().args(["down", "--timeout", "1"]));
    assert!(slot.holders().is_empty(), "{:?}", slot.holders());
}
