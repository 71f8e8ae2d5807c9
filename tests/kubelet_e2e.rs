//! `gpupin device-plugin` with a real kubelet (k8s.io/kubernetes cmd/kubelet from the
//! peers' cache, tests/peers/kubelet) in standalone mode: static pods from a manifest
//! dir, no API server, on a private containerd with its CRI (cri_support). What is
//! checked is what a person on the node would check: what the container sees (its
//! `NVIDIA_VISIBLE_DEVICES`, its /dev), the kubelet's own checkpoint, its PodResources
//! API (`List`, `GetAllocatableResources`), its pods' state through the CRI, its log and
//! metrics, and `gpupin status`. The kubelet's GetPreferredAllocation and Allocate
//! latencies are printed (run with `--nocapture` to see them).
//!
//! Root, containerd, runc, busybox-static and the built kubelet are needed; elsewhere the
//! test says why it skips (under CI=true it fails instead).

mod containerd_support;
mod cri_support;
mod kubelet_support;

use cri_support::Node;
use gpupin_sandbox::harness::{self, gpu_nodes};
use kubelet_support::cri::{self, CONTAINER_NAME, CONTAINER_RUNNING};
use kubelet_support::{
    DevicePlugin, HostChanges, Kubelet, PodResources, RESOURCE, checkpoint_sets, kubelet_binary,
    plugin_dir_free, preferred_allocation_latencies, static_pod, wait_for,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

/// The plugin's `--reconcile-grace`: a holder is released once every PodResources `List`
/// for this long has left it out.
const GRACE: Duration = Duration::from_secs(10);

/// The kubelet, its containerd and what the test changed on the host. Dropped in this
/// order: the kubelet stops (it would restart its pods), every pod it left is stopped
/// and removed through the CRI (no shim stays behind), containerd stops, the host is
/// put back.
struct World {
    kubelet: Kubelet,
    node: Node,
    _host: HostChanges,
}

impl Drop for World {
    fn drop(&mut self) {
        self.kubelet.stop();
        let listed: Result<cri::ListPodSandboxResponse, _> = self
            .node
            .cri
            .call("ListPodSandbox", cri::ListPodSandboxRequest {});
        for sandbox in listed.map(|l| l.items).unwrap_or_default() {
            let _ = self.node.cri.stop_pod_sandbox(&sandbox.id);
            let _ = self.node.cri.remove_pod_sandbox(&sandbox.id);
        }
    }
}

/// The running `main` container of static pod `name`: its CRI id.
fn running(world: &World, name: &str) -> String {
    let pod = static_pod(name);
    wait_for(
        &format!("running container of {pod}"),
        || {
            cri::containers_of(&world.node.cri, &pod)
                .into_iter()
                .find(|c| {
                    c.state == CONTAINER_RUNNING
                        && c.labels.get(CONTAINER_NAME).is_some_and(|n| n == "main")
                })
                .map(|c| c.id)
        },
        || world.kubelet.tail(),
    )
}

/// What a container's own process (its pid 1) has as `NAME` in its env.
fn env_of(world: &World, container: &str, name: &str) -> Option<String> {
    let out = world
        .node
        .cri
        .exec_sync(container, &["cat", "/proc/1/environ"])
        .unwrap_or_else(|e| panic!("ExecSync cat /proc/1/environ: {e}"));
    assert_eq!(out.exit_code, 0, "{}", harness::text(&out.stderr));
    harness::text(&out.stdout)
        .split('\0')
        .find_map(|v| v.strip_prefix(&format!("{name}=")).map(str::to_string))
}

/// The GPU nodes (`nvidiaN`) under the container's /dev.
fn nodes_inside(world: &World, container: &str) -> Vec<String> {
    let out = world
        .node
        .cri
        .exec_sync(container, &["ls", "/dev"])
        .unwrap_or_else(|e| panic!("ExecSync ls /dev: {e}"));
    gpu_nodes(harness::text(&out.stdout).split_whitespace())
}

/// What the container of static pod `name` was given, checked against what gpupin
/// recorded: its GPUs' UUIDs, sorted.
fn given(world: &World, container: &str, minors: &BTreeMap<String, u64>) -> Vec<String> {
    let visible = env_of(world, container, "NVIDIA_VISIBLE_DEVICES")
        .expect("the container has NVIDIA_VISIBLE_DEVICES");
    let mut uuids: Vec<String> = visible.split(',').map(str::to_string).collect();
    uuids.sort();
    // Its /dev has exactly those GPUs' nodes.
    let mut expected: Vec<String> = uuids
        .iter()
        .map(|u| format!("nvidia{}", minors[u]))
        .collect();
    expected.sort();
    assert_eq!(nodes_inside(world, container), expected, "{visible}");
    // The holder gpupin recorded for it holds exactly those.
    let within = env_of(world, container, "GPUPIN_WITHIN").expect("GPUPIN_WITHIN");
    let holder = within.split_once(':').map_or(within.as_str(), |(h, _)| h);
    let status = world.node.status();
    let record = harness::status::holder(&status, holder)
        .unwrap_or_else(|| panic!("{holder} is not in gpupin status: {status:#}"));
    let mut recorded: Vec<String> = record["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect();
    recorded.sort();
    assert_eq!(recorded, uuids, "{record:#}");
    assert_eq!(record["source"], "device-plugin");
    uuids
}

/// The plugin's holders in `gpupin status`: id -> UUIDs, sorted.
fn plugin_holders(world: &World) -> BTreeMap<String, Vec<String>> {
    harness::status::holders(&world.node.status())
        .iter()
        .filter(|h| h["source"] == "device-plugin")
        .map(|h| (h["id"].as_str().unwrap().to_string(), cri_support::uuids(h)))
        .collect()
}

/// `gpupin ARGS` with the node's config, which must succeed.
fn gpupin(world: &World, args: &[&str]) -> String {
    let out = world.node.containerd.gpupin.run(args, "");
    assert!(
        out.status.success(),
        "gpupin {args:?}: {}",
        harness::stderr(&out)
    );
    harness::stdout(&out)
}

/// The kubelet's Allocate duration metric: (sum of seconds, count).
fn allocate_metric(kubelet: &Kubelet) -> (f64, f64) {
    (
        kubelet.metric("kubelet_device_plugin_alloc_duration_seconds_sum"),
        kubelet.metric("kubelet_device_plugin_alloc_duration_seconds_count"),
    )
}

/// Starts static pod `name` asking for `gpus`; its container id and the kubelet's
/// Allocate duration for it (from its metric: one more call, this much more time).
fn start_pod(world: &mut World, name: &str, gpus: usize) -> (String, f64) {
    let (sum, count) = allocate_metric(&world.kubelet);
    world.kubelet.add_pod(name, gpus);
    let id = running(world, name);
    let (sum_after, count_after) = allocate_metric(&world.kubelet);
    assert_eq!(count_after, count + 1.0, "one Allocate for {name}");
    (id, sum_after - sum)
}

fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1000.0)
}

