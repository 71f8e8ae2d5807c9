//! A private dockerd for the end-to-end tests and the docker_start bench: started once
//! per test or bench binary, with its own data root, exec root, socket and daemon.json in
//! a temp dir, and stopped when the binary exits (also after a panic: an atexit handler).
//!
//! Parallel tests share the dockerd but not a ledger: daemon.json registers a pool of
//! runtimes `gpupin-s0`..`gpupin-s15`, each gpupin-runtime with its own config and state
//! dir, and every test takes a slot of its own. The compose examples name the runtime
//! `gpupin`, so that one entry is shared and its users take `compose_slot()`, which
//! serializes them. gpupin-runtime reads its config on every call, so a test may
//! rewrite its slot's config (e.g. `runtime = wrapper`) without reloading dockerd.
//!
//! The skip rule, the rootfs, PATH lookups, status queries and the GPU-node filter are
//! gpupin-sandbox's, shared with the other suites; so is the engines' generation
//! (`GPUPIN_ENGINES=modern`: dockerd 29, its containerd 2.x and runc 1.5, compose v5 from
//! the peers' cache, see `harness::engines`), which every docker/dockerd/compose command
//! here runs with.

#![allow(dead_code)] // each test binary uses a different part of the harness

use gpupin_sandbox::harness::driver::{DriverRoot, FakeGpu};
use gpupin_sandbox::harness::{self, engines, status};
#[allow(unused_imports)] // like dead_code above: not every test binary says something
pub use gpupin_sandbox::harness::{gpu_nodes, say, text};
use gpupin_sandbox::{build_busybox_rootfs, find_on_path, find_static_busybox, is_root};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

pub const IMAGE: &str = "busybox:gpupin-test";
/// gpupin-runtime, as cargo built it or from `$GPUPIN_BIN_DIR`.
pub fn runtime_bin() -> String {
    gpupin_sandbox::harness::binary(env!("CARGO_BIN_EXE_gpupin-runtime"))
        .to_str()
        .unwrap()
        .to_string()
}

/// gpupin, as cargo built it or from `$GPUPIN_BIN_DIR`.
pub fn gpupin_bin() -> PathBuf {
    gpupin_sandbox::harness::binary(env!("CARGO_BIN_EXE_gpupin"))
}
const SLOTS: usize = 16;
const DIR_PREFIX: &str = "gpupin-docker-e2e.";
/// How long dockerd may take to answer after it starts (a readiness wait, no assertion).
const START_WAIT: Duration = Duration::from_secs(90);

/// What a test needs from the machine.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// root, dockerd, docker, runc, busybox
    Docker,
    /// all of `Docker`, and docker-compose
    Compose,
}

/// How a test binary's dockerd is set up (one flavor per binary).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Flavor {
    /// No CDI spec: `--gpus` goes through NVIDIA's runtime hook (the stand-in).
    Plain,
    /// Docker's own CDI resolution (Docker 28+): see `cdi_harness`.
    Cdi,
}

/// `Some(harness)`, or `None` after printing why the test is skipped. Under CI=true a
/// missing requirement fails the test instead: CI must not pass by skipping.
pub fn harness(test: &str, need: Need) -> Option<&'static Harness> {
    launch_once(test, need, Flavor::Plain)
}

/// The harness with Docker's CDI device resolution, as on a GPU server with NVIDIA's
/// toolkit 1.17+ and Docker 28.2+ (CDI on by default): daemon.json's `cdi-spec-dirs`
/// names a dir holding the CDI spec of the simulated GPUs (a fake driver root's in
/// nvidia-ctk's form, `harness::driver`), and `nvidia-cdi-hook` (that root's stand-in) is
/// on dockerd's PATH, so dockerd resolves `--gpus N` as CDI devices nvidia.com/gpu=0..N-1
/// (its daemon/devices_nvidia_linux.go tries CDI before the runtime hook) and
/// `--device nvidia.com/gpu=...` from the spec. Docker 20.10 (Debian's) has no CDI: there
/// the test says so and returns `None`; the modern pass (`GPUPIN_ENGINES=modern`) runs it.
pub fn cdi_harness(test: &str, need: Need) -> Option<&'static Harness> {
    if engines::generation() == engines::Generation::Debian {
        say(&format!(
            "{test}: not for Debian's dockerd 20.10, which has no CDI: it runs with GPUPIN_ENGINES=modern (dockerd 29)"
        ));
        return None;
    }
    launch_once(test, need, Flavor::Cdi)
}

