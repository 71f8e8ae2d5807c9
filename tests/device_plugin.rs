//! `gpupin device-plugin` against a fake kubelet written here: it serves `Registration`
//! on kubelet.sock and `PodResourcesLister` on a socket of its own, then calls the
//! plugin as the kubelet does (GetDevicePluginOptions, ListAndWatch,
//! GetPreferredAllocation, Allocate). The holder outside Kubernetes is a real runc
//! container with gpupin's hooks (the sandbox harness), on the simulated cubemesh8
//! machine, where the topology policy's answers differ from the lowest free GPUs. Needs
//! root and runc, like the other runc suites.

mod kubelet_fake;

use gpupin_kubelet_api::deviceplugin::device_plugin_client::DevicePluginClient;
use gpupin_kubelet_api::deviceplugin::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreferredAllocationRequest,
};
use gpupin_kubelet_api::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use gpupin_kubelet_api::podresources::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use gpupin_sandbox::harness::{self, Sandbox};
use kubelet_fake::{connect, listen, serve_registration};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tonic::transport::Server;
use tonic::{Request, Response, Status, Streaming};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const RESOURCE: &str = "gpupin.io/gpu";

/// Not a timed assertion: a bound so that a plugin that never answers fails the test
/// instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(120);

/// The kubelet's PodResources service: lists what the test says pods hold.
#[derive(Clone, Default)]
struct FakePods(Arc<Mutex<Vec<PodResources>>>);

impl FakePods {
    /// One pod whose one container holds `uuids` (none: no pod at all).
    fn set(&self, uuids: &[String]) {
        let pods = match uuids.is_empty() {
            true => vec![],
            false => vec![PodResources {
                name: "trainer".into(),
                namespace: "default".into(),
                containers: vec![ContainerResources {
                    name: "main".into(),
                    devices: vec![ContainerDevices {
                        resource_name: RESOURCE.into(),
                        device_ids: uuids.to_vec(),
                    }],
                }],
            }],
        };
        *self.0.lock().unwrap() = pods;
    }
}

#[tonic::async_trait]
impl PodResourcesLister for FakePods {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pod_resources = self.0.lock().unwrap().clone();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }
}

/// The plugin process, stopped (SIGTERM) when dropped.
struct PluginProcess {
    child: Child,
    log: PathBuf,
}

