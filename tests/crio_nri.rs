//! gpupin as CRI-O's NRI plugin (`gpupin nri`): the peers' CRI-O 1.34.0 with NRI on at a
//! socket of the test's own (crio_support), `gpupin nri` connected to it, and pods driven
//! over the CRI as the kubelet drives them, through CRI-O's default runtime (runc): no
//! RuntimeClass, no hooks dir. A container annotated `gpupin.count` gets exactly its GPUs'
//! nodes and their UUIDs, bound to its process by gpupin's hook; one that asks for
//! nothing gets `NVIDIA_VISIBLE_DEVICES=void` and holds nothing; a refusal fails the
//! create with gpupin's line; removing the pod gives the GPUs back.
//!
//! Root, the built crio and pinns (tests/peers/build), conmon, runc, podman and
//! busybox-static are needed; elsewhere the test says why it skips (under CI=true it
//! fails instead).

mod containerd_support;
mod cri_support;
mod crio_support;

use cri_support::{NriPlugin, container_config, gpupin_nri, sandbox_config, uuids};
use crio_support::Crio;
use gpupin_sandbox::harness;
use serde_json::Value;

/// What a container's own process sees: the GPU nodes under its /dev and its env's
/// `NVIDIA_VISIBLE_DEVICES`, the nodes sorted.
fn sees(crio: &Crio, container: &str) -> (Vec<String>, Option<String>) {
    let exec = |cmd: &[&str]| {
        let out = crio.cri.exec_sync(container, cmd).unwrap();
        assert_eq!(out.exit_code, 0, "{cmd:?}: {}", harness::text(&out.stderr));
        harness::text(&out.stdout)
    };
    let mut nodes = harness::gpu_nodes(exec(&["ls", "/dev"]).split_whitespace());
    nodes.sort();
    let visible = exec(&["cat", "/proc/1/environ"])
        .split('\0')
        .find_map(|v| v.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .map(str::to_string);
    (nodes, visible)
}

#[test]
fn crios_pods_get_exactly_their_gpus_through_nri() {
    let test = "crios_pods_get_exactly_their_gpus_through_nri";
    let Some(crio) = Crio::start(test) else {
        return;
    };
    let version = crio.cri.version().unwrap();
    harness::say(&format!(
        "{test}: {} {}",
        version.runtime_name, version.runtime_version
    ));
    let plugin = NriPlugin::spawn(
        gpupin_nri(&crio.gpupin.config, &crio.nri_socket()),
        crio.dir.join("gpupin-nri.log"),
        "configured",
        || crio.log(),
    );
    assert!(
        plugin.log().contains("runtime=\"cri-o\""),
        "{}",
        plugin.log()
    );
    let logs = || format!("gpupin nri:\n{}\ncrio:\n{}", plugin.log(), crio.log());
    // The kubelet names each container in this annotation; CRI-O gives NRI plugins the
    // container's name from it.
    let named = |name: &'static str| [("io.kubernetes.container.name", name)];

    let trainer = sandbox_config("trainer", &[("gpupin.count", "2")]);
    let pod = crio
        .cri
        .run_pod_sandbox(&trainer, "")
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", logs()));
    let config = container_config("main", &[], &[], &named("main"), &[]);
    let main = crio
        .cri
        .create_container(&pod, config, &trainer)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", logs()));
    crio.cri.start_container(&main).unwrap();
    let status = crio.status();
    let record = harness::status::holder(&status, &main)
        .unwrap_or_else(|| panic!("{main} holds nothing: {status:#}\n{}", logs()));
    assert_eq!(record["source"], "nri", "{record:#}");
    assert_eq!(record["container"]["engine"], "cri-o", "{record:#}");
    assert_eq!(
        record["container"]["name"], "default/trainer/main",
        "{record:#}"
    );
    assert!(record["pid"].as_u64().is_some(), "bound: {record:#}");
    let gpus = uuids(&record);
    assert_eq!(gpus.len(), 2, "{record:#}");
    let mut held: Vec<String> = harness::status::held_minors(&status, &main)
        .iter()
        .map(|m| format!("nvidia{m}"))
        .collect();
    held.sort();
    let (nodes, visible) = sees(&crio, &main);
    assert_eq!(nodes, held, "{}", logs());
    let mut visible: Vec<String> = visible
        .expect("NVIDIA_VISIBLE_DEVICES")
        .split(',')
        .map(str::to_string)
        .collect();
    visible.sort();
    assert_eq!(visible, gpus);

    // A pod that asks for nothing: no GPU, nothing held, NVIDIA's env voided.
    let web = sandbox_config("web", &[]);
    let web_pod = crio.cri.run_pod_sandbox(&web, "").unwrap();
    let config = container_config(
        "main",
        &[("NVIDIA_VISIBLE_DEVICES", "all")],
        &[],
        &named("main"),
        &[],
    );
    let plain = crio
        .cri
        .create_container(&web_pod, config, &web)
        .unwrap_or_else(|e| panic!("CreateContainer: {e}\n{}", logs()));
    crio.cri.start_container(&plain).unwrap();
    assert_eq!(sees(&crio, &plain), (Vec::new(), Some("void".to_string())));

    // A refusal fails the create with gpupin's line; nothing more is held.
    let huge = sandbox_config("huge", &[("gpupin.count", "9")]);
    let huge_pod = crio.cri.run_pod_sandbox(&huge, "").unwrap();
    let config = container_config("main", &[], &[], &named("main"), &[]);
    let err = crio
        .cri
        .create_container(&huge_pod, config, &huge)
        .unwrap_err();
    assert!(
        err.message().contains("gpupin: ") && err.message().contains("count 9"),
        "{}",
        err.message()
    );
    let ids: Vec<Value> = crio.holders().iter().map(|h| h["id"].clone()).collect();
    assert_eq!(ids, [Value::from(main.clone())]);

    // Removing the pods gives the GPUs back.
    for id in [&pod, &web_pod, &huge_pod] {
        crio.cri.stop_pod_sandbox(id).unwrap();
        crio.cri.remove_pod_sandbox(id).unwrap();
    }
    assert_eq!(crio.holders(), Vec::<Value>::new(), "{}", logs());
}
