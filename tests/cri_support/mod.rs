//! A Kubernetes node as far as gpupin can tell: a private containerd with its CRI plugin
//! on and the runtime handler `gpupin` of k8s/containerd/gpupin-v2.toml (containerd 1.6,
//! Debian's) or, under `GPUPIN_ENGINES=modern`, k8s/containerd/gpupin-v3.toml (containerd
//! 2.x, imported as docs/integrations.md says), a busybox image
//! imported as the sandbox (pause) image and the containers' image, and a CRI client
//! that drives pods the way the kubelet does (host-network pods, so no CNI is needed).

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod api;
mod client;
pub mod image;

pub use client::Cri;

use crate::containerd_support::{Containerd, START_WAIT, assert_ran, is_v2, text};
use api::*;
use gpupin_sandbox::harness;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// The image of every pod here; imported, never pulled (no registry is reachable).
pub const IMAGE: &str = "gpupin.test/busybox:1";
/// The runtime handler a RuntimeClass names (`handler: gpupin`).
pub const HANDLER: &str = "gpupin";
/// The shipped containerd 1.6/1.7 config of the handler.
const HANDLER_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/containerd/gpupin-v2.toml");
/// The shipped containerd 2.x config of the handler, a drop-in for `imports`.
const HANDLER_CONFIG_V3: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/k8s/containerd/gpupin-v3.toml");
/// Where the shipped config expects gpupin-runtime; the test's own binary replaces it.
const INSTALLED_RUNTIME: &str = "/usr/bin/gpupin-runtime";

/// How often StopPodSandbox is asked before a test gives up (see `Pod::stop`).
const STOP_TRIES: u32 = 10;

pub struct Node {
    pub cri: Cri,
    pub containerd: Containerd,
}

impl Node {
    /// `None` where a requirement is missing (the test skips; under CI=true it fails).
    pub fn start(test: &str) -> Option<Node> {
        Node::start_with(test, false, |_| {})
    }

    /// `start`, with containerd 2.x's NRI on at `nri_socket` (`Node::nri_socket`);
    /// `plugins` is given NRI's plugin dir (`nri-plugins/`), made, before containerd
    /// starts (it starts the pre-installed plugins there).
    pub fn start_with_nri(test: &str, plugins: impl FnOnce(&Path)) -> Option<Node> {
        Node::start_with(test, true, plugins)
    }

    /// Where NRI plugins connect when `start_with_nri` started it.
    pub fn nri_socket(&self) -> std::path::PathBuf {
        self.containerd.dir().join("nri.sock")
    }

    fn start_with(test: &str, nri: bool, plugins: impl FnOnce(&Path)) -> Option<Node> {
        let containerd = Containerd::start(test, &["tar"], "", |dir| {
            let plugin_dir = dir.join("nri-plugins");
            std::fs::create_dir_all(&plugin_dir).unwrap();
            plugins(&plugin_dir);
            containerd_config(dir, nri)
        })?;
        let archive = image::busybox_archive(containerd.dir(), IMAGE);
        let archive = archive.to_str().unwrap();
        assert_ran(
            "ctr images import",
            &containerd.ctr(&["-n", "k8s.io", "images", "import", archive]),
        );
        let cri = Cri::new(&containerd.socket);
        let node = Node { cri, containerd };
        node.wait_for_cri();
        Some(node)
    }

    /// The CRI plugin answers after containerd itself: a readiness wait.
    fn wait_for_cri(&self) {
        let started = Instant::now();
        while let Err(e) = self.cri.version() {
            let log = self.containerd.log();
            assert!(
                !log.contains("failed to load plugin io.containerd.grpc.v1.cri"),
                "containerd refused its CRI config: {log}"
            );
            assert!(
                started.elapsed() < START_WAIT,
                "the CRI did not answer: {e}\n{}",
                self.containerd.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs pod `name` (namespace `default`) with these annotations through the handler.
    pub fn run_pod(&self, name: &str, annotations: &[(&str, &str)]) -> Pod<'_> {
        self.run_pod_on(name, annotations, HANDLER)
    }

    /// `run_pod` through runtime handler `handler` (`""`: containerd's default, runc).
    pub fn run_pod_on(&self, name: &str, annotations: &[(&str, &str)], handler: &str) -> Pod<'_> {
        let config = sandbox_config(name, annotations);
        let id = self
            .cri
            .run_pod_sandbox(&config, handler)
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}\n{}", self.containerd.log()));
        Pod {
            node: self,
            id,
            config,
            removed: false,
        }
    }

    pub fn status(&self) -> serde_json::Value {
        self.containerd.status()
    }

