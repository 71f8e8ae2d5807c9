//! containerd's own CDI injection under the `gpupin` runtime handler: containerd 2.x
//! resolves a container's CDI devices (the CRI's CDIDevices field, which the kubelet
//! fills from a device plugin's answer, and `cdi.k8s.io/*` container annotations) from
//! its CDI spec dirs into the spec (`enable_cdi`, on by default), before the runc shim
//! runs gpupin-runtime. What gpupin must hold: no GPU reaches a container around the
//! ledger. A container without a gpupin request gets GPUs of gpupin's choice for the
//! CDI devices it named (never one another container holds); one with a request gets its
//! request and nothing of what CDI added; a pod-level `cdi.k8s.io/*` annotation reaches
//! no container (containerd reads CDI names from the container's config only).
//!
//! The spec is the fake driver root's (`harness::driver`, in nvidia-ctk's form, on the
//! simulated 8-GPU machine), in the CDI spec dir of the CRI suite's containerd 2.x config.
//! On Debian's containerd 1.6, which has no CDI, the same checks hold with nothing
//! injected (the CDI fields are unknown to it); the modern pass (`GPUPIN_ENGINES=modern`)
//! is where they bite. Root, containerd, ctr, runc, tar and busybox-static are needed;
//! elsewhere each test says why it skips (under CI=true it fails instead).

mod containerd_support;
mod cri_support;

use cri_support::{Node, Pod, cdi_dir};
use gpupin_sandbox::harness::driver::{DriverRoot, FakeGpu};
use serde_json::Value;

/// Writes the CDI spec of the node's simulated GPUs (`nvidia.com/gpu=0..7`, by UUID and
/// `all`) where containerd 2.x's CRI reads specs; the GPUs.
fn with_cdi_spec(node: &Node) -> Vec<FakeGpu> {
    let gpus = FakeGpu::from_status(&node.status());
    let dir = node.containerd.dir();
    let root = DriverRoot::create(&dir.join("driver"), &gpus).unwrap();
    std::fs::create_dir_all(cdi_dir(dir)).unwrap();
    root.write_cdi_spec(&cdi_dir(dir), &gpus).unwrap();
    gpus
}

/// Creates and starts a container with these CDI devices and annotations.
fn start_with_cdi(
    node: &Node,
    pod: &Pod,
    name: &str,
    annotations: &[(&str, &str)],
    cdi: &[&str],
) -> String {
    let log = || node.containerd.log();
    let id = pod
        .create_container_with(name, &[], &[], annotations, cdi)
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", log()));
    node.cri
        .start_container(&id)
        .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", log()));
    id
}

#[test]
fn cdi_devices_of_a_container_without_a_request_become_gpupins_choice() {
    let test = "cdi_devices_of_a_container_without_a_request_become_gpupins_choice";
    let Some(node) = Node::start(test) else {
        return;
    };
    with_cdi_spec(&node);
    // GPU 0 is held by another pod's container.
    let other = node.run_pod("other", &[("gpupin.devices", "0")]);
    let holder = other.start_container("holder", &[], &[]);
    assert_eq!(node.held_nodes(&holder), ["nvidia0"]);

    let pod = node.run_pod("cdi", &[]);
    // The kubelet's way (a device plugin's CDI devices) and the annotation way, both
    // naming the GPU another container holds.
    let by_field = start_with_cdi(&node, &pod, "field", &[], &["nvidia.com/gpu=0"]);
    let by_annotation = start_with_cdi(
        &node,
        &pod,
        "annotated",
        &[("cdi.k8s.io/gpus", "nvidia.com/gpu=0")],
        &[],
    );
    for id in [&by_field, &by_annotation] {
        let inside = pod.gpu_nodes(id);
        let held = node.held_nodes(id);
        assert_eq!(inside, held, "what {id} sees is what the ledger gives it");
        assert!(!inside.contains(&"nvidia0".to_string()), "{inside:?}");
        if containerd_support::is_v2() {
            // containerd 2.x injected GPU 0; gpupin made it a request for one GPU.
            assert_eq!(held.len(), 1, "{:#?}", node.holders());
        }
    }
    if containerd_support::is_v2() {
        assert_ne!(node.held_nodes(&by_field), node.held_nodes(&by_annotation));
    }
    // Deleting the pod releases what its containers were given for their CDI devices.
    pod.stop();
    pod.remove();
    let left: Vec<String> = node
        .holders()
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(left, [holder]);
}

#[test]
fn cdi_devices_beside_a_request_give_way_to_gpupins_choice() {
    let test = "cdi_devices_beside_a_request_give_way_to_gpupins_choice";
    let Some(node) = Node::start(test) else {
        return;
    };
    with_cdi_spec(&node);
    let other = node.run_pod("other", &[("gpupin.devices", "0,1")]);
    let holder = other.start_container("holder", &[], &[]);
    assert_eq!(node.held_nodes(&holder), ["nvidia0", "nvidia1"]);

    let pod = node.run_pod("asks", &[("gpupin.count", "1")]);
    let id = start_with_cdi(&node, &pod, "trainer", &[], &["nvidia.com/gpu=all"]);
    let held = node.held_nodes(&id);
    assert_eq!(held.len(), 1, "{:#?}", node.holders());
    assert_eq!(
        pod.gpu_nodes(&id),
        held,
        "only gpupin's choice is in the container"
    );
}

#[test]
fn a_pod_cdi_annotation_reaches_no_container() {
    let test = "a_pod_cdi_annotation_reaches_no_container";
    let Some(node) = Node::start(test) else {
        return;
    };
    with_cdi_spec(&node);
    let pod = node.run_pod("podlevel", &[("cdi.k8s.io/gpus", "nvidia.com/gpu=all")]);
    let id = pod.start_container("worker", &[], &[]);
    assert_eq!(pod.gpu_nodes(&id), Vec::<String>::new());
    assert_eq!(node.holders(), Vec::<Value>::new());
}