impl PluginProcess {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then its exit status.
    fn stop(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `gpupin --config CONFIG ARGS`, which must succeed; its stdout.
fn gpupin(config: &Path, args: &[&str]) -> String {
    let out = Command::new(harness::binary(GPUPIN))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gpupin {args:?}: {}",
        harness::stderr(&out)
    );
    harness::stdout(&out)
}

/// The UUIDs `gpupin pick --count N` shows.
fn pick(config: &Path, count: usize) -> Vec<String> {
    let json: Value = serde_json::from_str(&gpupin(
        config,
        &["pick", "--count", &count.to_string(), "--json"],
    ))
    .unwrap();
    json["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect()
}

fn status(config: &Path) -> Value {
    harness::status::query(&harness::binary(GPUPIN), config)
}

/// The next device list from the stream, with `wanted` true of it; lists in between are
/// skipped (the plugin sends one per change it sees).
async fn next_list(
    stream: &mut Streaming<ListAndWatchResponse>,
    plugin: &PluginProcess,
    wanted: impl Fn(&ListAndWatchResponse) -> bool,
) -> ListAndWatchResponse {
    let wait = async {
        loop {
            let list = stream
                .message()
                .await
                .unwrap()
                .expect("the stream stays open");
            if wanted(&list) {
                return list;
            }
        }
    };
    tokio::time::timeout(PATIENCE, wait)
        .await
        .unwrap_or_else(|_| panic!("no such device list came; plugin log:\n{}", plugin.log()))
}

fn unhealthy(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

fn healthy(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices
        .iter()
        .filter(|d| d.health == "Healthy")
        .map(|d| d.id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fake_kubelet_sees_gpupins_holders_and_allocates_through_the_ledger() {
    let test = "a_fake_kubelet_sees_gpupins_holders_and_allocates_through_the_ledger";
    let Some(sb) = Sandbox::with_machine(GPUPIN, test, "sim:cubemesh8") else {
        return;
    };
    // The sandbox's config is for its containers' hooks (policy pack); the plugin and
    // `gpupin pick` share its ledger under the default policy, topology.
    let dir = sb.gpupin.dir.path();
    let config = dir.join("topology.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:cubemesh8\"\npolicy = \"topology\"\n",
            sb.gpupin.state_dir,
            sb.gpupin.state_dir.join("audit.log")
        ),
    )
    .unwrap();
    let uuids: Vec<String> = status(&config)["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap().to_string())
        .collect();

    // The fake kubelet.
    let plugin_dir = dir.join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let mut registered = serve_registration(&plugin_dir);
    let pods = FakePods::default();
    let pod_resources = dir.join("pod-resources.sock");
    let lister = PodResourcesListerServer::new(pods.clone());
    tokio::spawn(Server::builder().serve_with_incoming(lister, listen(&pod_resources)));

    let log = dir.join("device-plugin.log");
    let mut plugin = PluginProcess {
        child: Command::new(harness::binary(GPUPIN))
            .arg("--config")
            .arg(&config)
            .arg("device-plugin")
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--pod-resources-socket")
            .arg(&pod_resources)
            .args([
                "--poll-interval",
                "200ms",
                "--reconcile-interval",
                "500ms",
                "--reconcile-grace",
                "0s",
            ])
            .env("GPUPIN_LOG", "debug")
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    };

    // Registration, as the kubelet receives it.
    let request = tokio::time::timeout(PATIENCE, registered.recv())
        .await
        .unwrap_or_else(|_| panic!("the plugin never registered; its log:\n{}", plugin.log()))
        .unwrap();
    assert_eq!(request.version, "v1beta1");
    assert_eq!(request.resource_name, RESOURCE);
    assert_eq!(request.endpoint, "gpupin.sock");
    assert!(request.options.unwrap().get_preferred_allocation_available);
    let socket = plugin_dir.join(&request.endpoint);
    let mut client = DevicePluginClient::new(connect(&socket).await);
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);

    // Every GPU, by UUID, Healthy, with its NUMA node.
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, &plugin, |_| true).await;
    let ids: Vec<String> = first.devices.iter().map(|d| d.id.clone()).collect();
    assert_eq!(ids, uuids);
    assert_eq!(healthy(&first), uuids);
    let numa: Vec<i64> = first
        .devices
        .iter()
        .map(|d| d.topology.as_ref().unwrap().nodes[0].id)
        .collect();
    assert_eq!(numa, [0, 0, 0, 0, 1, 1, 1, 1]);

    // A container outside Kubernetes takes GPU 2 (and 3): they are no longer allocatable.
    let outside = sb.id("outside");
    let container = sb
        .start(&outside, &sb.spec().annotation("gpupin.devices", "2,3"))
        .unwrap();
    let taken = vec![uuids[2].clone(), uuids[3].clone()];
    let list = next_list(&mut stream, &plugin, |l| !unhealthy(l).is_empty()).await;
    assert_eq!(unhealthy(&list), taken, "{:#}", status(&config));

    // The preferred set is what `gpupin pick` shows, over the devices the kubelet offers.
    let available = healthy(&list);
    for size in 1..=4 {
        let answer = client
            .get_preferred_allocation(PreferredAllocationRequest {
                container_requests: vec![ContainerPreferredAllocationRequest {
                    available_device_ids: available.clone(),
                    must_include_device_ids: vec![],
                    allocation_size: size as i32,
                }],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.container_responses[0].device_ids,
            pick(&config, size),
            "size {size}"
        );
    }
    // cubemesh8 without GPUs 2 and 3: 0 and 1 share one NVLink, 0 and 4 two; topology
    // does not take the lowest free GPUs.
    let preferred = pick(&config, 2);
    assert_ne!(preferred, [uuids[0].clone(), uuids[1].clone()]);

    // Allocate: a record `gpupin status` shows, device nodes, env and the holder.
    pods.set(&preferred);
    let allocated = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: preferred.clone(),
            }],
        })
        .await
        .unwrap_or_else(|s| panic!("Allocate failed: {}; log:\n{}", s.message(), plugin.log()))
        .into_inner();
    let response = &allocated.container_responses[0];
    // The holder and its key, the container's way into its own GPUs.
    let within = response.annotations["gpupin.within"].clone();
    assert_eq!(response.envs["GPUPIN_WITHIN"], within);
    let (holder, key) = within.split_once(':').expect("HOLDER:KEY");
    assert!(holder.starts_with("k8s-") && key.len() == 32, "{within}");
    let holder = holder.to_string();
    assert_eq!(response.envs["NVIDIA_VISIBLE_DEVICES"], preferred.join(","));
    let minors: Vec<String> = preferred
        .iter()
        .map(|u| uuids.iter().position(|x| x == u).unwrap())
        .map(|i| format!("/dev/nvidia{i}"))
        .collect();
    let paths: Vec<&str> = response
        .devices
        .iter()
        .map(|d| d.host_path.as_str())
        .collect();
    assert_eq!(
        paths[..2],
        minors.iter().map(String::as_str).collect::<Vec<_>>()[..]
    );
    assert!(paths.contains(&"/dev/nvidiactl"), "{paths:?}");
    let record =
        harness::status::holder(&status(&config), &holder).expect("the holder is in gpupin status");
    assert_eq!(record["gpus"], serde_json::json!(preferred));
    assert_eq!(record["source"], "device-plugin");
    assert_eq!(record["kind"], "hold");
    assert_eq!(record["until_release"], true);
    let table = gpupin(&config, &["status"]);
    assert!(table.contains(&holder), "{table}");

    // The plugin's own holder keeps its GPUs Healthy: the kubelet counts them itself
    // (a new stream starts with the list as it is now).
    let mut fresh = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let list = next_list(&mut fresh, &plugin, |_| true).await;
    assert_eq!(unhealthy(&list), taken);
    drop(fresh);