fn launch_once(test: &str, need: Need, flavor: Flavor) -> Option<&'static Harness> {
    let found = match missing(need) {
        Some(reason) => Err(reason),
        None => Ok(()),
    };
    harness::required(test, found)?;
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    let h = HARNESS.get_or_init(|| Harness::launch(flavor));
    assert_eq!(h.flavor, flavor, "one dockerd flavor per test binary");
    Some(h)
}

/// What the machine lacks for `need`, if anything. The bench asks this itself: it says
/// why and exits 0 where a test would fail under CI=true.
pub fn missing(need: Need) -> Option<String> {
    if !is_root() {
        return Some("needs root (dockerd, runc)".into());
    }
    let mut tools = vec!["dockerd", "docker", "runc", "busybox", "tar"];
    if need == Need::Compose {
        tools.push("docker-compose");
    }
    if let Err(reason) = engines::check(&tools) {
        return Some(reason);
    }
    let absent: Vec<_> = tools
        .into_iter()
        .filter(|t| find_on_path(t).is_none())
        .collect();
    if !absent.is_empty() {
        return Some(format!("not on PATH: {}", absent.join(", ")));
    }
    find_static_busybox().err()
}

pub struct Harness {
    pub dir: PathBuf,
    pub host: String,
    pub rootfs: PathBuf,
    pub bin: PathBuf,
    /// The simulated GPUs of the CDI spec dockerd resolves devices from (`cdi_harness`).
    pub cdi_gpus: Vec<FakeGpu>,
    flavor: Flavor,
    next_slot: AtomicUsize,
    compose_lock: Mutex<()>,
}

/// The dockerd child, stopped by the atexit handler.
static DOCKERD: Mutex<Option<(Child, PathBuf)>> = Mutex::new(None);

impl Harness {
    fn launch(flavor: Flavor) -> Harness {
        harness::announce_engines();
        reap_stale_instances();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir_in("/tmp")
            .expect("temp dir for dockerd")
            .keep();
        // Marks whose dockerd this is: a later run reaps it only once we are gone.
        write(&dir.join("owner.pid"), &std::process::id().to_string());
        let mut harness = Harness {
            host: format!("unix://{}", dir.join("docker.sock").display()),
            rootfs: dir.join("rootfs"),
            bin: dir.join("bin"),
            dir,
            cdi_gpus: Vec::new(),
            flavor,
            next_slot: AtomicUsize::new(0),
            compose_lock: Mutex::new(()),
        };
        harness.write_files();
        harness.start_dockerd();
        harness.import_image();
        harness
    }