    /// The holders `gpupin status` lists.
    pub fn holders(&self) -> Vec<serde_json::Value> {
        self.status()["holders"].as_array().unwrap().clone()
    }

    /// The one holder `id`, which must be there.
    pub fn holder(&self, id: &str) -> serde_json::Value {
        let all = self.holders();
        all.iter()
            .find(|h| h["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} holds nothing: {all:#?}"))
    }

    /// The `nvidia<minor>` nodes of the GPUs `id` holds, as `gpupin status` lists them,
    /// sorted; none when it holds nothing.
    pub fn held_nodes(&self, id: &str) -> Vec<String> {
        let mut nodes: Vec<String> = harness::status::held_minors(&self.status(), id)
            .iter()
            .map(|m| format!("nvidia{m}"))
            .collect();
        nodes.sort();
        nodes
    }

    /// `gpupin nri` connected to this node's NRI socket (`start_with_nri`), logging to
    /// `log` in its dir; returns once the runtime has configured it (it synchronizes
    /// next, and sends events from then on).
    pub fn start_nri_plugin(&self, log: &str) -> NriPlugin {
        NriPlugin::spawn(
            gpupin_nri(&self.containerd.gpupin.config, &self.nri_socket()),
            self.containerd.dir().join(log),
            "configured",
            || self.containerd.log(),
        )
    }
}

/// `gpupin --config CONFIG nri --socket SOCKET`, logging at info level.
pub fn gpupin_nri(config: &Path, socket: &Path) -> std::process::Command {
    let mut command = std::process::Command::new(harness::binary(env!("CARGO_BIN_EXE_gpupin")));
    command
        .env_remove("GPUPIN_CONFIG")
        .env("GPUPIN_LOG", "info")
        .arg("--config")
        .arg(config)
        .args(["nri", "--socket"])
        .arg(socket);
    command
}

/// NVIDIA's NRI plugin as tests/peers/build built it (`nvidia-nri`), or why it is not
/// there.
pub fn nvidia_nri_binary() -> Result<std::path::PathBuf, String> {
    let bin = harness::toolkit::peers_cache()?.join("nvidia-nri/nvidia-nri");
    match bin.exists() {
        true => Ok(bin),
        false => Err(format!(
            "no {}: run tests/peers/build (needs Go)",
            bin.display()
        )),
    }
}

impl Node {
    /// NVIDIA's NRI plugin (`binary`, from `nvidia_nri_binary`) connected to this node's
    /// NRI socket with `index` (NVIDIA's installer's default is 10), logging to `log` in
    /// its dir; returns once it has registered.
    pub fn start_nvidia_nri_plugin(&self, binary: &Path, index: u32, log: &str) -> NriPlugin {
        let mut command = std::process::Command::new(binary);
        command
            .arg("-socket")
            .arg(self.nri_socket())
            .arg("-index")
            .arg(index.to_string());
        NriPlugin::spawn(
            command,
            self.containerd.dir().join(log),
            "registered on",
            || self.containerd.log(),
        )
    }
}

/// `gpupin nri` (`Node::start_nri_plugin`), or NVIDIA's; killed when dropped.
pub struct NriPlugin {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl NriPlugin {
    /// Runs `command` (a plugin that dials the runtime's NRI socket) with its stderr in
    /// `log`, and returns once the log says `ready`; `runtime_log` is said beside it when
    /// it never does.
    pub fn spawn(
        mut command: std::process::Command,
        log: std::path::PathBuf,
        ready: &str,
        runtime_log: impl Fn() -> String,
    ) -> NriPlugin {
        let child = command
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let plugin = NriPlugin { child, log };
        let started = Instant::now();
        while !plugin.log().contains(ready) {
            assert!(
                started.elapsed() < START_WAIT,
                "the NRI plugin did not register: {}\n{}",
                plugin.log(),
                runtime_log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        plugin
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A container's config as the kubelet sends it: `name` running `command` (none: the
/// image's) with `env` besides the image's, its own annotations and CDI devices.
pub fn container_config(
    name: &str,
    env: &[(&str, &str)],
    command: &[&str],
    annotations: &[(&str, &str)],
    cdi_devices: &[&str],
) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: IMAGE.into(),
            user_specified_image: IMAGE.into(),
        }),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespaces()),
            }),
        }),
        command: command.iter().map(|c| c.to_string()).collect(),
        envs: env
            .iter()
            .map(|(key, value)| KeyValue {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        cdi_devices: cdi_devices
            .iter()
            .map(|name| CdiDevice {
                name: name.to_string(),
            })
            .collect(),
    }
}

