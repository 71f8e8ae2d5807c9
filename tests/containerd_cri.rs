//! Kubernetes' way in, without a kubelet: a private containerd 1.6 with its CRI plugin
//! and the runtime handler `gpupin` (k8s/containerd/gpupin-v2.toml), driven over the CRI
//! as the kubelet drives it (RunPodSandbox, CreateContainer, StartContainer, ExecSync,
//! StopPodSandbox, RemovePodSandbox). A pod annotated `gpupin.count` holds exactly its
//! request per container and its sandbox (pause) container nothing; `gpupin.containers`
//! names the containers the request is for; a container that exits releases its GPUs;
//! stopping and removing the pod releases everything. Root, containerd, ctr, runc, tar
//! and busybox-static are needed; elsewhere each test says why it skips (under CI=true
//! it fails instead).

mod containerd_support;
mod cri_support;

use cri_support::{Node, Pod, uuids};
use serde_json::Value;
use std::time::{Duration, Instant};

/// How long containerd may take to delete an exited container's task (a readiness wait).
const RELEASE_WAIT: Duration = Duration::from_secs(60);

/// Stops and removes the pod, as deleting it does; nothing is held after either.
fn released(pod: Pod, node: &Node) {
    pod.stop();
    assert_eq!(node.holders(), Vec::<Value>::new(), "after StopPodSandbox");
    pod.remove();
    assert_eq!(
        node.holders(),
        Vec::<Value>::new(),
        "after RemovePodSandbox"
    );
}

#[test]
fn a_pod_holds_exactly_its_request_and_its_sandbox_nothing() {
    let Some(node) = Node::start("a_pod_holds_exactly_its_request_and_its_sandbox_nothing") else {
        return;
    };
    let pod = node.run_pod("trainer", &[("gpupin.count", "2")]);
    // The sandbox got the pod's annotation too (pod_annotations), and asked for nothing.
    assert_eq!(node.holders(), Vec::<Value>::new(), "with the sandbox only");

    let trainer = pod.start_container("trainer", &[], &[]);
    let all = node.holders();
    assert_eq!(all.len(), 1, "one holder, the container: {all:#?}");
    let record = node.holder(&trainer);
    assert_eq!(uuids(&record).len(), 2, "{record:#}");
    assert_eq!(record["container"]["engine"], "containerd", "{record:#}");
    assert_eq!(
        record["container"]["name"], "default/trainer/trainer",
        "{record:#}"
    );
    assert_eq!(
        record["container"]["image"],
        cri_support::IMAGE,
        "{record:#}"
    );
    assert!(!all.iter().any(|h| h["id"] == pod.id.as_str()));

    // What the container sees: exactly its GPUs' nodes, and their UUIDs in its own
    // process's env. A process exec'd into it (`kubectl exec`) sees the same nodes, but
    // its env comes from containerd's stored spec, which gpupin-runtime never edits.
    assert_eq!(pod.gpu_nodes(&trainer), node.held_nodes(&trainer));
    assert_eq!(pod.visible_uuids(&trainer), uuids(&record));
    let exec_env = pod.exec(&trainer, &["env"]);
    assert!(
        !exec_env.contains("NVIDIA_VISIBLE_DEVICES="),
        "an exec'd process got NVIDIA_VISIBLE_DEVICES: update docs/integrations.md (Kubernetes)\n{exec_env}"
    );

    released(pod, &node);
}

#[test]
fn gpupin_containers_gives_a_pod_request_to_the_named_containers_only() {
    let Some(node) =
        Node::start("gpupin_containers_gives_a_pod_request_to_the_named_containers_only")
    else {
        return;
    };
    let pod = node.run_pod(
        "job",
        &[("gpupin.count", "1"), ("gpupin.containers", "trainer")],
    );
    let trainer = pod.start_container("trainer", &[], &[]);
    let sidecar = pod.start_container("sidecar", &[], &[]);
    // A container the pod's request is not for may still ask in its own env.
    let eval = pod.start_container("eval", &[("GPUPIN_COUNT", "2")], &[]);
    let all = node.holders();
    assert_eq!(all.len(), 2, "the trainer and eval hold: {all:#?}");
    let record = node.holder(&trainer);
    assert_eq!(uuids(&record).len(), 1, "{record:#}");
    assert_eq!(record["container"]["name"], "default/job/trainer");
    assert_eq!(pod.gpu_nodes(&trainer), node.held_nodes(&trainer));
    let record = node.holder(&eval);
    assert_eq!(uuids(&record).len(), 2, "{record:#}");
    assert_eq!(record["request"]["origin"], "env", "{record:#}");
    assert_eq!(pod.gpu_nodes(&eval), node.held_nodes(&eval));
    assert_eq!(pod.gpu_nodes(&sidecar), Vec::<String>::new());
    released(pod, &node);
}

#[test]
fn a_pod_asking_for_more_than_the_machine_fails_to_start_with_gpupins_reason() {
    let Some(node) =
        Node::start("a_pod_asking_for_more_than_the_machine_fails_to_start_with_gpupins_reason")
    else {
        return;
    };
    let pod = node.run_pod("greedy", &[("gpupin.count", "9")]);
    // containerd makes the task (runc create, so gpupin-runtime) at StartContainer.
    let id = pod
        .create_container("trainer", &[], &[])
        .expect("CreateContainer");
    let err = node
        .cri
        .start_container(&id)
        .expect_err("StartContainer of 9 GPUs on 8");
    assert!(
        err.message()
            .contains("gpupin: count 9 is more than the 8 GPUs of this machine"),
        "{err}"
    );
    assert_eq!(node.holders(), Vec::<Value>::new());
    released(pod, &node);
}

#[test]
fn a_container_that_exits_releases_its_gpus_while_its_pod_lives() {
    let Some(node) = Node::start("a_container_that_exits_releases_its_gpus_while_its_pod_lives")
    else {
        return;
    };
    // A Job's or an init container's way: the command ends, the pod stays.
    let pod = node.run_pod("batch", &[("gpupin.count", "1")]);
    let once = pod.start_container("once", &[], &["ls", "/dev"]);
    // containerd deletes the task of a container that exited (runc delete, so
    // gpupin-runtime delete): a readiness wait for that event.
    let started = Instant::now();
    while !node.holders().is_empty() {
        assert!(
            started.elapsed() < RELEASE_WAIT,
            "still held after the container exited: {:#?}",
            node.holders()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // It did hold its GPU while it ran: the audit log has both ends. The release's line
    // follows the record's removal (both under the ledger's lock, which this reader
    // does not take): wait for it as a reader of `gpupin log` would.
    let logged = |audit: &str, event: &str| {
        audit.lines().any(|l| {
            let line: Value = serde_json::from_str(l).unwrap();
            line["event"] == event && line["holder"] == once.as_str()
        })
    };
    let read =
        || std::fs::read_to_string(node.containerd.gpupin.state_dir.join("audit.log")).unwrap();
    let started = Instant::now();
    while !logged(&read(), "release") && started.elapsed() < RELEASE_WAIT {
        std::thread::sleep(Duration::from_millis(100));
    }
    let audit = read();
    for event in ["allocate", "release"] {
        assert!(logged(&audit, event), "no {event} line for {once}: {audit}");
    }
    released(pod, &node);
}
