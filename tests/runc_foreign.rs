//! GPUs that reach a plain runc container around gpupin (issue 10, part 3): gpupin's
//! prestart hook runs after runc has made the container's nodes and cgroup, so it refuses
//! a container that brought another GPU's node beside a request (nothing held), records
//! the GPUs of one without a request (or refuses it when they are held), and voids
//! `NVIDIA_VISIBLE_DEVICES` in the bundle of a container without a request, for NVIDIA's
//! hook that reads it later. Real runc on a busybox rootfs, a simulated 8-GPU machine.
//! Needs root and runc.

use gpupin_sandbox::harness::{GPU_MAJOR, Sandbox};
use gpupin_sandbox::hook_message;
use serde_json::{Value, json};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// Writes `config` as `id`'s bundle and runs it detached, as `Sandbox::start` does.
fn start(
    sb: &Sandbox,
    id: &str,
    config: &Value,
) -> Result<gpupin_sandbox::Container, gpupin_sandbox::SandboxError> {
    let bundle = sb.bundle_dir(id);
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    sb.runc.run_detached(id, &bundle)
}

/// `config` with the nodes and allow rules of GPUs `minors`, as CDI or `--device` put them.
fn with_gpu_nodes(mut config: Value, minors: &[u32]) -> Value {
    let nodes: Vec<Value> = minors
        .iter()
        .map(|m| json!({"path": format!("/dev/nvidia{m}"), "type": "c", "major": GPU_MAJOR, "minor": m}))
        .collect();
    let rules = nodes.iter().map(
        |n| json!({"allow": true, "type": "c", "major": GPU_MAJOR, "minor": n["minor"], "access": "rwm"}),
    );
    config["linux"]["devices"] = json!(nodes);
    config["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .extend(rules);
    config
}

#[test]
fn gpu_nodes_without_a_request_are_recorded_or_refused_when_held() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "gpu_nodes_without_a_request_are_recorded_or_refused_when_held",
    ) else {
        return;
    };
    let id = sb.id("devices");
    let c = start(&sb, &id, &with_gpu_nodes(sb.spec().to_config(), &[2, 5])).unwrap();
    assert_eq!(
        sb.gpupin.held_minors(&id),
        [2, 5],
        "{:#}",
        sb.gpupin.status()
    );
    let second = sb.id("same-gpu");
    let err = match start(&sb, &second, &with_gpu_nodes(sb.spec().to_config(), &[5])) {
        Ok(c) => panic!("container {} started on a GPU another holds", c.id()),
        Err(err) => err.to_string(),
    };
    let message = hook_message(&err).unwrap_or_else(|| panic!("no gpupin message: {err}"));
    assert!(message.contains("cannot allocate GPU 5"), "{message}");
    assert!(sb.gpupin.holder(&second).is_none());
    c.stop().unwrap();
    assert!(sb.gpupin.holder(&id).is_none(), "released at poststop");
}

#[test]
fn a_container_with_every_gpus_node_and_a_request_is_refused_holding_nothing() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "a_container_with_every_gpus_node_and_a_request_is_refused_holding_nothing",
    ) else {
        return;
    };
    let id = sb.id("cdi-all");
    let mut config = sb.spec().annotation("gpupin.count", "1").to_config();
    // What CDI's nvidia.com/gpu=all puts into a spec: every GPU's node and allow rule.
    let nodes: Vec<Value> = (0..8)
        .map(|m| json!({"path": format!("/dev/nvidia{m}"), "type": "c", "major": GPU_MAJOR, "minor": m}))
        .collect();
    let rules = nodes
        .iter()
        .map(|n| json!({"allow": true, "type": "c", "major": GPU_MAJOR, "minor": n["minor"], "access": "rwm"}));
    config["linux"]["devices"] = json!(nodes);
    config["linux"]["resources"]["devices"]
        .as_array_mut()
        .unwrap()
        .extend(rules);
    let err = match start(&sb, &id, &config) {
        Ok(c) => panic!(
            "container {} started beside 7 GPUs it was not given",
            c.id()
        ),
        Err(err) => err.to_string(),
    };
    let message = hook_message(&err).unwrap_or_else(|| panic!("no gpupin message: {err}"));
    assert!(
        message.contains("the container already has GPU node \"/dev/nvidia")
            && message.contains("which gpupin did not choose"),
        "{message}"
    );
    assert!(sb.gpupin.holder(&id).is_none());
    assert_eq!(sb.gpupin.status()["free"], 8);
}

#[test]
fn nvidia_visible_devices_all_without_a_request_is_voided_in_the_bundle() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "nvidia_visible_devices_all_without_a_request_is_voided_in_the_bundle",
    ) else {
        return;
    };
    let id = sb.id("cuda-image");
    let config = sb.spec().env("NVIDIA_VISIBLE_DEVICES", "all").to_config();
    let c = start(&sb, &id, &config).unwrap();
    let bundle = std::fs::read_to_string(sb.bundle_dir(&id).join("config.json")).unwrap();
    let bundle: Value = serde_json::from_str(&bundle).unwrap();
    let visible: Vec<&str> = bundle["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|e| e.starts_with("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert_eq!(visible, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(sb.gpupin.holder(&id).is_none());
    c.stop().unwrap();
}

#[test]
fn a_privileged_container_without_a_request_runs_and_holds_nothing() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "a_privileged_container_without_a_request_runs_and_holds_nothing",
    ) else {
        return;
    };
    let id = sb.id("privileged");
    // Docker's --privileged: every host node, and one rule that allows every device.
    let mut config = with_gpu_nodes(sb.spec().to_config(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    config["linux"]["resources"]["devices"] = json!([{"allow": true, "access": "rwm"}]);
    let c = start(&sb, &id, &config).unwrap();
    assert!(sb.gpupin.holder(&id).is_none(), "{:#}", sb.gpupin.status());
    assert_eq!(sb.gpupin.status()["free"], 8);
    c.stop().unwrap();
}