    fn write_files(&mut self) {
        let busybox = find_static_busybox().expect("checked by harness()");
        build_busybox_rootfs(&busybox, &self.rootfs).expect("building the image's rootfs");
        std::fs::create_dir_all(&self.bin).unwrap();
        // dockerd accepts `--gpus` only when this executable is on its PATH (Docker's
        // daemon/nvidia_linux.go registers the NVIDIA device driver then). It becomes a
        // prestart hook of such containers. The stand-in logs, per container, every
        // NVIDIA_VISIBLE_DEVICES it finds in the bundle's config.json, which is what
        // NVIDIA's hook reads (`nvidia_hook_saw`).
        let log = self.dir.join("nvidia-hook.log");
        write_script(
            &self.bin.join("nvidia-container-runtime-hook"),
            &format!(
                "PATH=/usr/sbin:/usr/bin:/sbin:/bin\nstate=$(cat)\n\
                 id=$(printf '%s' \"$state\" | sed -n 's/.*\"id\":\"\\([^\"]*\\)\".*/\\1/p')\n\
                 bundle=$(printf '%s' \"$state\" | sed -n 's/.*\"bundle\":\"\\([^\"]*\\)\".*/\\1/p')\n\
                 seen=$(grep -o 'NVIDIA_VISIBLE_DEVICES=[^\"]*' \"$bundle/config.json\" | tr '\\n' ' ')\n\
                 echo \"$id $seen\" >> {}\nexit 0\n",
                log.display()
            ),
        );
        let mut runtimes = serde_json::Map::new();
        let mut add = |name: String, slot: &Slot, path: &str| {
            slot.reset_config(None);
            runtimes.insert(
                name,
                json!({"path": path, "runtimeArgs": ["--gpupin-config", slot.config]}),
            );
        };
        let runtime = runtime_bin();
        for i in 0..SLOTS {
            add(
                format!("gpupin-s{i}"),
                &self.slot_named(&format!("s{i}")),
                &runtime,
            );
        }
        let capture = self.slot_named("capture");
        let pre = self.bin.join("capture-pre");
        write_capture_script(&pre, &capture.dir.join("specs"), "pre", &runtime);
        add("gpupin-capture".into(), &capture, pre.to_str().unwrap());
        // `gpupin` as `gpupin install docker` registers it with the default config: no
        // runtimeArgs, which dockerd (20.10) would run through a /bin/sh wrapper it writes
        // for every runtime call. Its config comes from dockerd's environment
        // (GPUPIN_CONFIG, inherited by containerd, the shim and the runtime).
        let compose = self.slot_named("compose");
        compose.reset_config(None);
        runtimes.insert("gpupin".into(), json!({ "path": runtime }));
        let mut daemon_json = json!({ "runtimes": runtimes });
        if self.flavor == Flavor::Cdi {
            let cdi = self.write_cdi_spec();
            daemon_json["cdi-spec-dirs"] = json!([cdi]);
        }
        write(&self.dir.join("daemon.json"), &daemon_json.to_string());
    }

    /// The simulated machine's CDI spec (every slot has the same `sim:nvswitch8`), in a
    /// dir of its own, and the fake driver root's stand-in `nvidia-cdi-hook` on dockerd's
    /// PATH; the spec dir.
    fn write_cdi_spec(&mut self) -> PathBuf {
        let gpus = FakeGpu::from_status(&self.slot_named("compose").status());
        let root = DriverRoot::create(&self.dir.join("driver"), &gpus).unwrap();
        let cdi = self.dir.join("cdi");
        std::fs::create_dir_all(&cdi).unwrap();
        root.write_cdi_spec(&cdi, &gpus).unwrap();
        std::os::unix::fs::symlink(&root.hook, self.bin.join("nvidia-cdi-hook")).unwrap();
        self.cdi_gpus = gpus;
        cdi
    }

