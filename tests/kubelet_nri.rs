//! A real kubelet's pods through `gpupin nri`: the kubelet (k8s.io/kubernetes cmd/kubelet
//! from the peers' cache) in standalone mode on a private containerd 2.x with NRI on and
//! gpupin's plugin connected; a static pod annotated `gpupin.count`, with no RuntimeClass
//! and no resource limits, runs with exactly its GPUs (what its process sees, what `gpupin
//! status` records), and deleting it gives them back. Then gpupin's device plugin beside
//! it: a pod asking for `gpupin.io/gpu` in its limits reaches the NRI plugin with the
//! GPUs the kubelet allocated, and is held within the device plugin's holder, exactly
//! those GPUs, not stripped.
//!
//! NRI is containerd 2.x's: this runs in the modern pass (`GPUPIN_ENGINES=modern`); on
//! Debian's containerd 1.6 it says so and passes without running. Root, containerd, runc,
//! busybox-static and the built kubelet are needed; elsewhere the test says why it skips
//! (under CI=true it fails instead).

mod containerd_support;
mod cri_support;
mod kubelet_support;

use cri_support::{Node, NriPlugin, uuids};
use gpupin_sandbox::harness::{self, gpu_nodes};
use kubelet_support::cri::{self, CONTAINER_NAME, CONTAINER_RUNNING};
use kubelet_support::{
    DevicePlugin, HostChanges, Kubelet, PodResources, SandboxSweep, kubelet_binary,
    plugin_dir_free, static_pod, wait_for,
};
use serde_json::Value;
use std::time::Duration;

#[test]
fn a_real_kubelets_pod_gets_its_gpus_through_nri_without_a_runtime_class() {
    let test = "a_real_kubelets_pod_gets_its_gpus_through_nri_without_a_runtime_class";
    if !containerd_support::is_v2() {
        harness::say(&format!(
            "{test}: containerd 1.x has no NRI; this runs on containerd 2.x (GPUPIN_ENGINES=modern)"
        ));
        return;
    }
    let Some(kubelet_bin) = harness::required(test, kubelet_binary()) else {
        return;
    };
    if !harness::need_root(test) || harness::required(test, plugin_dir_free()).is_none() {
        return;
    }
    let Some(node) = Node::start_with_nri(test, |_| {}) else {
        return;
    };
    let plugin = node.start_nri_plugin("gpupin-nri.log");
    let dir = node.containerd.dir().to_path_buf();
    let inventory: Value = serde_json::from_str(&harness::stdout(
        &node.containerd.gpupin.run(&["inventory", "--json"], ""),
    ))
    .unwrap();
    let _host = HostChanges::prepare(&inventory);
    let _sweep = SandboxSweep(&node);
    let mut kubelet = Kubelet::start(&kubelet_bin, &node, &dir);

    // A pod annotated for gpupin, no RuntimeClass, no limits.
    kubelet.add_annotated_pod("trainer", &[("gpupin.count", "2")]);
    let container = running_main(&node, &kubelet, &plugin, "trainer");
    let record = node.holder(&container);
    assert_eq!(record["source"], "nri", "{record:#}\n{}", plugin.log());
    assert_eq!(
        record["container"]["name"],
        format!("default/{}/main", static_pod("trainer")),
        "{record:#}"
    );
    let gpus = uuids(&record);
    assert_eq!(gpus.len(), 2, "{record:#}");
    assert_eq!(sees(&node, &container), (node.held_nodes(&container), gpus));

    // Deleting the pod gives them back.
    kubelet.remove_pod("trainer");
    wait_for(
        "release of the pod's GPUs",
        || node.holders().is_empty().then_some(()),
        || format!("{}\n{}", kubelet.tail(), plugin.log()),
    );

    // gpupin's device plugin beside it: a pod asking for `gpupin.io/gpu: 2` in its limits
    // gets the GPUs the kubelet allocated (the device plugin's holder, source
    // device-plugin) and its container reaches gpupin's NRI plugin with their nodes and
    // the holder's GPUPIN_WITHIN: it is recognised, held within that holder, not stripped.
    let mut device_plugin = DevicePlugin::start(
        &node.containerd.gpupin.config,
        &kubelet.pod_resources_socket(),
        dir.join("device-plugin.log"),
        Duration::from_secs(10),
    );
    kubelet.wait("registration of the device plugin", |k| {
        k.metric("kubelet_device_plugin_registration_total") >= 1.0
    });
    let pods = PodResources::new(&kubelet.pod_resources_socket());
    let every_gpu = inventory["gpus"].as_array().unwrap().len();
    wait_for(
        "the device plugin's GPUs allocatable",
        || (pods.allocatable().len() == every_gpu).then_some(()),
        || format!("{}\n{}", kubelet.tail(), device_plugin.log()),
    );
    kubelet.add_pod("served", 2);
    let container = running_main(&node, &kubelet, &plugin, "served");
    let nested = node.holder(&container);
    assert_eq!(nested["source"], "nri", "{nested:#}\n{}", plugin.log());
    let parent_id = nested["request"]["within"]
        .as_str()
        .unwrap_or_else(|| panic!("not within the device plugin's holder: {nested:#}"))
        .to_string();
    let parent = node.holder(&parent_id);
    assert_eq!(parent["source"], "device-plugin", "{parent:#}");
    let given = uuids(&parent);
    assert_eq!(given.len(), 2, "{parent:#}");
    assert_eq!(uuids(&nested), given, "{nested:#}");
    assert_eq!(
        sees(&node, &container),
        (node.held_nodes(&parent_id), given)
    );
    kubelet.remove_pod("served");
    wait_for(
        "release of the served pod's container",
        || (!node.holders().iter().any(|h| h["id"] == container.as_str())).then_some(()),
        || format!("{}\n{}", kubelet.tail(), plugin.log()),
    );
    let exit = device_plugin.stop();
    assert!(exit.success(), "{exit}; log:\n{}", device_plugin.log());
}

/// The running `main` container of static pod `name`: its CRI id.
fn running_main(node: &Node, kubelet: &Kubelet, plugin: &NriPlugin, name: &str) -> String {
    let pod = static_pod(name);
    wait_for(
        &format!("running container of {pod}"),
        || {
            cri::containers_of(&node.cri, &pod)
                .into_iter()
                .find(|c| {
                    c.state == CONTAINER_RUNNING
                        && c.labels.get(CONTAINER_NAME).is_some_and(|n| n == "main")
                })
                .map(|c| c.id)
        },
        || format!("{}\n{}", kubelet.tail(), plugin.log()),
    )
}

/// What a container's process sees: the GPU nodes under its /dev and the UUIDs in its
/// `NVIDIA_VISIBLE_DEVICES`, each sorted.
fn sees(node: &Node, container: &str) -> (Vec<String>, Vec<String>) {
    let exec = |cmd: &[&str]| {
        let out = node.cri.exec_sync(container, cmd).unwrap();
        assert_eq!(out.exit_code, 0, "{cmd:?}: {}", harness::text(&out.stderr));
        harness::text(&out.stdout)
    };
    let mut inside = gpu_nodes(exec(&["ls", "/dev"]).split_whitespace());
    inside.sort();
    let environ = exec(&["cat", "/proc/1/environ"]);
    let visible = environ
        .split('\0')
        .find_map(|v| v.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .expect("NVIDIA_VISIBLE_DEVICES in the container's env");
    let mut visible: Vec<String> = visible.split(',').map(str::to_string).collect();
    visible.sort();
    (inside, visible)
}