/// The plain config the kubelet sends for a host-network pod without a shared process
/// namespace.
pub fn sandbox_config(name: &str, annotations: &[(&str, &str)]) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            namespace: "default".into(),
            attempt: 0,
        }),
        // A host-network pod shares the host's UTS namespace: no hostname of its own.
        hostname: String::new(),
        labels: HashMap::new(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
            }),
        }),
    }
}

/// Host network (no CNI needed); each container its own pid namespace, so its command
/// is its pid 1.
fn namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
    }
}

/// A running pod; stopped and removed when dropped, so that a failed test leaves no
/// container (and no shim) behind.
pub struct Pod<'a> {
    node: &'a Node,
    /// The sandbox's id: the pause container's id in containerd.
    pub id: String,
    config: PodSandboxConfig,
    removed: bool,
}

impl Pod<'_> {
    /// Creates container `name` running `command` (none: the image's `sleep`) with `env`
    /// besides the image's; `Err` is the CRI's answer.
    pub fn create_container(
        &self,
        name: &str,
        env: &[(&str, &str)],
        command: &[&str],
    ) -> Result<String, tonic::Status> {
        self.create_container_with(name, env, command, &[], &[])
    }

    /// `create_container` with the container's own annotations and CDI devices (the CRI
    /// fields the kubelet fills from a device plugin's answer).
    pub fn create_container_with(
        &self,
        name: &str,
        env: &[(&str, &str)],
        command: &[&str],
        annotations: &[(&str, &str)],
        cdi_devices: &[&str],
    ) -> Result<String, tonic::Status> {
        let config = container_config(name, env, command, annotations, cdi_devices);
        self.node
            .cri
            .create_container(&self.id, config, &self.config)
    }

    /// Creates and starts container `name`, which must succeed; its id.
    pub fn start_container(&self, name: &str, env: &[(&str, &str)], command: &[&str]) -> String {
        let log = || self.node.containerd.log();
        let id = self
            .create_container(name, env, command)
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e}\n{}", log()));
        self.node
            .cri
            .start_container(&id)
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e}\n{}", log()));
        id
    }

    /// What `cmd` prints in `container` (`kubectl exec`), which must exit 0.
    pub fn exec(&self, container: &str, cmd: &[&str]) -> String {
        let out = self
            .node
            .cri
            .exec_sync(container, cmd)
            .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e}"));
        assert_eq!(
            out.exit_code,
            0,
            "{cmd:?}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// The GPU nodes in the container's /dev, listed by a process exec'd into it, sorted.
    pub fn gpu_nodes(&self, container: &str) -> Vec<String> {
        let mut nodes =
            harness::gpu_nodes(self.exec(container, &["ls", "/dev"]).split_whitespace());
        nodes.sort();
        nodes
    }

    /// The UUIDs in `NVIDIA_VISIBLE_DEVICES` of the container's own process, sorted.
    pub fn visible_uuids(&self, container: &str) -> Vec<String> {
        let visible = self
            .main_process_env(container, "NVIDIA_VISIBLE_DEVICES")
            .expect("NVIDIA_VISIBLE_DEVICES in the container's env");
        let mut visible: Vec<String> = visible.split(',').map(str::to_string).collect();
        visible.sort();
        visible
    }

    /// `NAME=` of the container's own process (its pid 1), not of an exec'd one.
    pub fn main_process_env(&self, container: &str, name: &str) -> Option<String> {
        let environ = self.exec(container, &["cat", "/proc/1/environ"]);
        environ
            .split('\0')
            .find_map(|v| v.strip_prefix(&format!("{name}=")).map(str::to_string))
    }

    /// StopPodSandbox: every container of the pod and the sandbox are stopped. Tried
    /// again, as the kubelet does: containerd 1.6 can answer `ttrpc: closed` for a
    /// container whose shim is going away after it exited, and the next call finds it
    /// stopped.
    pub fn stop(&self) {
        let mut last = None;
        for _ in 0..STOP_TRIES {
            match self.node.cri.stop_pod_sandbox(&self.id) {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        panic!(
            "StopPodSandbox, {STOP_TRIES} tries: {}\n{}",
            last.map(|e| e.to_string()).unwrap_or_default(),
            self.node.containerd.log()
        );
    }

    /// RemovePodSandbox: the pod and its containers are gone.
    pub fn remove(mut self) {
        self.removed = true;
        self.node
            .cri
            .remove_pod_sandbox(&self.id)
            .unwrap_or_else(|e| panic!("RemovePodSandbox: {e}\n{}", self.node.containerd.log()));
    }
}

impl Drop for Pod<'_> {
    fn drop(&mut self) {
        if !self.removed {
            let _ = self.node.cri.stop_pod_sandbox(&self.id);
            let _ = self.node.cri.remove_pod_sandbox(&self.id);
        }
    }
}

/// containerd's config: the CRI plugin with this temp dir's CNI dirs (empty: host-network
/// pods need none), the imported image as sandbox image, and the shipped handler config
/// naming the gpupin-runtime under test.
fn containerd_config(dir: &Path, nri: bool) -> String {
    let shipped = if is_v2() {
        HANDLER_CONFIG_V3
    } else {
        HANDLER_CONFIG
    };
    let runtime = harness::binary(env!("CARGO_BIN_EXE_gpupin-runtime"));
    let text = std::fs::read_to_string(shipped).unwrap();
    assert!(
        text.contains(INSTALLED_RUNTIME),
        "{shipped} names no {INSTALLED_RUNTIME}"
    );
    let handler = text.replace(INSTALLED_RUNTIME, runtime.to_str().unwrap());
    let (cni_bin, cni_conf) = (dir.join("cni-bin"), dir.join("cni-conf"));
    for d in [&cni_bin, &cni_conf] {
        std::fs::create_dir_all(d).unwrap();
    }
    if is_v2() {
        return containerd_config_v3(dir, &handler, &cni_bin, &cni_conf, nri);
    }
    format!(
        "version = 2\n\
         [plugins.\"io.containerd.grpc.v1.cri\"]\n\
         \x20 sandbox_image = \"{IMAGE}\"\n\
         \x20 # The host may have AppArmor without apparmor_parser.\n\
         \x20 disable_apparmor = true\n\
         \x20 # The sandbox's oom_score_adj is -998; lowering it needs CAP_SYS_RESOURCE, which\n\
         \x20 # a test machine (a container, a VM's jail) may lack: keep it at ours.\n\
         \x20 restrict_oom_score_adj = true\n\
         # containerd's default runtime, which a config naming any runtime must define.\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
         \x20 runtime_type = \"io.containerd.runc.v2\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
         \x20 bin_dir = {cni_bin:?}\n\
         \x20 conf_dir = {cni_conf:?}\n\
         [plugins.\"io.containerd.internal.v1.opt\"]\n\
         \x20 path = {opt:?}\n\
         {handler}",
        opt = dir.join("opt"),
    )
}

/// containerd 2.x's config (version 3): the same settings under the plugins 2.x splits
/// the CRI into (`io.containerd.cri.v1.images`, `io.containerd.cri.v1.runtime`), and the
/// shipped handler as the drop-in docs/integrations.md describes, in `imports`. CDI is on (2.x's
/// default) with this temp dir's spec dir, so that a test can put NVIDIA's spec there.
fn containerd_config_v3(
    dir: &Path,
    handler: &str,
    cni_bin: &Path,
    cni_conf: &Path,
    nri: bool,
) -> String {
    let drop_in = dir.join("conf.d/gpupin.toml");
    std::fs::create_dir_all(drop_in.parent().unwrap()).unwrap();
    std::fs::write(&drop_in, handler).unwrap();
    let cdi = cdi_dir(dir);
    std::fs::create_dir_all(&cdi).unwrap();
    let nri_socket = nri.then(|| dir.join("nri.sock"));
    crate::containerd_support::config_with_nri(
        &format!("imports = [{drop_in:?}]\n"),
        &format!(
            "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n\
             \x20 sandbox = \"{IMAGE}\"\n\
             [plugins.'io.containerd.cri.v1.runtime']\n\
             \x20 disable_apparmor = true\n\
             \x20 restrict_oom_score_adj = true\n\
             \x20 enable_cdi = true\n\
             \x20 cdi_spec_dirs = [{cdi:?}]\n\
             [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n\
             \x20 runtime_type = 'io.containerd.runc.v2'\n\
             [plugins.'io.containerd.cri.v1.runtime'.cni]\n\
             \x20 bin_dirs = [{cni_bin:?}]\n\
             \x20 conf_dir = {cni_conf:?}\n"
        ),
        nri_socket.as_deref(),
    )
}

/// The CDI spec dir of containerd 2.x's CRI here (`enable_cdi`).
pub fn cdi_dir(containerd_dir: &Path) -> std::path::PathBuf {
    containerd_dir.join("cdi")
}

/// A holder's GPU UUIDs, sorted.
pub fn uuids(holder: &serde_json::Value) -> Vec<String> {
    let mut gpus: Vec<String> = holder["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_string())
        .collect();
    gpus.sort();
    gpus
}