    fn start_dockerd(&self) {
        let d = &self.dir;
        let log = std::fs::File::create(d.join("dockerd.log")).unwrap();
        let path = format!(
            "{}:{}",
            self.bin.display(),
            engines::path().to_string_lossy()
        );
        let child = engines::command("dockerd")
            .arg("--data-root")
            .arg(d.join("root"))
            .arg("--exec-root")
            .arg(d.join("exec"))
            .arg("-H")
            .arg(&self.host)
            .arg("--pidfile")
            .arg(d.join("docker.pid"))
            .arg("--config-file")
            .arg(d.join("daemon.json"))
            // vfs: works on any backing filesystem, and the image is one small file.
            .args([
                "--storage-driver",
                "vfs",
                "--bridge=none",
                "--iptables=false",
                "--ip6tables=false",
            ])
            .env("PATH", path)
            .env("GPUPIN_CONFIG", self.slot_named("compose").config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting dockerd");
        *DOCKERD.lock().unwrap() = Some((child, d.clone()));
        // SAFETY: registers a plain extern "C" fn; it runs once at process exit.
        unsafe { libc::atexit(stop_dockerd) };
        self.wait_ready();
    }

    fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            if self
                .docker()
                .args(["version"])
                .output()
                .is_ok_and(|o| o.status.success())
            {
                return;
            }
            let exited = DOCKERD
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|(c, _)| c.try_wait().ok().flatten());
            if exited.is_some() || start.elapsed() > START_WAIT {
                let log = std::fs::read_to_string(self.dir.join("dockerd.log")).unwrap_or_default();
                panic!("dockerd did not come up ({exited:?}); its log:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn import_image(&self) {
        let tar = self.dir.join("rootfs.tar");
        ok(Command::new("tar")
            .arg("-C")
            .arg(&self.rootfs)
            .arg("-cf")
            .arg(&tar)
            .arg("."));
        ok(self
            .docker()
            .args(["import", "-c", "ENV PATH=/bin"])
            .arg(&tar)
            .arg(IMAGE));
    }

    /// `docker` talking to this harness's dockerd.
    pub fn docker(&self) -> Command {
        let mut cmd = engines::command("docker");
        cmd.env("DOCKER_HOST", &self.host);
        cmd
    }

    /// `docker-compose -p PROJECT -f FILE` against this dockerd.
    pub fn compose(&self, project: &str, file: &Path) -> Command {
        let mut cmd = engines::command("docker-compose");
        cmd.env("DOCKER_HOST", &self.host)
            .arg("-p")
            .arg(project)
            .arg("-f")
            .arg(file);
        cmd
    }

    /// Every NVIDIA_VISIBLE_DEVICES entry NVIDIA's prestart hook (the stand-in Docker
    /// adds for `--gpus`) found in container `id`'s config.json, in order.
    pub fn nvidia_hook_saw(&self, id: &str) -> Vec<String> {
        let log = std::fs::read_to_string(self.dir.join("nvidia-hook.log")).unwrap_or_default();
        log.lines()
            .filter_map(|line| line.split_once(' '))
            .filter(|(logged, _)| *logged == id)
            .flat_map(|(_, seen)| {
                seen.split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// A runtime entry with a ledger of its own, used by this test only.
    pub fn slot(&self) -> Slot {
        let i = self.next_slot.fetch_add(1, Ordering::SeqCst);
        assert!(i < SLOTS, "more than {SLOTS} slots taken: raise SLOTS");
        let mut slot = self.slot_named(&format!("s{i}"));
        slot.runtime = format!("gpupin-s{i}");
        slot
    }

    /// The `gpupin` runtime the compose examples name; held until the guard drops.
    pub fn compose_slot(&self) -> (MutexGuard<'_, ()>, Slot) {
        let guard = self.compose_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut slot = self.slot_named("compose");
        slot.runtime = "gpupin".into();
        (guard, slot)
    }

    /// The runtime whose entry is a wrapper saving Docker's spec before gpupin edits it,
    /// to `capture/specs/<container id>.pre.json`. One test uses it.
    pub fn capture_slot(&self) -> Slot {
        let mut slot = self.slot_named("capture");
        slot.runtime = "gpupin-capture".into();
        slot
    }

    fn slot_named(&self, name: &str) -> Slot {
        let dir = self.dir.join("slots").join(name);
        Slot {
            runtime: String::new(),
            config: dir.join("config.toml"),
            state: dir.join("state"),
            dir,
        }
    }

    /// `docker run -d` of a sleeping container; removed (rm -f) when the guard drops.
    pub fn start(&self, runtime: &str, args: &[&str]) -> Container<'_> {
        let out = self.run_detached(runtime, args);
        assert!(
            out.status.success(),
            "docker run failed: {}",
            text(&out.stderr)
        );
        Container {
            harness: self,
            id: text(&out.stdout).trim().to_string(),
        }
    }

    /// `docker run -d --network none --runtime R ARGS IMAGE sleep`, as it came out.
    pub fn run_detached(&self, runtime: &str, args: &[&str]) -> Output {
        self.docker()
            .args(["run", "-d", "--network", "none", "--runtime", runtime])
            .args(args)
            .args([IMAGE, "sleep", "1000000"])
            .output()
            .unwrap()
    }
}

/// A gpupin runtime entry: its name in daemon.json, its config and its ledger.
pub struct Slot {
    pub runtime: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub state: PathBuf,
}

impl Slot {
    /// Writes the slot's gpupin config; `runtime`: the real runtime (default runc).
    pub fn reset_config(&self, runtime: Option<&Path>) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let mut text = format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch8\"\n",
            self.state.display().to_string(),
            self.state.join("audit.log").display().to_string()
        );
        if let Some(r) = runtime {
            text.push_str(&format!("runtime = {:?}\n", r.display().to_string()));
        }
        write(&self.config, &text);
    }

    /// `gpupin status --json` for this slot's ledger.
    pub fn status(&self) -> Value {
        status::query(&gpupin_bin(), &self.config)
    }

    /// Holder id -> its GPU UUIDs.
    pub fn holders(&self) -> BTreeMap<String, Vec<String>> {
        status::holdings(&self.status())
    }

    /// GPU UUID -> device minor, from the slot's inventory.
    pub fn minors(&self) -> BTreeMap<String, u64> {
        status::minors(&self.status())
    }

    /// UUID of the GPU with this index.
    pub fn uuid_of(&self, index: u64) -> String {
        status::uuid_of(&self.status(), index)
    }
}

/// A running container, force-removed on drop so no test leaks one.
pub struct Container<'h> {
    harness: &'h Harness,
    pub id: String,
}