#[test]
fn a_real_kubelet_gives_pods_the_gpus_gpupin_records() {
    let test = "a_real_kubelet_gives_pods_the_gpus_gpupin_records";
    let Some(kubelet_bin) = harness::required(test, kubelet_binary()) else {
        return;
    };
    if !harness::need_root(test) || harness::required(test, plugin_dir_free()).is_none() {
        return;
    }
    let Some(node) = Node::start(test) else {
        return;
    };
    let gpupin_config = node.containerd.gpupin.config.clone();
    let dir = node.containerd.dir().to_path_buf();
    let inventory: Value = serde_json::from_str(&harness::stdout(
        &node.containerd.gpupin.run(&["inventory", "--json"], ""),
    ))
    .unwrap();
    let host = HostChanges::prepare(&inventory);
    let kubelet = Kubelet::start(&kubelet_bin, &node, &dir);
    let containerd_version = node.cri.version().unwrap().runtime_version;
    harness::say(&format!(
        "{test}: kubelet {}, containerd {containerd_version}",
        kubelet.version
    ));
    let mut world = World {
        kubelet,
        node,
        _host: host,
    };
    let minors = harness::status::minors(&world.node.status());
    let all: Vec<String> = {
        let mut all: Vec<String> = minors.keys().cloned().collect();
        all.sort();
        all
    };

    // The plugin registers on the kubelet's socket; the kubelet counts every GPU healthy.
    let plugin_log = dir.join("device-plugin.log");
    let pod_resources_socket = world.kubelet.pod_resources_socket();
    let mut plugin = DevicePlugin::start(
        &gpupin_config,
        &pod_resources_socket,
        plugin_log.clone(),
        GRACE,
    );
    world.kubelet.wait("registration of the plugin", |k| {
        k.metric("kubelet_device_plugin_registration_total") >= 1.0
    });
    let pods = PodResources::new(&pod_resources_socket);
    wait_for(
        "all GPUs allocatable",
        || (pods.allocatable() == all).then_some(()),
        || format!("{}\nplugin:\n{}", world.kubelet.tail(), plugin.log()),
    );

    // A static pod asking for 2 gets 2 GPUs: what it sees is what gpupin recorded, the
    // kubelet's checkpoint and its PodResources say the same.
    let (a, allocate_a) = start_pod(&mut world, "trainer-a", 2);
    let a_gpus = given(&world, &a, &minors);
    assert_eq!(a_gpus.len(), 2);
    assert_eq!(checkpoint_sets(), BTreeSet::from([a_gpus.clone()]));
    let a_entry = (static_pod("trainer-a"), "main".to_string(), a_gpus.clone());
    assert_eq!(pods.list(), vec![a_entry.clone()]);

    // A second pod gets two others.
    let (b, allocate_b) = start_pod(&mut world, "trainer-b", 2);
    let b_gpus = given(&world, &b, &minors);
    assert!(
        a_gpus.iter().all(|g| !b_gpus.contains(g)),
        "{a_gpus:?} {b_gpus:?}"
    );
    assert_eq!(
        checkpoint_sets(),
        BTreeSet::from([a_gpus.clone(), b_gpus.clone()])
    );
    let b_entry = (static_pod("trainer-b"), "main".to_string(), b_gpus.clone());
    let mut both = vec![a_entry.clone(), b_entry.clone()];
    both.sort();
    assert_eq!(pods.list(), both);
    let holders: BTreeSet<Vec<String>> = plugin_holders(&world).into_values().collect();
    assert_eq!(holders, BTreeSet::from([a_gpus.clone(), b_gpus.clone()]));

    // Two GPUs held outside Kubernetes: the kubelet counts them unhealthy.
    let free: Vec<String> = all
        .iter()
        .filter(|g| !a_gpus.contains(g) && !b_gpus.contains(g))
        .cloned()
        .collect();
    let outside = vec![free[0].clone(), free[1].clone()];
    gpupin(
        &world,
        &[
            "hold",
            "--devices",
            &outside.join(","),
            "--until-release",
            "maintenance",
        ],
    );
    let healthy: Vec<String> = all
        .iter()
        .filter(|g| !outside.contains(g))
        .cloned()
        .collect();
    wait_for(
        "the held GPUs unhealthy to the kubelet",
        || (pods.allocatable() == healthy).then_some(()),
        || format!("{}\nplugin:\n{}", world.kubelet.tail(), plugin.log()),
    );

    // A third pod asking for 3 does not fit (2 healthy GPUs are free): the kubelet
    // rejects it and starts nothing of it.
    world.kubelet.add_pod("trainer-c", 3);
    let c = static_pod("trainer-c");
    let rejection = wait_for(
        &format!("rejection of {c}"),
        || {
            world.kubelet.log().lines().find_map(|l| {
                (l.contains("Event occurred") && l.contains(&c) && l.contains("type=\"Warning\""))
                    .then(|| l.to_string())
            })
        },
        || world.kubelet.tail(),
    );
    harness::say(&format!("{test}: {rejection}"));
    // Its status, as the kubelet's /pods lists it (`kubectl get pod` would show it).
    let listed: Value = serde_json::from_str(&world.kubelet.get("/pods").unwrap()).unwrap();
    let status = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["metadata"]["name"] == c.as_str())
        .map(|p| p["status"].clone())
        .unwrap_or_else(|| panic!("{c} is not in the kubelet's /pods: {listed:#}"));
    assert_eq!(status["phase"], "Failed", "{status:#}");
    assert_eq!(status["reason"], "UnexpectedAdmissionError", "{status:#}");
    let message = status["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "unavailable for {RESOURCE}. Requested: 3, Available: 2"
        )),
        "{message}"
    );
    assert!(
        cri::containers_of(&world.node.cri, &c).is_empty(),
        "a container of {c} was created"
    );
    assert!(
        cri::sandboxes(&world.node.cri)
            .iter()
            .all(|s| s.labels.get(cri::POD_NAME) != Some(&c)),
        "a sandbox of {c} was created"
    );
    assert_eq!(plugin_holders(&world).len(), 2, "{c} got a holder");
    world.kubelet.remove_pod("trainer-c");

    // Deleting pod a's manifest: its container goes, and the plugin's reconcile
    // releases its GPUs (the kubelet lists it no more).
    world.kubelet.remove_pod("trainer-a");
    wait_for(
        "pod a's container gone",
        || {
            cri::containers_of(&world.node.cri, &static_pod("trainer-a"))
                .iter()
                .all(|c| c.state != CONTAINER_RUNNING)
                .then_some(())
        },
        || world.kubelet.tail(),
    );
    wait_for(
        "pod a's holder released",
        || {
            let left: BTreeSet<Vec<String>> = plugin_holders(&world).into_values().collect();
            (left == BTreeSet::from([b_gpus.clone()])).then_some(())
        },
        || format!("{:#}\nplugin:\n{}", world.node.status(), plugin.log()),
    );
    assert_eq!(pods.list(), vec![b_entry.clone()]);

    // A pod asking for 4 gets exactly the 4 free healthy GPUs: never a held one.
    let (d, allocate_d) = start_pod(&mut world, "trainer-d", 4);
    let d_started = Instant::now();
    let d_gpus = given(&world, &d, &minors);
    let expected: Vec<String> = healthy
        .iter()
        .filter(|g| !b_gpus.contains(g))
        .cloned()
        .collect();
    assert_eq!(d_gpus, expected, "held outside: {outside:?}");

    // The plugin restarts: it registers again, its holders stay (their pods run), and
    // the GPUs given back outside Kubernetes come back through the new registration.
    let exit = plugin.stop();
    assert!(exit.success(), "{exit}; log:\n{}", plugin.log());
    let mut plugin = DevicePlugin::start(&gpupin_config, &pod_resources_socket, plugin_log, GRACE);
    world
        .kubelet
        .wait("a second registration of the plugin", |k| {
            k.metric("kubelet_device_plugin_registration_total") >= 2.0
        });
    gpupin(&world, &["release", "maintenance"]);
    wait_for(
        "all GPUs allocatable again",
        || (pods.allocatable() == all).then_some(()),
        || format!("{}\nplugin:\n{}", world.kubelet.tail(), plugin.log()),
    );
    let holders: BTreeSet<Vec<String>> = plugin_holders(&world).into_values().collect();
    assert_eq!(holders, BTreeSet::from([b_gpus.clone(), d_gpus.clone()]));
    // The kubelet restarts (its pods run on): it finds the plugin again, lists the pods
    // again, and the holders of the running pods stay: a kubelet coming back is not a
    // pod going away.
    // Every holder older than the grace first, so that the age of none protects it.
    std::thread::sleep(
        (d_started + GRACE + Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    );
    world.kubelet.restart();
    world
        .kubelet
        .wait("registration of the plugin with the new kubelet", |k| {
            k.metric("kubelet_device_plugin_registration_total") >= 1.0
        });
    let pods = PodResources::new(&pod_resources_socket);
    let mut running_pods = vec![
        b_entry.clone(),
        (static_pod("trainer-d"), "main".to_string(), d_gpus.clone()),
    ];
    running_pods.sort();
    wait_for(
        "the new kubelet listing pods b and d",
        || (pods.list() == running_pods).then_some(()),
        || format!("{}\nplugin:\n{}", world.kubelet.tail(), plugin.log()),
    );
    let holders: BTreeSet<Vec<String>> = plugin_holders(&world).into_values().collect();
    assert_eq!(
        holders,
        BTreeSet::from([b_gpus.clone(), d_gpus.clone()]),
        "plugin log:\n{}",
        plugin.log()
    );
    let (e, allocate_e) = start_pod(&mut world, "trainer-e", 2);
    let e_gpus = given(&world, &e, &minors);
    assert_eq!(e_gpus, outside, "the only free GPUs");

    // Pods b and d deleted, and at once a pod asking for 3 (every other GPU is e's):
    // the kubelet gives it GPUs of d before the reconcile has released d's holder (its
    // grace has not passed); that Allocate releases the holders it overlaps, and the new
    // pod's holder holds exactly its GPUs.
    for pod in ["trainer-b", "trainer-d"] {
        world.kubelet.remove_pod(pod);
    }
    for pod in ["trainer-b", "trainer-d"] {
        wait_for(
            &format!("pod {pod} stopped"),
            || {
                cri::sandboxes(&world.node.cri)
                    .iter()
                    .filter(|s| s.labels.get(cri::POD_NAME) == Some(&static_pod(pod)))
                    .all(|s| s.state != cri::SANDBOX_READY)
                    .then_some(())
            },
            || world.kubelet.tail(),
        );
    }
    let (f, allocate_f) = start_pod(&mut world, "trainer-f", 3);
    let f_gpus = given(&world, &f, &minors);
    assert!(f_gpus.iter().all(|g| !e_gpus.contains(g)), "{f_gpus:?}");
    let holders = plugin_holders(&world);
    for (id, gpus) in &holders {
        if gpus != &f_gpus && gpus != &e_gpus {
            assert!(
                gpus.iter().all(|g| !f_gpus.contains(g)),
                "{id} still holds GPUs of pod f ({f_gpus:?}): {holders:#?}"
            );
        }
    }
    assert!(holders.values().any(|g| g == &f_gpus), "{holders:#?}");
    // Which way the old holders went (a slow machine may let the reconcile come first).
    let by_allocate = plugin
        .log()
        .lines()
        .filter(|l| l.contains("the kubelet gives its GPUs to another container"))
        .count();
    harness::say(&format!(
        "{test}: holders released at pod f's Allocate: {by_allocate}"
    ));

    // Every pod gone: every holder of the plugin released.
    for pod in ["trainer-e", "trainer-f"] {
        world.kubelet.remove_pod(pod);
    }
    wait_for(
        "every holder released",
        || plugin_holders(&world).is_empty().then_some(()),
        || format!("{:#}\nplugin:\n{}", world.node.status(), plugin.log()),
    );

    // The latencies as the kubelet saw them.
    let preferred = preferred_allocation_latencies(&world.kubelet.log());
    let allocate = [allocate_a, allocate_b, allocate_d, allocate_e, allocate_f];
    harness::say(&format!(
        "{test}: kubelet GetPreferredAllocation (log lines, {} calls): {}",
        preferred.len(),
        preferred
            .iter()
            .map(|s| ms(*s))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    harness::say(&format!(
        "{test}: kubelet Allocate (kubelet_device_plugin_alloc_duration_seconds, pods a b d e f): {}",
        allocate
            .iter()
            .map(|s| ms(*s))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    assert!(
        !preferred.is_empty(),
        "no GetPreferredAllocation call in the kubelet's log"
    );

    let exit = plugin.stop();
    assert!(exit.success(), "{exit}; log:\n{}", plugin.log());
}
