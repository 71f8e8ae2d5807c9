//! A real kubelet (k8s.io/kubernetes cmd/kubelet, as tests/peers/build builds it into the
//! peers' cache) in standalone mode: no API server, static pods from a manifest dir, its
//! own root dir, on the private containerd of cri_support (CRI, host-network pods, so no
//! CNI). Its pods are read from the CRI and its log, its metrics from its read-only port.
//!
//! What it changes outside the test's temp dir, and puts back when dropped:
//! - `/var/lib/kubelet/device-plugins/`: the kubelet's device-plugin dir is fixed in its
//!   code (not under `--root-dir`); the test refuses to run where a kubelet answers there.
//! - the kernel tunables the kubelet sets at start (vm.overcommit_memory, kernel.panic,
//!   ...): their values before are written back.
//! - `/dev/nvidia*`: containerd stats a device's host path, and the simulated machine's
//!   nodes are not on the host: the missing ones are made (char devices of the
//!   inventory's numbers, no driver behind them) and removed again.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod cri;

use crate::cri_support::Node;
use gpupin_sandbox::harness;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// The node's name: a static pod `NAME` runs as `NAME-gpupin-node`.
pub const NODE: &str = "gpupin-node";
/// The plugin's resource (its default).
pub const RESOURCE: &str = "gpupin.io/gpu";
/// Where the kubelet serves `Registration` and reads plugins' sockets: fixed in its code.
pub const PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Not a timed assertion: the bound of every wait here, so that a kubelet that never
/// gets there fails the test instead of hanging it.
pub const PATIENCE: Duration = Duration::from_secs(180);

/// The kernel tunables the kubelet sets at start (`setupKernelTunables`).
const TUNABLES: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The kubelet binary the peers' build made, or why it is not there.
pub fn kubelet_binary() -> Result<PathBuf, String> {
    let bin = harness::toolkit::peers_cache()?.join("kubelet/kubelet");
    match bin.exists() {
        true => Ok(bin),
        false => Err(format!(
            "no {}: run tests/peers/build (needs Go)",
            bin.display()
        )),
    }
}

/// Whether the host's device-plugin dir is free for a test kubelet: no kubelet answers
/// on its socket, and nothing but what a test kubelet leaves is in it.
pub fn plugin_dir_free() -> Result<(), String> {
    let dir = Path::new(PLUGIN_DIR);
    if std::os::unix::net::UnixStream::connect(dir.join("kubelet.sock")).is_ok() {
        return Err(format!(
            "a kubelet serves {PLUGIN_DIR}/kubelet.sock on this host"
        ));
    }
    let ours = [
        "kubelet.sock",
        "kubelet_internal_checkpoint",
        "gpupin.sock",
        "DEPRECATION",
    ];
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name();
            if !ours.iter().any(|o| name == *o) {
                return Err(format!(
                    "{PLUGIN_DIR} holds {name:?}: another device plugin's, not the test's"
                ));
            }
        }
    }
    Ok(())
}

/// What was changed on the host, put back when dropped.
#[derive(Default)]
pub struct HostChanges {
    tunables: Vec<(PathBuf, String)>,
    nodes: Vec<PathBuf>,
    /// Made by the test: removed with what is in them.
    dirs: Vec<PathBuf>,
}