impl Container<'_> {
    /// `docker exec` output (stdout); panics with stderr on failure.
    pub fn exec(&self, cmd: &[&str]) -> String {
        ok(self.harness.docker().arg("exec").arg(&self.id).args(cmd))
    }

    /// The container's main process env as the process sees it (`docker exec env` would
    /// show Docker's config instead, without gpupin's edits).
    pub fn init_env(&self) -> Vec<String> {
        let raw = self.exec(&["cat", "/proc/1/environ"]);
        raw.split('\0')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }

    /// `nvidia<N>` device nodes in the container's /dev.
    pub fn gpu_nodes(&self) -> Vec<String> {
        gpu_nodes(self.exec(&["ls", "/dev"]).split_whitespace())
    }

    /// NVIDIA_VISIBLE_DEVICES of the main process, split at commas.
    pub fn visible(&self) -> Vec<String> {
        visible(&self.init_env())
    }
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = self.harness.docker().args(["rm", "-f", &self.id]).output();
    }
}

/// Runs `docker-compose down` for a project on drop, also when the test fails.
pub struct ComposeProject<'h> {
    pub harness: &'h Harness,
    pub project: String,
    pub file: PathBuf,
}

impl ComposeProject<'_> {
    pub fn cmd(&self) -> Command {
        self.harness.compose(&self.project, &self.file)
    }

    /// Container ids of the project (`docker-compose ps -q`).
    pub fn ids(&self) -> Vec<String> {
        ok(self.cmd().args(["ps", "-q"]))
            .lines()
            .map(String::from)
            .collect()
    }
}

impl Drop for ComposeProject<'_> {
    fn drop(&mut self) {
        let _ = self.cmd().args(["down", "--timeout", "1"]).output();
    }
}

