//! Shared pieces of the adversarial suites: a gpupin setup on a simulated machine whose
//! hooks race for the same GPUs, fake containers (what runc's init is at prestart time: a
//! process in its own mount namespace and its own device cgroup), hook processes started
//! together behind a barrier, and checks of what the ledger must never show. What other
//! suites share too (the skip rule, fake containers, status queries, ledger snapshots,
//! the refusal check) comes from gpupin-sandbox's harness.

// Each adversarial test file uses a different subset of these helpers.
#![allow(dead_code)]

pub use gpupin_sandbox::harness::ledger::{snapshot, walk};
pub use gpupin_sandbox::harness::status::{holder_ids, holdings};
use gpupin_sandbox::harness::{self, DEVICES_CGROUP};
pub use gpupin_sandbox::harness::{FakeContainer, refusal_problem, run_with_input, text};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
/// The simulated machine: sixteen 32 GiB GPUs, major 195, minors 0..15.
pub const MACHINE: &str = "sim:nvswitch16";
pub const GPUS: usize = 16;
pub const GPU_MEMORY: u64 = 32 << 30;
pub const GPU_MAJOR: u32 = 195;
/// Free memory the live file reports: the first half of the GPUs has room for a
/// `gpupin.memory=20GiB` request, the second half does not.
pub const ROOMY_FREE: u64 = 30 << 30;
pub const TIGHT_FREE: u64 = 10 << 30;

/// `None` when the suite can run here; otherwise why not.
fn missing(needs_users: bool) -> Option<String> {
    if !gpupin_sandbox::is_root() {
        return Some("root (mount namespaces, device nodes, cgroups)".into());
    }
    let mut tools = vec!["unshare", "sh", "sleep"];
    if needs_users {
        tools.extend(["useradd", "userdel", "setpriv"]);
    }
    for tool in tools {
        if gpupin_sandbox::find_on_path(tool).is_none() {
            return Some(format!("{tool} on PATH"));
        }
    }
    if !Path::new(DEVICES_CGROUP).join("devices.allow").exists() {
        return Some(format!(
            "the cgroup v1 devices controller at {DEVICES_CGROUP}"
        ));
    }
    None
}

/// Whether `test` can run. Under CI=true a missing requirement fails the test; elsewhere
/// it is skipped with the reason on stderr.
pub fn runnable(test: &str, needs_users: bool) -> bool {
    let found = match missing(needs_users) {
        Some(reason) => Err(format!("needs {reason}")),
        None => Ok(()),
    };
    harness::required(test, found).is_some()
}

/// A whole number from the environment, else `default`.
pub fn env_count(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
        Err(_) => default,
    }
}

/// A small deterministic generator (xorshift64*): the suite needs variety, not quality,
/// and the seed printed by each test replays a failing run (GPUPIN_ADV_SEED).
pub struct Rng(u64);