impl HostChanges {
    /// Records the tunables, makes the plugin dir and the missing device nodes of the
    /// inventory `gpupin inventory --json` describes.
    pub fn prepare(inventory: &Value) -> HostChanges {
        let mut changes = HostChanges::default();
        for t in TUNABLES {
            let path = Path::new("/proc/sys").join(t);
            if let Ok(value) = std::fs::read_to_string(&path) {
                changes.tunables.push((path, value));
            }
        }
        for dir in ["/var/lib/kubelet", PLUGIN_DIR] {
            if !Path::new(dir).exists() {
                std::fs::create_dir(dir).unwrap();
                changes.dirs.push(dir.into());
            }
        }
        // What a previous run may have left: a checkpoint naming pods that are gone.
        let _ = std::fs::remove_file(Path::new(PLUGIN_DIR).join("kubelet_internal_checkpoint"));
        let major = inventory["gpu_major"].as_u64().unwrap() as u32;
        let mut nodes: Vec<(String, u32, u32)> = inventory["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let minor = g["minor"].as_u64().unwrap() as u32;
                (format!("/dev/nvidia{minor}"), major, minor)
            })
            .collect();
        for n in inventory["control_nodes"].as_array().unwrap() {
            nodes.push((
                n["path"].as_str().unwrap().to_string(),
                n["major"].as_u64().unwrap() as u32,
                n["minor"].as_u64().unwrap() as u32,
            ));
        }
        for (path, major, minor) in nodes {
            let path = PathBuf::from(path);
            if path.symlink_metadata().is_err() {
                use rustix::fs::{CWD, FileType, Mode, makedev, mknodat};
                mknodat(
                    CWD,
                    &path,
                    FileType::CharacterDevice,
                    Mode::from_raw_mode(0o666),
                    makedev(major, minor),
                )
                .unwrap_or_else(|e| panic!("mknod {}: {e}", path.display()));
                changes.nodes.push(path);
            }
        }
        changes
    }
}

impl Drop for HostChanges {
    fn drop(&mut self) {
        for (path, value) in &self.tunables {
            let _ = std::fs::write(path, value);
        }
        for node in &self.nodes {
            let _ = std::fs::remove_file(node);
        }
        for dir in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir_all(dir);
        }
        for name in ["kubelet.sock", "kubelet_internal_checkpoint", "DEPRECATION"] {
            let _ = std::fs::remove_file(Path::new(PLUGIN_DIR).join(name));
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound, then let go).
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The kubelet process, killed when dropped.
pub struct Kubelet {
    child: Child,
    binary: PathBuf,
    config_file: PathBuf,
    pub root: PathBuf,
    pub manifests: PathBuf,
    log: PathBuf,
    read_only_port: u16,
    pub version: String,
}

impl Kubelet {
    /// Starts the kubelet on `node`'s containerd with everything under `dir`; returns once
    /// its device manager serves `Registration` and its read-only port answers.
    pub fn start(binary: &Path, node: &Node, dir: &Path) -> Kubelet {
        let root = dir.join("kubelet");
        let manifests = dir.join("manifests");
        for d in [&root, &manifests] {
            std::fs::create_dir_all(d).unwrap();
        }
        let read_only_port = free_port();
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "staticPodPath": manifests,
            "fileCheckFrequency": "1s",
            "syncFrequency": "5s",
            "podLogsDir": root.join("logs"),
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": read_only_port,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            // This VM's cgroup layout is v1 (hybrid); the kubelet refuses it by default.
            "failCgroupV1": false,
            // containerd's runc runtime uses cgroupfs unless told SystemdCgroup (2.x
            // also says so through the CRI's RuntimeConfig; 1.6 lacks it).
            "cgroupDriver": "cgroupfs",
            // No QoS cgroup tree of the kubelet's own on the host.
            "cgroupsPerQOS": false,
            "enforceNodeAllocatable": [],
            "failSwapOn": false,
            "containerRuntimeEndpoint": format!("unix://{}", node.containerd.socket.display()),
            // A test machine's disk may be fuller than the defaults allow; never evict or
            // collect the imported image.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        });
        let config_file = dir.join("kubelet.json");
        std::fs::write(&config_file, config.to_string()).unwrap();
        let log = dir.join("kubelet.log");
        let version = harness::stdout(
            &Command::new(binary)
                .arg("--version")
                .output()
                .expect("kubelet --version"),
        )
        .trim()
        .to_string();
        let mut kubelet = Kubelet {
            child: spawn(binary, &config_file, &root, &log),
            binary: binary.to_path_buf(),
            config_file,
            root,
            manifests,
            log,
            read_only_port,
            version,
        };
        kubelet.wait_ready();
        kubelet
    }

