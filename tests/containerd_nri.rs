//! gpupin as containerd 2.x's NRI plugin (`gpupin nri`): a private containerd with NRI on
//! at a socket of the test's own, `gpupin nri` connected to it, and pods driven over the
//! CRI as the kubelet drives them, through containerd's default runtime (runc): no
//! RuntimeClass, no gpupin runtime handler. A container annotated `gpupin.count` gets
//! exactly its GPUs' nodes and their UUIDs, bound to its process by gpupin's hook; one
//! that asks for nothing gets no GPU and holds nothing; stopping the pod releases them.
//!
//! NRI is containerd 2.x's: these run in the modern pass (`GPUPIN_ENGINES=modern`, as
//! .ci/run runs them); on Debian's containerd 1.6, which has none, each says so and passes
//! without running. Root, containerd, ctr, runc, tar and busybox-static are needed;
//! elsewhere each test says why it skips (under CI=true it fails instead).

mod containerd_support;
mod cri_support;

use containerd_support::is_v2;
use cri_support::{
    Cri, Node, NriPlugin, cdi_dir, container_config, nvidia_nri_binary, sandbox_config, uuids,
};
use gpupin_sandbox::harness;
use gpupin_sandbox::harness::driver::{DriverRoot, FakeGpu};
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long containerd and the plugin may take to start and register (a readiness wait).
const READY_WAIT: Duration = Duration::from_secs(60);