    // A GPU the container holds cannot be allocated, and the error says who has it.
    let refused = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![uuids[2].clone()],
            }],
        })
        .await
        .unwrap_err();
    assert!(
        refused.message().contains(&format!("held by {outside}")),
        "{}",
        refused.message()
    );

    // The container ends: its GPUs come back.
    container.stop().unwrap();
    next_list(&mut stream, &plugin, |l| unhealthy(l).is_empty()).await;

    // The pod goes: the reconcile releases its holder.
    pods.set(&[]);
    let released = async {
        while harness::status::holder(&status(&config), &holder).is_some() {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    tokio::time::timeout(PATIENCE, released)
        .await
        .unwrap_or_else(|_| panic!("{holder} was never released; log:\n{}", plugin.log()));

    // The kubelet restarts (it removes the plugins' sockets): the plugin registers again.
    std::fs::remove_file(&socket).unwrap();
    let again = tokio::time::timeout(PATIENCE, registered.recv())
        .await
        .unwrap_or_else(|_| panic!("no second registration; log:\n{}", plugin.log()))
        .unwrap();
    assert_eq!(again.endpoint, "gpupin.sock");

    let exit = plugin.stop();
    assert!(exit.success(), "{exit}; log:\n{}", plugin.log());
    assert!(!socket.exists(), "the socket is left after SIGTERM");
}

/// `--mig-strategy mixed` on the simulated A100 with MIG: one registration per resource
/// (whole GPUs, then `gpupin.io/mig-<profile>`), each on its own socket; the 1g.10gb
/// plugin lists the two 1g.10gb instances, and Allocate of one returns its GPU's node and
/// its two capability nodes with NVIDIA_VISIBLE_DEVICES = its UUID. Needs no root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mixed_strategy_serves_each_mig_profile_as_a_resource() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let state = dir.join("state");
    let config = dir.join("gpupin.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:dgxa100mig\"\n",
            state,
            dir.join("audit.log")
        ),
    )
    .unwrap();
    let plugin_dir = dir.join("device-plugins");
    std::fs::create_dir(&plugin_dir).unwrap();
    let mut registered = serve_registration(&plugin_dir);
    let pods = FakePods::default();
    let pod_resources = dir.join("pod-resources.sock");
    let lister = PodResourcesListerServer::new(pods.clone());
    tokio::spawn(Server::builder().serve_with_incoming(lister, listen(&pod_resources)));
    let log = dir.join("device-plugin.log");
    let plugin = PluginProcess {
        child: Command::new(harness::binary(GPUPIN))
            .arg("--config")
            .arg(&config)
            .arg("device-plugin")
            .arg("--plugin-dir")
            .arg(&plugin_dir)
            .arg("--pod-resources-socket")
            .arg(&pod_resources)
            .args(["--mig-strategy", "mixed", "--poll-interval", "200ms"])
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    };
    let mut requests = Vec::new();
    for _ in 0..4 {
        let request = tokio::time::timeout(PATIENCE, registered.recv())
            .await
            .unwrap_or_else(|_| panic!("the plugin never registered; its log:\n{}", plugin.log()))
            .unwrap();
        requests.push((request.resource_name, request.endpoint));
    }
    requests.sort();
    assert_eq!(
        requests,
        [
            ("gpupin.io/gpu".to_string(), "gpupin.sock".to_string()),
            (
                "gpupin.io/mig-1g.10gb".into(),
                "gpupin-mig-1g.10gb.sock".into()
            ),
            (
                "gpupin.io/mig-2g.20gb".into(),
                "gpupin-mig-2g.20gb.sock".into()
            ),
            (
                "gpupin.io/mig-3g.40gb".into(),
                "gpupin-mig-3g.40gb.sock".into()
            ),
        ]
    );
    let mig: Vec<(String, String)> = status(&config)["gpus"][0]["mig"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["profile"].as_str().unwrap().to_string(),
                m["uuid"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let small: Vec<String> = mig
        .iter()
        .filter(|(p, _)| p == "1g.10gb")
        .map(|(_, u)| u.clone())
        .collect();
    let socket = plugin_dir.join("gpupin-mig-1g.10gb.sock");
    let mut client = DevicePluginClient::new(connect(&socket).await);
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = next_list(&mut stream, &plugin, |_| true).await;
    assert_eq!(healthy(&first), small);
    // The whole-GPU resource leaves out GPUs 0 and 7, which are in MIG mode.
    let mut whole = DevicePluginClient::new(connect(&plugin_dir.join("gpupin.sock")).await);
    let mut whole_stream = whole.list_and_watch(Empty {}).await.unwrap().into_inner();
    let whole_list = next_list(&mut whole_stream, &plugin, |_| true).await;
    assert_eq!(whole_list.devices.len(), 6);

    let answer = client
        .allocate(AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: vec![small[1].clone()],
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let c = &answer.container_responses[0];
    let paths: Vec<&str> = c
        .devices
        .iter()
        .map(|d| d.container_path.as_str())
        .collect();
    assert_eq!(
        paths[..3],
        [
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap93",
            "/dev/nvidia-caps/nvidia-cap94"
        ]
    );
    assert_eq!(c.envs.get("NVIDIA_VISIBLE_DEVICES"), Some(&small[1]));
}