    /// Until its device manager serves `Registration` and its read-only port answers.
    fn wait_ready(&mut self) {
        self.wait("its device manager and read-only port", |k| {
            Path::new(PLUGIN_DIR).join("kubelet.sock").exists()
                && k.get("/healthz").is_some_and(|h| h == "ok")
        });
    }

    /// Stops the kubelet and starts it again with the same config, root dir and log, as
    /// `systemctl restart kubelet` does; its pods' containers run on meanwhile.
    pub fn restart(&mut self) {
        self.stop();
        // The new kubelet serves its own: waiting for it means waiting for that one.
        let _ = std::fs::remove_file(Path::new(PLUGIN_DIR).join("kubelet.sock"));
        self.child = spawn(&self.binary, &self.config_file, &self.root, &self.log);
        self.wait_ready();
    }

    /// The kubelet's log (klog lines).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's last lines, for failure messages.
    pub fn tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }

    /// Waits until `done` holds; panics with the log's tail after PATIENCE or when the
    /// kubelet exits.
    pub fn wait(&mut self, what: &str, mut done: impl FnMut(&Kubelet) -> bool) {
        let started = Instant::now();
        loop {
            if done(self) {
                return;
            }
            if let Ok(Some(exit)) = self.child.try_wait() {
                panic!(
                    "the kubelet exited ({exit}) waiting for {what}:\n{}",
                    self.tail()
                );
            }
            assert!(
                started.elapsed() < PATIENCE,
                "no {what} after {PATIENCE:?}; kubelet log:\n{}",
                self.tail()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// `GET PATH` on the read-only port: the body of a 200 answer.
    pub fn get(&self, path: &str) -> Option<String> {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", self.read_only_port)).ok()?;
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .ok()?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (head, body) = answer.split_once("\r\n\r\n")?;
        head.starts_with("HTTP/1.0 200")
            .then(|| body.to_string())
            .or_else(|| head.starts_with("HTTP/1.1 200").then(|| body.to_string()))
    }

    /// The value of metric `name` for the plugin's resource (0 when not yet there).
    pub fn metric(&self, name: &str) -> f64 {
        let metrics = self.get("/metrics").expect("the kubelet's /metrics");
        let label = format!("resource_name=\"{RESOURCE}\"");
        metrics
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(&label))
            .find_map(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Writes the static pod `name` asking for `gpus` of the plugin's resource.
    pub fn add_pod(&self, name: &str, gpus: usize) {
        self.write_pod(name, &json!({}), json!({RESOURCE: gpus.to_string()}));
    }

    /// Writes the static pod `name` with these annotations and no resource limits (a
    /// request gpupin reads, through NRI or the runtime handler).
    pub fn add_annotated_pod(&self, name: &str, annotations: &[(&str, &str)]) {
        let annotations: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        self.write_pod(name, &Value::Object(annotations), json!({}));
    }

    fn write_pod(&self, name: &str, annotations: &Value, limits: Value) {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "annotations": annotations},
            "spec": {
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": crate::cri_support::IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "100000"],
                    "resources": {"limits": limits},
                }],
            },
        });
        // The kubelet skips dot files: it never reads one half written.
        let temp = self.manifests.join(format!(".{name}.json"));
        std::fs::write(&temp, pod.to_string()).unwrap();
        std::fs::rename(&temp, self.manifests.join(format!("{name}.json"))).unwrap();
    }

    /// Deletes the static pod `name`'s manifest, as deleting the pod does.
    pub fn remove_pod(&self, name: &str) {
        std::fs::remove_file(self.manifests.join(format!("{name}.json"))).unwrap();
    }

    /// The pod-resources socket (`<root>/pod-resources/kubelet.sock`).
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root.join("pod-resources/kubelet.sock")
    }

    /// SIGTERM, then SIGKILL if it has not gone after a while; then the mounts it made
    /// under its root dir (it bind-mounts the root dir onto itself) are undone, so the
    /// temp dir can go.
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = rustix::process::Pid::from_child(&self.child);
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            for _ in 0..100 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        harness::unmount_under(&self.root);
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops and removes every pod sandbox the node's CRI lists when dropped, so that a
/// test, passed or failed, leaves no shim behind. Declare it before the kubelet: the
/// kubelet is dropped (stopped) first, or it would start its pods again.
pub struct SandboxSweep<'a>(pub &'a Node);