impl Rng {
    pub fn from_env(test: &str) -> Rng {
        let seed = std::env::var("GPUPIN_ADV_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("{test}: GPUPIN_ADV_SEED={seed}");
        Rng(seed | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Lifts the soft open-files limit to the hard one: hundreds of hooks wait on stdin pipes.
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write `lim`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

static RIGS: AtomicU32 = AtomicU32::new(0);

/// One gpupin configuration on the simulated machine in its own temp dir: state dir,
/// live file, a rootfs the fake containers share (each mounts its own /dev over it), and
/// bundles. Cgroups are named after `prefix`, unique to this process and rig.
pub struct Rig {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub state_dir: PathBuf,
    pub live_file: PathBuf,
    pub rootfs: PathBuf,
    pub max_shared: u32,
    pub prefix: String,
    containers: AtomicU32,
}

impl Rig {
    pub fn new(test: &str, max_shared: u32) -> Rig {
        let dir = tempfile::Builder::new()
            .prefix("gpupin-adv")
            .tempdir()
            .unwrap();
        let state_dir = dir.path().join("state");
        let live_file = dir.path().join("live.json");
        let rootfs = dir.path().join("rootfs");
        fs::create_dir_all(rootfs.join("dev")).unwrap();
        fs::create_dir_all(dir.path().join("bundles")).unwrap();
        let gpus: Vec<Value> = (0..GPUS)
            .map(|i| {
                let free = if i < GPUS / 2 { ROOMY_FREE } else { TIGHT_FREE };
                json!({"index": i, "utilization": 0, "memory_free": free})
            })
            .collect();
        fs::write(&live_file, json!({ "gpus": gpus }).to_string()).unwrap();
        let config = dir.path().join("gpupin.toml");
        let text = format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = {MACHINE:?}\npolicy = \"pack\"\nmax_shared = {max_shared}\nlive_file = {:?}\n",
            state_dir.to_str().unwrap(),
            state_dir.join("audit.log").to_str().unwrap(),
            live_file.to_str().unwrap(),
        );
        fs::write(&config, text).unwrap();
        let n = RIGS.fetch_add(1, Ordering::Relaxed);
        let short: String = test
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(12)
            .collect();
        Rig {
            dir,
            config,
            state_dir,
            live_file,
            rootfs,
            max_shared,
            prefix: format!("gpupin-adv-{}-{n}-{short}", std::process::id()),
            containers: AtomicU32::new(0),
        }
    }

    /// `gpupin --config <ours>`, to add arguments to.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(GPUPIN);
        cmd.arg("--config").arg(&self.config);
        cmd
    }

    /// `gpupin --config <ours> ARGS` with `input` on stdin.
    pub fn run(&self, args: &[&str], input: &str) -> Output {
        run_with_input(self.command().args(args), input)
    }

    /// `gpupin status --json`, which must succeed.
    pub fn status(&self) -> Value {
        harness::status::query(Path::new(GPUPIN), &self.config)
    }

    /// `gpupin gc`, which must succeed.
    pub fn gc(&self) {
        let out = self.run(&["gc"], "");
        assert!(out.status.success(), "gc failed: {}", text(&out.stderr));
    }

    /// A copy of the config, named `name`, whose state dir is `state_dir` instead.
    pub fn config_with_state_dir(&self, name: &str, state_dir: &Path) -> PathBuf {
        let text = fs::read_to_string(&self.config).unwrap();
        let line = |dir: &Path| format!("state_dir = {:?}", dir.to_str().unwrap());
        let path = self.dir.path().join(name);
        fs::write(
            &path,
            text.replace(&line(&self.state_dir), &line(state_dir)),
        )
        .unwrap();
        path
    }

    /// A fake container, started and ready (its /dev mounted, in its own device cgroup).
    pub fn container(&self) -> FakeContainer {
        let mut c = self.spawn_container();
        c.settle().unwrap();
        c
    }

    /// A fake container, started but not yet ready: start many, then `settle` each, so
    /// that their start-up overlaps.
    pub fn spawn_container(&self) -> FakeContainer {
        let n = self.containers.fetch_add(1, Ordering::Relaxed);
        FakeContainer::spawn(
            &self.rootfs,
            Path::new(DEVICES_CGROUP).join(format!("{}-{n}", self.prefix)),
        )
    }

    /// A bundle for `id` whose config.json points at the shared rootfs.
    pub fn bundle(&self, id: &str) -> PathBuf {
        let bundle = self.dir.path().join("bundles").join(id);
        fs::create_dir_all(&bundle).unwrap();
        let spec = json!({
            "ociVersion": "1.0.2",
            "process": {"args": ["sleep", "600"], "env": ["PATH=/bin"], "cwd": "/"},
            "root": {"path": self.rootfs},
        });
        fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        bundle
    }

    /// GPU minors by UUID, from `gpupin inventory --json`.
    pub fn minors(&self) -> BTreeMap<String, u32> {
        let out = self.run(&["inventory", "--json"], "");
        assert!(out.status.success(), "inventory: {}", text(&out.stderr));
        let inv: Value = serde_json::from_slice(&out.stdout).unwrap();
        inv["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let uuid = g["uuid"].as_str().unwrap().to_string();
                (uuid, g["minor"].as_u64().unwrap() as u32)
            })
            .collect()
    }

    /// Live free memory by GPU index, as the live file says.
    pub fn live_free(&self, index: u64) -> u64 {
        if (index as usize) < GPUS / 2 {
            ROOMY_FREE
        } else {
            TIGHT_FREE
        }
    }
}

/// The OCI state runc passes a hook on stdin.
pub fn oci_state(id: &str, pid: i32, bundle: &Path, annotations: &[(String, String)]) -> String {
    let annotations: serde_json::Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    json!({
        "ociVersion": "1.0.2", "id": id, "status": "created", "pid": pid,
        "bundle": bundle, "annotations": annotations,
    })
    .to_string()
}

/// Starts every container in `count`, then settles them; all killed on drop.
pub fn containers(rig: &Rig, count: usize) -> Vec<FakeContainer> {
    let mut all: Vec<FakeContainer> = (0..count).map(|_| rig.spawn_container()).collect();
    for c in &mut all {
        c.settle().unwrap();
    }
    all
}

/// One hook process: stdin held back until `release`, stderr to a file.
pub struct Hook {
    pub id: String,
    child: Child,
    input: Option<(std::process::ChildStdin, String)>,
    stderr_path: PathBuf,
    pub status: Option<ExitStatus>,
    pub killed: bool,
}

impl Hook {
    /// `gpupin hook STAGE` for container `id`; it blocks reading stdin until `release`.
    pub fn spawn(rig: &Rig, stage: &str, id: &str, state: String) -> Hook {
        let mut cmd = rig.command();
        cmd.args(["hook", stage]);
        Hook::spawn_command(rig, cmd, id, stage, state)
    }