/// A node with NRI on and `gpupin nri` registered with it; `None` where the test skips.
fn node_with_plugin(test: &str) -> Option<(Node, NriPlugin)> {
    if !is_v2() {
        harness::say(&format!(
            "{test}: containerd 1.x has no NRI; this runs on containerd 2.x (GPUPIN_ENGINES=modern)"
        ));
        return None;
    }
    let node = Node::start_with_nri(test, |_| {})?;
    let socket = node.nri_socket();
    let started = Instant::now();
    while !socket.exists() {
        assert!(
            started.elapsed() < READY_WAIT,
            "no NRI socket at {}\n{}",
            socket.display(),
            node.containerd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let plugin = node.start_nri_plugin("gpupin-nri.log");
    Some((node, plugin))
}

/// The simulated machine's GPUs, and a fake driver root whose `nvidia.com/gpu` CDI spec
/// is in containerd's CDI dir.
fn driver_with_cdi_spec(node: &Node) -> (Vec<FakeGpu>, DriverRoot) {
    let gpus = FakeGpu::from_status(&node.status());
    let dir = node.containerd.dir();
    let root = DriverRoot::create(&dir.join("driver"), &gpus).unwrap();
    root.write_cdi_spec(&cdi_dir(dir), &gpus).unwrap();
    (gpus, root)
}

/// That `container` has the node of the GPU with `minor` but its device cgroup denies it.
fn assert_denied(node: &Node, container: &str, minor: u32) {
    let opened = node
        .cri
        .exec_sync(container, &["cat", &format!("/dev/nvidia{minor}")])
        .unwrap();
    let said = String::from_utf8_lossy(&opened.stderr);
    assert!(said.contains("Operation not permitted"), "{said}");
}

#[test]
fn a_pod_without_a_runtime_class_gets_exactly_its_gpus_through_nri() {
    let test = "a_pod_without_a_runtime_class_gets_exactly_its_gpus_through_nri";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    // containerd's default handler (runc): gpupin-runtime never runs.
    let pod = node.run_pod_on("trainer", &[("gpupin.count", "2")], "");
    assert_eq!(
        node.holders(),
        Vec::<Value>::new(),
        "the sandbox asks for nothing"
    );
    let trainer = pod.start_container("trainer", &[], &[]);
    let record = node.holder(&trainer);
    assert_eq!(uuids(&record).len(), 2, "{record:#}\n{}", plugin.log());
    assert_eq!(record["source"], "nri", "{record:#}");
    assert_eq!(
        record["container"]["name"], "default/trainer/trainer",
        "{record:#}"
    );
    assert_eq!(record["container"]["engine"], "containerd", "{record:#}");
    // gpupin's prestart hook, which NRI put into the spec, bound the claim to the
    // container's process.
    assert!(record["pid"].is_u64(), "not bound to a process: {record:#}");
    assert_eq!(record["state"], "running", "{record:#}");

    // What the container sees: exactly its GPUs' nodes, their UUIDs in its env.
    assert_eq!(pod.gpu_nodes(&trainer), node.held_nodes(&trainer));
    assert_eq!(pod.visible_uuids(&trainer), uuids(&record));

    // A second pod's container gets two other GPUs.
    let other = node.run_pod_on("eval", &[("gpupin.count", "2")], "");
    let eval = other.start_container("eval", &[], &[]);
    let second = node.holder(&eval);
    assert!(
        uuids(&second).iter().all(|g| !uuids(&record).contains(g)),
        "a GPU handed out twice: {record:#} {second:#}"
    );

    pod.stop();
    other.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
    pod.remove();
    other.remove();
    assert_eq!(
        node.holders(),
        Vec::<Value>::new(),
        "after RemovePodSandbox"
    );
}

#[test]
fn a_container_that_asks_for_nothing_gets_no_gpu_through_nri() {
    let test = "a_container_that_asks_for_nothing_gets_no_gpu_through_nri";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let pod = node.run_pod_on("web", &[], "");
    let web = pod.start_container("web", &[], &[]);
    assert_eq!(node.holders(), Vec::<Value>::new(), "{}", plugin.log());
    assert_eq!(pod.gpu_nodes(&web), Vec::<String>::new());
    assert_eq!(pod.main_process_env(&web, "NVIDIA_VISIBLE_DEVICES"), None);
}

#[test]
fn a_request_gpupin_refuses_fails_the_create_with_its_one_line() {
    let test = "a_request_gpupin_refuses_fails_the_create_with_its_one_line";
    let Some((node, _plugin)) = node_with_plugin(test) else {
        return;
    };
    let pod = node.run_pod_on("huge", &[("gpupin.count", "9")], "");
    let err = pod.create_container("huge", &[], &[]).unwrap_err();
    let message = err.message();
    assert!(
        message.contains("gpupin: ") && message.contains("count 9"),
        "{message}"
    );
    assert_eq!(
        node.holders(),
        Vec::<Value>::new(),
        "nothing held after a refusal"
    );
}

/// The plugin killed and started again: the runtime's Synchronize lists the running
/// container, which keeps its GPUs; the next pod gets others.
#[test]
fn a_plugin_started_again_keeps_what_running_containers_hold() {
    let test = "a_plugin_started_again_keeps_what_running_containers_hold";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let pod = node.run_pod_on("trainer", &[("gpupin.count", "4")], "");
    let trainer = pod.start_container("trainer", &[], &[]);
    let before = uuids(&node.holder(&trainer));
    drop(plugin);
    let again = node.start_nri_plugin("gpupin-nri-again.log");
    // Synchronize follows Configure at once; a pod created next is served after it.
    let other = node.run_pod_on("eval", &[("gpupin.count", "4")], "");
    let eval = other.start_container("eval", &[], &[]);
    assert_eq!(uuids(&node.holder(&trainer)), before, "{}", again.log());
    let second = uuids(&node.holder(&eval));
    assert!(
        second.iter().all(|g| !before.contains(g)),
        "a GPU handed out twice: {before:?} {second:?}"
    );
    pod.stop();
    other.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}

/// GPUs that reach a container around gpupin under NRI: NVIDIA_VISIBLE_DEVICES of a
/// container that asks gpupin for nothing becomes `void` (`unrequested = "strip"`, the
/// default), nothing held; a GPU containerd's own CDI gave it (the CRI's CDIDevices, from
/// a device plugin's answer) is its request: NRI takes no node out of a container, so it
/// holds exactly that GPU in the ledger; beside a request of its own, such a GPU is
/// denied in its device cgroup.
#[test]
fn gpus_that_reach_a_container_around_gpupin_are_stripped_or_pinned() {
    let test = "gpus_that_reach_a_container_around_gpupin_are_stripped_or_pinned";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let (gpus, root) = driver_with_cdi_spec(&node);
    let pod = node.run_pod_on("mixed", &[], "");
    let env_only = pod
        .create_container("env", &[("NVIDIA_VISIBLE_DEVICES", "all")], &[])
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", plugin.log()));
    node.cri.start_container(&env_only).unwrap();
    assert_eq!(
        pod.main_process_env(&env_only, "NVIDIA_VISIBLE_DEVICES")
            .as_deref(),
        Some("void")
    );
    assert_eq!(node.holders(), Vec::<Value>::new(), "{}", plugin.log());

    let cdi = pod
        .create_container_with("cdi", &[], &[], &[], &["nvidia.com/gpu=1"])
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", plugin.log()));
    node.cri.start_container(&cdi).unwrap();
    let record = node.holder(&cdi);
    assert_eq!(uuids(&record).len(), 1, "{record:#}");
    assert_eq!(pod.gpu_nodes(&cdi), ["nvidia1"], "{}", plugin.log());
    assert_eq!(
        node.held_nodes(&cdi),
        ["nvidia1"],
        "the GPU it came with is its own"
    );

    // A GPU a DRA claim allocated: NVIDIA's DRA driver writes a CDI spec of kind
    // `k8s.gpu.nvidia.com/claim` per claim, and the kubelet passes its name in the CRI's
    // CDIDevices. The container is recognised by the node it came with: it holds exactly
    // that GPU and sees it, not stripped.
    let claimed = &gpus[3];
    let claim_spec = root
        .cdi_spec(std::slice::from_ref(claimed))
        .replace("kind: nvidia.com/gpu", "kind: k8s.gpu.nvidia.com/claim")
        .replace(
            &format!("- name: \"{}\"", claimed.index),
            "- name: 5bd3c1e0-gpu-0",
        );
    std::fs::write(
        cdi_dir(node.containerd.dir()).join("k8s.gpu.nvidia.com-claim_5bd3c1e0.yaml"),
        claim_spec,
    )
    .unwrap();
    let dra = pod
        .create_container_with(
            "dra",
            &[],
            &[],
            &[],
            &["k8s.gpu.nvidia.com/claim=5bd3c1e0-gpu-0"],
        )
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", plugin.log()));
    node.cri.start_container(&dra).unwrap();
    let record = node.holder(&dra);
    assert_eq!(
        uuids(&record),
        std::slice::from_ref(&claimed.uuid),
        "{record:#}"
    );
    let claimed_node = format!("nvidia{}", claimed.minor);
    assert_eq!(
        pod.gpu_nodes(&dra),
        std::slice::from_ref(&claimed_node),
        "{}",
        plugin.log()
    );
    assert_eq!(pod.visible_uuids(&dra), std::slice::from_ref(&claimed.uuid));

    // Its own request besides a GPU CDI gave it: NRI cannot take the node out; its device
    // cgroup denies it.
    let both = pod
        .create_container_with(
            "both",
            &[],
            &[],
            &[("gpupin.devices", "0")],
            &["nvidia.com/gpu=2"],
        )
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", plugin.log()));
    node.cri.start_container(&both).unwrap();
    assert_eq!(node.held_nodes(&both), ["nvidia0"]);
    assert_denied(&node, &both, 2);
    pod.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}

/// NVIDIA's own NRI plugin (the toolkit's, at its installer's index 10) beside gpupin's
/// (50): NVIDIA's injects the CDI devices a pod names in `nvidia.cdi.k8s.io/*` and
/// allocates nothing. NRI shows no plugin the CDI devices another adds, so gpupin's reads
/// the pod's annotation as NVIDIA's does: the container holds exactly that GPU, a second
/// pod naming the same GPU is refused with the holder's name, beside a request of the
/// container's own the GPU NVIDIA's plugin named is denied, and the same holds with
/// NVIDIA's plugin called after gpupin's.
#[test]
fn nvidias_nri_plugin_beside_gpupins_hands_out_only_what_the_ledger_holds() {
    let test = "nvidias_nri_plugin_beside_gpupins_hands_out_only_what_the_ledger_holds";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let Some(nvidia) = harness::required(test, nvidia_nri_binary()) else {
        return;
    };
    let (gpus, _root) = driver_with_cdi_spec(&node);
    let nvidias = node.start_nvidia_nri_plugin(&nvidia, 10, "nvidia-nri.log");
    let logs = || format!("gpupin's:\n{}\nNVIDIA's:\n{}", plugin.log(), nvidias.log());

    let first = node.run_pod_on(
        "first",
        &[("nvidia.cdi.k8s.io/container.main", "nvidia.com/gpu=1")],
        "",
    );
    let main = first
        .create_container("main", &[], &[])
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", logs()));
    node.cri.start_container(&main).unwrap();
    assert!(
        nvidias
            .log()
            .contains("injecting CDI devices [nvidia.com/gpu=1]"),
        "{}",
        logs()
    );
    let record = node.holder(&main);
    assert_eq!(uuids(&record), [gpus[1].uuid.clone()], "{record:#}");
    let node1 = format!("nvidia{}", gpus[1].minor);
    assert_eq!(
        first.gpu_nodes(&main),
        std::slice::from_ref(&node1),
        "{}",
        logs()
    );
    assert_eq!(node.held_nodes(&main), [node1]);

    let second = node.run_pod_on(
        "second",
        &[("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=1")],
        "",
    );
    let err = second.create_container("main", &[], &[]).unwrap_err();
    let message = err.message();
    assert!(
        message.contains("gpupin: ") && message.contains("held by"),
        "{message}\n{}",
        logs()
    );

    let third = node.run_pod_on(
        "third",
        &[
            ("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=2"),
            ("gpupin.devices", "0"),
        ],
        "",
    );
    let both = third
        .create_container("main", &[], &[])
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", logs()));
    node.cri.start_container(&both).unwrap();
    assert_eq!(node.held_nodes(&both), [format!("nvidia{}", gpus[0].minor)]);
    assert_denied(&node, &both, gpus[2].minor);

    // NVIDIA's plugin called after gpupin's (index 90): the same.
    drop(nvidias);
    let nvidias = node.start_nvidia_nri_plugin(&nvidia, 90, "nvidia-nri-90.log");
    let fourth = node.run_pod_on(
        "fourth",
        &[("nvidia.cdi.k8s.io/pod", "nvidia.com/gpu=3")],
        "",
    );
    let late = fourth
        .create_container("main", &[], &[])
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", nvidias.log()));
    node.cri.start_container(&late).unwrap();
    let node3 = format!("nvidia{}", gpus[3].minor);
    assert_eq!(
        fourth.gpu_nodes(&late),
        std::slice::from_ref(&node3),
        "{}",
        nvidias.log()
    );
    assert_eq!(node.held_nodes(&late), [node3]);
    first.stop();
    third.stop();
    fourth.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}

/// The pre-installed form (k8s/nri/50-gpupin in NRI's plugin dir): containerd starts
/// gpupin itself, with a socket of its own, and a pod's container gets its GPUs.
#[test]
fn a_plugin_containerd_starts_itself_gives_a_pod_its_gpus() {
    let test = "a_plugin_containerd_starts_itself_gives_a_pod_its_gpus";
    if !is_v2() {
        harness::say(&format!(
            "{test}: containerd 1.x has no NRI; this runs on containerd 2.x (GPUPIN_ENGINES=modern)"
        ));
        return;
    }
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/nri/50-gpupin");
    let script = std::fs::read_to_string(shipped).unwrap();
    let installed = "exec /usr/local/bin/gpupin nri";
    assert!(script.contains(installed), "{shipped}: {script}");
    let gpupin = harness::binary(env!("CARGO_BIN_EXE_gpupin"));
    let log = std::sync::OnceLock::new();
    let Some(node) = Node::start_with_nri(test, |plugins| {
        // The test's gpupin and config; its log beside, since containerd keeps none.
        let config = plugins.parent().unwrap().join("gpupin.toml");
        let out = plugins.parent().unwrap().join("gpupin-nri.log");
        let ours = format!(
            "GPUPIN_LOG=info exec {} --config {} nri 2>>{}",
            gpupin.display(),
            config.display(),
            out.display()
        );
        let path = plugins.join("50-gpupin");
        std::fs::write(&path, script.replace(installed, &ours)).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        log.set(out).unwrap();
    }) else {
        return;
    };
    let log = log.get().unwrap();
    let started = Instant::now();
    let text = || std::fs::read_to_string(log).unwrap_or_default();
    while !text().contains("configured") {
        assert!(
            started.elapsed() < READY_WAIT,
            "containerd did not start gpupin nri: {}\n{}",
            text(),
            node.containerd.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pod = node.run_pod_on("trainer", &[("gpupin.count", "1")], "");
    let trainer = pod.start_container("trainer", &[], &[]);
    assert_eq!(
        pod.gpu_nodes(&trainer),
        node.held_nodes(&trainer),
        "{}",
        text()
    );
    assert_eq!(node.held_nodes(&trainer).len(), 1);
    pod.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}

/// Fifty pods created at once, each asking for a GPU of the node's eight: eight are
/// created, each with a GPU of its own; the others are refused with gpupin's line and
/// hold nothing.
#[test]
fn fifty_pods_at_once_never_get_a_gpu_twice() {
    let test = "fifty_pods_at_once_never_get_a_gpu_twice";
    let Some((node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let socket = node.containerd.socket.clone();
    let created: Vec<(String, Result<String, String>)> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..50)
            .map(|n| {
                let socket = &socket;
                scope.spawn(move || {
                    let cri = Cri::new(socket);
                    let sandbox = sandbox_config(&format!("p{n}"), &[("gpupin.count", "1")]);
                    let pod = cri.run_pod_sandbox(&sandbox, "").unwrap();
                    let config = container_config("main", &[], &[], &[], &[]);
                    let container = cri
                        .create_container(&pod, config, &sandbox)
                        .map_err(|e| e.message().to_string());
                    (pod, container)
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let ids: Vec<&String> = created
        .iter()
        .filter_map(|(_, c)| c.as_ref().ok())
        .collect();
    assert_eq!(ids.len(), 8, "{created:#?}\n{}", plugin.log());
    for (_, refused) in created.iter().filter(|(_, c)| c.is_err()) {
        let line = refused.as_ref().unwrap_err();
        assert!(line.contains("gpupin: "), "{line}");
    }
    let all = node.holders();
    assert_eq!(all.len(), 8, "{all:#?}");
    let mut gpus: Vec<String> = all.iter().flat_map(uuids).collect();
    gpus.sort();
    gpus.dedup();
    assert_eq!(gpus.len(), 8, "a GPU handed out twice: {all:#?}");
    for id in ids {
        assert!(all.iter().any(|h| &h["id"] == id), "{id} holds nothing");
    }
    for (pod, _) in &created {
        node.cri.stop_pod_sandbox(pod).unwrap();
        node.cri.remove_pod_sandbox(pod).unwrap();
    }
    // Containers created and never started: removed with their pods, released then.
    assert_eq!(
        node.holders(),
        Vec::<Value>::new(),
        "after RemovePodSandbox"
    );
}

/// containerd restarted under a running pod: `gpupin nri` connects again by itself, the
/// running container keeps its GPUs (Synchronize lists it), and the next pod gets others
/// through the plugin.
#[test]
fn the_plugin_connects_again_when_containerd_restarts() {
    let test = "the_plugin_connects_again_when_containerd_restarts";
    let Some((mut node, plugin)) = node_with_plugin(test) else {
        return;
    };
    let pod_id = {
        let pod = node.run_pod_on("trainer", &[("gpupin.count", "4")], "");
        let trainer = pod.start_container("trainer", &[], &[]);
        let id = pod.id.clone();
        // Stopped by hand below: containerd is restarted meanwhile, which needs the
        // node back from the pod's borrow.
        std::mem::forget(pod);
        (id, trainer)
    };
    let before = uuids(&node.holder(&pod_id.1));
    node.containerd.restart();
    // The CRI client's connection went with containerd: a new one.
    node.cri = Cri::new(&node.containerd.socket);
    let started = Instant::now();
    while plugin.log().matches("configured").count() < 2 {
        assert!(
            started.elapsed() < READY_WAIT,
            "gpupin nri did not connect again: {}",
            plugin.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let other = node.run_pod_on("eval", &[("gpupin.count", "4")], "");
    let eval = other.start_container("eval", &[], &[]);
    assert_eq!(uuids(&node.holder(&pod_id.1)), before, "{}", plugin.log());
    let second = uuids(&node.holder(&eval));
    assert_eq!(second.len(), 4, "{}", plugin.log());
    assert!(
        second.iter().all(|g| !before.contains(g)),
        "{before:?} {second:?}"
    );
    other.stop();
    node.cri.stop_pod_sandbox(&pod_id.0).unwrap();
    node.cri.remove_pod_sandbox(&pod_id.0).unwrap();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}

/// `driver = "cdi"` under NRI: the adjustment names the GPU's CDI device, and containerd
/// applies the driver's CDI spec itself (its nodes, mounts, hooks): the container has the
/// driver's files and exactly its GPU.
#[test]
fn under_driver_cdi_containerd_applies_the_gpus_cdi_device_by_name() {
    let test = "under_driver_cdi_containerd_applies_the_gpus_cdi_device_by_name";
    if !is_v2() {
        harness::say(&format!(
            "{test}: containerd 1.x has no NRI; this runs on containerd 2.x (GPUPIN_ENGINES=modern)"
        ));
        return;
    }
    let Some(node) = Node::start_with_nri(test, |_| {}) else {
        return;
    };
    let (_, _root) = driver_with_cdi_spec(&node);
    // gpupin's config: the driver from that spec, by name.
    let config = &node.containerd.gpupin.config;
    let mut text = std::fs::read_to_string(config).unwrap();
    text.push_str(&format!(
        "driver = \"cdi\"\ncdi_spec_dirs = [{:?}]\n",
        cdi_dir(node.containerd.dir())
    ));
    std::fs::write(config, text).unwrap();
    let plugin = node.start_nri_plugin("gpupin-nri.log");

    let pod = node.run_pod_on("trainer", &[("gpupin.count", "1")], "");
    let trainer = pod.start_container("trainer", &[], &[]);
    assert_eq!(
        pod.gpu_nodes(&trainer),
        node.held_nodes(&trainer),
        "{}",
        plugin.log()
    );
    assert_eq!(node.held_nodes(&trainer).len(), 1);
    // Named, not copied: containerd applied the spec.
    assert!(
        plugin.log().contains("cdi_devices=[\"nvidia.com/gpu="),
        "{}",
        plugin.log()
    );
    // The spec's mounts: the driver's nvidia-smi, from the fake driver root.
    pod.exec(&trainer, &["ls", "/usr/bin/nvidia-smi"]);
    assert_eq!(
        pod.main_process_env(&trainer, "NVIDIA_VISIBLE_DEVICES")
            .as_deref(),
        Some("void")
    );
    pod.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
}