impl Drop for SandboxSweep<'_> {
    fn drop(&mut self) {
        let listed: Result<cri::ListPodSandboxResponse, _> = self
            .0
            .cri
            .call("ListPodSandbox", cri::ListPodSandboxRequest {});
        for sandbox in listed.map(|l| l.items).unwrap_or_default() {
            let _ = self.0.cri.stop_pod_sandbox(&sandbox.id);
            let _ = self.0.cri.remove_pod_sandbox(&sandbox.id);
        }
    }
}

/// `gpupin device-plugin` on the kubelet's plugin dir, SIGKILLed if still running when
/// dropped.
pub struct DevicePlugin {
    child: Child,
    log: PathBuf,
}

impl DevicePlugin {
    /// Starts it with the node's gpupin `config`, reading the kubelet's PodResources at
    /// `pod_resources`; a pod's holder is released by the reconcile once the kubelet has
    /// not listed it for `grace`. Its stderr is appended to `log`.
    pub fn start(config: &Path, pod_resources: &Path, log: PathBuf, grace: Duration) -> Self {
        let child = Command::new(harness::binary(env!("CARGO_BIN_EXE_gpupin")))
            .arg("--config")
            .arg(config)
            .arg("device-plugin")
            .arg("--pod-resources-socket")
            .arg(pod_resources)
            .args(["--poll-interval", "200ms", "--reconcile-interval", "200ms"])
            .arg("--reconcile-grace")
            .arg(format!("{}s", grace.as_secs()))
            .env("GPUPIN_LOG", "debug")
            .stdin(Stdio::null())
            .stderr(
                std::fs::File::options()
                    .create(true)
                    .append(true)
                    .open(&log)
                    .unwrap(),
            )
            .spawn()
            .expect("starting gpupin device-plugin");
        DevicePlugin { child, log }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, and its exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
        self.child.wait().unwrap()
    }
}

impl Drop for DevicePlugin {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The kubelet process, its log appended to `log`.
fn spawn(binary: &Path, config_file: &Path, root: &Path, log: &Path) -> Child {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(binary)
        .arg("--config")
        .arg(config_file)
        .arg("--root-dir")
        .arg(root)
        .arg("--cert-dir")
        .arg(root.join("pki"))
        .arg("--hostname-override")
        .arg(NODE)
        // Level 4: the device manager's GetPreferredAllocation and Allocate lines.
        .arg("-v=4")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting the kubelet")
}

/// The full name of static pod `name` on this node.
pub fn static_pod(name: &str) -> String {
    format!("{name}-{NODE}")
}

/// The device sets the kubelet's checkpoint records for the plugin's resource, each
/// sorted: one per container.
pub fn checkpoint_sets() -> BTreeSet<Vec<String>> {
    let path = Path::new(PLUGIN_DIR).join("kubelet_internal_checkpoint");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let checkpoint: Value = serde_json::from_str(&text).unwrap();
    checkpoint["Data"]["PodDeviceEntries"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["ResourceName"] == RESOURCE)
        .map(|e| {
            // DeviceIDs: NUMA node -> device ids.
            let mut ids: Vec<String> = e["DeviceIDs"]
                .as_object()
                .unwrap()
                .values()
                .flat_map(|v| v.as_array().unwrap().clone())
                .map(|v| v.as_str().unwrap().to_string())
                .collect();
            ids.sort();
            ids.dedup();
            ids
        })
        .collect()
}

/// A blocking gRPC client of the kubelet's PodResources API (`v1`).
pub struct PodResources {
    runtime: tokio::runtime::Runtime,
    grpc: tonic::client::Grpc<Channel>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatableResourcesRequest {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AllocatableResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub devices: Vec<gpupin_kubelet_api::podresources::ContainerDevices>,
}

impl PodResources {
    pub fn new(socket: &Path) -> PodResources {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let endpoint = Endpoint::from_shared(format!("unix://{}", socket.display()))
            .unwrap()
            .timeout(Duration::from_secs(60));
        let channel = {
            let _inside = runtime.enter();
            endpoint.connect_lazy()
        };
        PodResources {
            runtime,
            grpc: tonic::client::Grpc::new(channel),
        }
    }