    /// As `spawn`, for any command that runs a hook (`sh -c 'umask 000; exec gpupin ...'`);
    /// `stage` names its stderr file.
    pub fn spawn_command(
        rig: &Rig,
        mut cmd: Command,
        id: &str,
        stage: &str,
        state: String,
    ) -> Hook {
        let stderr_path = rig.dir.path().join(format!("hook-{stage}-{id}.err"));
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&stderr_path).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        Hook {
            id: id.to_string(),
            child,
            input: Some((stdin, state)),
            stderr_path,
            status: None,
            killed: false,
        }
    }

    /// Hands it its state; it starts working once stdin closes.
    pub fn release(&mut self) {
        if let Some((mut stdin, state)) = self.input.take() {
            let _ = stdin.write_all(state.as_bytes());
        }
    }

    /// SIGKILL, unless it is known to have exited (it may have, unnoticed: a victim).
    pub fn kill(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            self.killed = true;
        }
    }

    /// Whether it has exited (collecting its status when it just did).
    pub fn poll(&mut self) -> bool {
        if self.status.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.status = Some(status);
        }
        self.status.is_some()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Whether it exited 0.
    pub fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }

    /// Whether it failed the way a refusal must: exit 1, exactly one stderr line,
    /// starting `gpupin: `.
    pub fn refusal_problem(&self) -> Option<String> {
        refusal_problem(self.status?.code(), &self.stderr())
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        if self.status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Releases every hook at once (each was spawned blocked on stdin), then waits for all of
/// them up to `limit`. Returns the ids of those still running at the limit (then killed).
pub fn release_and_wait(hooks: &mut [Hook], limit: Duration) -> Vec<String> {
    for h in hooks.iter_mut() {
        h.release();
    }
    wait_all(hooks, limit)
}

/// Waits for every hook up to `limit`; kills and names the ones that hung.
pub fn wait_all(hooks: &mut [Hook], limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    loop {
        let mut running = 0;
        for h in hooks.iter_mut() {
            if !h.poll() {
                running += 1;
            }
        }
        if running == 0 {
            return Vec::new();
        }
        if Instant::now() > deadline {
            let mut hung = Vec::new();
            for h in hooks.iter_mut().filter(|h| h.status.is_none()) {
                hung.push(h.id.clone());
                let _ = h.child.kill();
                h.status = h.child.wait().ok();
            }
            return hung;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As `refusal_problem`, for a finished `Output`.
pub fn output_refusal_problem(out: &Output) -> Option<String> {
    refusal_problem(out.status.code(), &text(&out.stderr))
}

/// Every way the GPU holders in `status` (from `gpupin status --json`) break the rules:
/// a GPU in two exclusive records or shared with an exclusive one, more than `max_shared`
/// shared holders, reservations beyond the GPU's memory, a memory request on a GPU with
/// less free memory.
pub fn holder_violations(
    status: &Value,
    max_shared: u32,
    live_free: impl Fn(u64) -> u64,
) -> Vec<String> {
    let mut problems = Vec::new();
    for gpu in status["gpus"].as_array().unwrap() {
        let index = gpu["index"].as_u64().unwrap();
        let holders = gpu["holders"].as_array().unwrap();
        let exclusive = holders.iter().filter(|h| h["mode"] == "exclusive").count();
        let ids: Vec<&str> = holders.iter().map(|h| h["id"].as_str().unwrap()).collect();
        if exclusive > 0 && holders.len() > 1 {
            problems.push(format!(
                "GPU {index} held exclusively and by others: {ids:?}"
            ));
        }
        if holders.len() > max_shared as usize {
            problems.push(format!(
                "GPU {index} has {} shared holders, limit {max_shared}: {ids:?}",
                holders.len()
            ));
        }
        let reserved: u64 = holders
            .iter()
            .filter_map(|h| h["request"]["reserve"].as_u64())
            .sum();
        if reserved > GPU_MEMORY {
            problems.push(format!(
                "GPU {index} has {reserved} bytes reserved, more than {GPU_MEMORY}: {ids:?}"
            ));
        }
        for h in holders {
            if let Some(wanted) = h["request"]["memory"].as_u64()
                && wanted > live_free(index)
            {
                problems.push(format!(
                    "GPU {index} ({} bytes free) given to {} which asked for {wanted}",
                    live_free(index),
                    h["id"]
                ));
            }
        }
    }
    problems
}

/// Paths under `dir` (itself included) whose name starts with '.': temp files a writer
/// left behind. Symlinks are listed, never followed.
pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect()
}

/// Whether nobody holds the ledger's flock: a non-blocking exclusive flock succeeds.
pub fn lock_is_free(state_dir: &Path) -> bool {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let path = state_dir.join("lock");
    let Ok(fd) = rustix::fs::open(
        &path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        // No lock file: nobody can hold it.
        return !path.exists();
    };
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok()
}

/// The audit log's events as (event, holder id): lines are `<time> <event> <id> ...`.
pub fn audit_events(state_dir: &Path) -> Vec<(String, String)> {
    let text = fs::read_to_string(state_dir.join("audit.log")).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("audit line {l:?} is no JSON: {e}"));
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (field("event"), field("holder"))
        })
        .collect()
}

/// How many times each holder id appears with `event` in the audit log.
pub fn audit_count(state_dir: &Path, event: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (e, id) in audit_events(state_dir) {
        if e == event {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

/// Ticket files in the wait queue (temp files aside).
pub fn queue_tickets(state_dir: &Path) -> Vec<String> {
    fs::read_dir(state_dir.join("queue"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| !n.starts_with('.'))
                .collect()
        })
        .unwrap_or_default()
}

/// Entries under `dir` whose modes break the rule: directories exactly 0755, files
/// without group or other write. Each as `path mode`.
pub fn unsafe_modes(dir: &Path) -> Vec<String> {
    walk(dir)
        .into_iter()
        .filter_map(|p| {
            let meta = fs::symlink_metadata(&p).ok()?;
            let mode = meta.permissions().mode() & 0o7777;
            let bad = if meta.is_dir() {
                mode != 0o755
            } else {
                mode & 0o022 != 0
            };
            bad.then(|| format!("{} {mode:04o}", p.display()))
        })
        .collect()
}