pub fn visible(env: &[String]) -> Vec<String> {
    let values: Vec<_> = env
        .iter()
        .filter_map(|e| e.strip_prefix("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    assert!(
        values.len() <= 1,
        "NVIDIA_VISIBLE_DEVICES set {} times: {env:?}",
        values.len()
    );
    values
        .first()
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default()
}

/// Runs `cmd`, panics with its stderr unless it succeeds; returns stdout.
pub fn ok(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

pub fn write(path: &Path, content: &str) {
    std::fs::write(path, content).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

pub fn write_script(path: &Path, body: &str) {
    write(path, &format!("#!/bin/sh\n{body}"));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A runtime wrapper: on `create` it copies bundle/config.json to
/// `<dest>/<bundle dir name>.<tag>.json` (Docker names the bundle dir after the
/// container id), then execs `next` with every argument unchanged.
pub fn write_capture_script(path: &Path, dest: &Path, tag: &str, next: &str) {
    std::fs::create_dir_all(dest).unwrap();
    let body = format!(
        r#"prev= bundle= create=
for a in "$@"; do
  [ "$prev" = --bundle ] && bundle=$a
  [ "$a" = create ] && create=1
  prev=$a
done
if [ -n "$create" ] && [ -n "$bundle" ]; then
  cp "$bundle/config.json" "{dest}/$(basename "$bundle").{tag}.json"
fi
exec {next} "$@"
"#,
        dest = dest.display()
    );
    write_script(path, &body);
}

/// Stops our dockerd at process exit: containers first (their shims would outlive
/// dockerd), then dockerd, then its directory.
extern "C" fn stop_dockerd() {
    let Some((mut child, dir)) = DOCKERD.lock().ok().and_then(|mut d| d.take()) else {
        return;
    };
    let host = format!("unix://{}", dir.join("docker.sock").display());
    remove_all_containers(&host);
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    unmount_netns(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// dockerd bind-mounts the host's network namespace at `exec/netns/default` once a
/// container has used `--network host` (tests/jupyterhub_e2e.rs), and leaves it mounted
/// when it stops: detach it, or the directory cannot be removed (EBUSY).
fn unmount_netns(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("exec/netns")) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(path) = std::ffi::CString::new(entry.path().into_os_string().into_encoded_bytes())
        else {
            continue;
        };
        // SAFETY: umount2(2) on a NUL-terminated path; failure (not a mount) is harmless.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

fn remove_all_containers(host: &str) {
    let Ok(out) = engines::command("docker")
        .env("DOCKER_HOST", host)
        .args(["ps", "-aq"])
        .output()
    else {
        return;
    };
    let ids: Vec<String> = text(&out.stdout)
        .split_whitespace()
        .map(String::from)
        .collect();
    if !ids.is_empty() {
        let _ = engines::command("docker")
            .env("DOCKER_HOST", host)
            .arg("rm")
            .arg("-f")
            .args(&ids)
            .output();
    }
}

/// A run killed before its atexit handler (SIGKILL, a debugger) leaves a dockerd
/// behind; reap those whose owning test process is gone. Another live test binary's
/// dockerd is left alone.
fn reap_stale_instances() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_ours = entry.file_name().to_string_lossy().starts_with(DIR_PREFIX);
        if is_ours && !pid_alive(&dir.join("owner.pid")) {
            reap(&dir);
        }
    }
}

fn reap(dir: &Path) {
    if pid_alive(&dir.join("docker.pid")) {
        remove_all_containers(&format!("unix://{}", dir.join("docker.sock").display()));
        let pid = read_pid(&dir.join("docker.pid")).unwrap();
        // SAFETY: plain kill(2); pid_alive checked the pid is a live dockerd.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    unmount_netns(dir);
    let _ = std::fs::remove_dir_all(dir);
}

fn read_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The binaries that start a dockerd here: cargo names them `<target>-<hash>`.
const OWNERS: [&str; 7] = [
    "docker_e2e",
    "jupyterhub_e2e",
    "docker_start",
    "cdi_docker",
    "docker_cdi",
    "docker_foreign",
    "toolkit_runtime",
];

/// The pid in `file` is alive and is a test or bench binary, or dockerd (not a reused
/// pid).
fn pid_alive(file: &Path) -> bool {
    let Some(pid) = read_pid(file) else {
        return false;
    };
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let name = exe
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    name == "dockerd" || OWNERS.iter().any(|owner| name.starts_with(owner))
}

/// Two `docker run`s of one GPU each on `slot`, the first taking a GPU so that the
/// second's is not GPU 0 (where names by index would be wrong): the second sees exactly
/// its GPU's driver files from `driver` (nvidia-ctk's spec, `assert_toolkit_driver_inside`).
pub fn second_container_sees_its_gpus_driver(
    h: &Harness,
    slot: &Slot,
    driver: &gpupin_sandbox::harness::toolkit::MockDriver,
) {
    let first = h.start(&slot.runtime, &["-l", "gpupin.count=1"]);
    let c = h.start(&slot.runtime, &["-l", "gpupin.count=1"]);
    let holders = slot.holders();
    let held = &holders[&c.id];
    assert_eq!(held.len(), 1, "{holders:?}");
    assert_ne!(&holders[&first.id], held);
    let chosen = driver.gpus.iter().find(|g| g.uuid == held[0]).unwrap();
    let sh = |script: &str| c.exec(&["sh", "-c", script]);
    gpupin_sandbox::harness::toolkit::assert_toolkit_driver_inside(&sh, driver, chosen);
}