    fn call<Q, A>(&self, method: &str, request: Q) -> A
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        let path = PathAndQuery::try_from(format!("/v1.PodResourcesLister/{method}")).unwrap();
        let mut grpc = self.grpc.clone();
        self.runtime
            .block_on(async {
                grpc.ready()
                    .await
                    .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
                let codec = tonic_prost::ProstCodec::<Q, A>::default();
                grpc.unary(tonic::Request::new(request), path, codec).await
            })
            .unwrap_or_else(|e| panic!("PodResources {method}: {e}"))
            .into_inner()
    }

    /// `List`: (pod, container) -> its devices of the plugin's resource, sorted; only
    /// containers holding some.
    pub fn list(&self) -> Vec<(String, String, Vec<String>)> {
        use gpupin_kubelet_api::podresources::{ListPodResourcesRequest, ListPodResourcesResponse};
        let answer: ListPodResourcesResponse = self.call("List", ListPodResourcesRequest {});
        let mut held = Vec::new();
        for pod in answer.pod_resources {
            for container in pod.containers {
                let mut ids: Vec<String> = container
                    .devices
                    .iter()
                    .filter(|d| d.resource_name == RESOURCE)
                    .flat_map(|d| d.device_ids.clone())
                    .collect();
                ids.sort();
                if !ids.is_empty() {
                    held.push((pod.name.clone(), container.name.clone(), ids));
                }
            }
        }
        held.sort();
        held
    }

    /// `GetAllocatableResources`: the devices the kubelet counts as healthy, sorted.
    pub fn allocatable(&self) -> Vec<String> {
        let answer: AllocatableResourcesResponse =
            self.call("GetAllocatableResources", AllocatableResourcesRequest {});
        let mut ids: Vec<String> = answer
            .devices
            .iter()
            .filter(|d| d.resource_name == RESOURCE)
            .flat_map(|d| d.device_ids.clone())
            .collect();
        ids.sort();
        ids
    }
}

/// The seconds of day of a klog line (`I1204 22:20:01.123456 ...`).
fn klog_time(line: &str) -> Option<f64> {
    let time = line.get(6..21)?;
    let (h, rest) = time.split_once(':')?;
    let (m, s) = rest.split_once(':')?;
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}

/// GetPreferredAllocation as the kubelet's log shows it: from each "Issuing a
/// GetPreferredAllocation call" line to the next "Making allocation request" line (the
/// answer came and the kubelet chose), in seconds.
pub fn preferred_allocation_latencies(log: &str) -> Vec<f64> {
    let mut issued = None;
    let mut latencies = Vec::new();
    for line in log.lines() {
        if line.contains("Issuing a GetPreferredAllocation call") {
            issued = klog_time(line);
        } else if line.contains("Making allocation request for device plugin")
            && let (Some(start), Some(end)) = (issued.take(), klog_time(line))
        {
            latencies.push(end - start);
        }
    }
    latencies
}

/// Waits (bounded by PATIENCE) until `found` gives something; panics with `context()`.
pub fn wait_for<T>(
    what: &str,
    mut found: impl FnMut() -> Option<T>,
    context: impl Fn() -> String,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(t) = found() {
            return t;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no {what} after {PATIENCE:?}:\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
