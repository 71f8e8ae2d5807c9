//! A real kubelet's pods through `gpupin nri`: the kubelet (k8s.io/kubernetes cmd/kubelet
//! from the peers' cache) in standalone mode on a private containerd 2.x with NRI on and
//! gpupin's plugin connected; a static pod annotated `gpupin.count`, with no RuntimeClass
//! and no resource limits, runs with exactly its GPUs (what its process sees, what `gpupin
//! status` records), and deleting it gives them back.
//!
//! NRI is containerd 2.x's: this runs in the modern pass (`GPUPIN_ENGINES=modern`); on
//! Debian's containerd 1.6 it says so and passes without running. Root, containerd, runc,
//! busybox-static and the built kubelet are needed; elsewhere the test says why it skips
//! (under CI=true it fails instead).

mod containerd_support;
mod cri_support;
mod kubelet_support;

use cri_support::{Node, uuids};
use gpupin_sandbox::harness::{self, gpu_nodes};
use kubelet_support::cri::{self, CONTAINER_NAME, CONTAINER_RUNNING};
use kubelet_support::{
    HostChanges, Kubelet, kubelet_binary, plugin_dir_free, static_pod, wait_for,
};
use serde_json::Value;

#[test]
fn a_real_kubelets_pod_gets_its_gpus_through_nri_without_a_runtime_class() {
    let test = "a_real_kubelets_pod_gets_its_gpus_through_nri_without_a_runtime_class";
    if !containerd_support::is_v2() {
        println!(
            "{test}: containerd 1.x has no NRI; this runs on containerd 2.x (GPUPIN_ENGINES=modern)"
        );
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
    let kubelet = Kubelet::start(&kubelet_bin, &node, &dir);

    kubelet.add_annotated_pod("trainer", &[("gpupin.count", "2")]);
    let pod = static_pod("trainer");
    let container = wait_for(
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
    );
    let record = node.holder(&container);
    assert_eq!(record["source"], "nri", "{record:#}\n{}", plugin.log());
    assert_eq!(
        record["container"]["name"],
        format!("default/{pod}/main"),
        "{record:#}"
    );
    let gpus = uuids(&record);
    assert_eq!(gpus.len(), 2, "{record:#}");

    // What its process sees: exactly those GPUs.
    let exec = |cmd: &[&str]| {
        let out = node.cri.exec_sync(&container, cmd).unwrap();
        assert_eq!(out.exit_code, 0, "{cmd:?}: {}", harness::text(&out.stderr));
        harness::text(&out.stdout)
    };
    let mut inside = gpu_nodes(exec(&["ls", "/dev"]).split_whitespace());
    inside.sort();
    assert_eq!(inside, node.held_nodes(&container));
    let environ = exec(&["cat", "/proc/1/environ"]);
    let visible = environ
        .split('\0')
        .find_map(|v| v.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .expect("NVIDIA_VISIBLE_DEVICES in the container's env");
    let mut visible: Vec<String> = visible.split(',').map(str::to_string).collect();
    visible.sort();
    assert_eq!(visible, gpus);

    // Deleting the pod gives them back.
    kubelet.remove_pod("trainer");
    wait_for(
        "release of the pod's GPUs",
        || node.holders().is_empty().then_some(()),
        || format!("{}\n{}", kubelet.tail(), plugin.log()),
    );
}
