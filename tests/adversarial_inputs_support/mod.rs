//! Shared set-up of the adversarial suites: gpupin and gpupin-runtime run with a time
//! limit (a hook stuck on a FIFO must fail a test, not hang it), a config whose `runtime`
//! is a fake that logs its argv, bundles, the ledger proper, and the checks every
//! refusal must pass (exit 1, one line starting `gpupin: `, ledger unchanged). The
//! snapshots, the one-line check, the root check and the stand-in process come from
//! gpupin-sandbox's harness, shared with the other suites.

// Each test crate uses a different subset of these helpers.
#![allow(dead_code)]

pub use gpupin_sandbox::harness::assert_one_gpupin_line;
pub use gpupin_sandbox::harness::ledger::{Entry, snapshot_tree};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
pub const RUNTIME: &str = env!("CARGO_BIN_EXE_gpupin-runtime");

/// How long any one gpupin call may take before the test calls it hung. A hook that
/// blocks on a FIFO under the ledger's lock would stall every container start on a host.
pub const LIMIT: Duration = Duration::from_secs(10);

/// The first UUID of `sim:nvswitch8`, for hand-written requests and records.
pub const SIM_UUID0: &str = "GPU-5a1e0001-0000-4000-8000-000000000000";

/// How a bounded child ended.
#[derive(Debug)]
pub struct Run {
    /// Exit code; `None` when a signal ended it (or the time limit did).
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub elapsed: Duration,
    pub stdout: Vec<u8>,
    pub stderr: String,
    /// Peak resident memory of the child in KiB (wait4's rusage).
    pub max_rss_kib: i64,
}

impl Run {
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// A short description for assertion messages.
    pub fn describe(&self) -> String {
        format!(
            "code {:?}, signal {:?}, timed out {}, after {:?}, stderr {:?}",
            self.code, self.signal, self.timed_out, self.elapsed, self.stderr
        )
    }
}

/// Runs `cmd` with `input` on stdin, killing it after `limit`. Never blocks longer than
/// `limit` plus a moment, whatever the child does with its pipes.
pub fn run_bounded(cmd: &mut Command, input: &[u8], limit: Duration) -> Run {
    run_bounded_to(cmd, input, limit, Stdio::piped())
}

/// As `run_bounded`, with the child's stdout going to `stdout` (/dev/full, a pipe without
/// readers); `Run::stdout` is then empty.
// The child is reaped by wait4 (which also gives its peak memory), not Child::wait.
#[allow(clippy::zombie_processes)]
pub fn run_bounded_to(cmd: &mut Command, input: &[u8], limit: Duration, stdout: Stdio) -> Run {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let pid = child.id() as libc::pid_t;
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    // The child may exit before reading stdin (a bad argument); a broken pipe is fine.
    std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let stdout = match child.stdout.take() {
        Some(pipe) => drain(pipe),
        None => mpsc::channel().1,
    };
    let stderr = drain(child.stderr.take().unwrap());
    let mut status: libc::c_int = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    loop {
        // SAFETY: pid is our own child, not yet reaped; the pointers are valid.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break;
        }
        assert!(r == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        if started.elapsed() > limit {
            timed_out = true;
            // SAFETY: kill and a blocking wait4 on our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::wait4(pid, &mut status, 0, &mut usage);
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let elapsed = started.elapsed();
    // A grandchild may still hold the pipes; take what came within a moment.
    let grace = Duration::from_secs(2);
    let stdout = stdout.recv_timeout(grace).unwrap_or_default();
    let stderr = stderr.recv_timeout(grace).unwrap_or_default();
    let (code, signal) = if libc::WIFEXITED(status) {
        (Some(libc::WEXITSTATUS(status)), None)
    } else {
        (None, Some(libc::WTERMSIG(status)))
    };
    Run {
        code: if timed_out { None } else { code },
        signal,
        timed_out,
        elapsed,
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        max_rss_kib: usage.ru_maxrss,
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = tx.send(bytes);
    });
    rx
}

/// Asserts that `run` ended by itself, with exit 1 and exactly one stderr line that
/// starts with `gpupin: `.
#[track_caller]
pub fn assert_refused(run: &Run, what: &str) {
    assert!(!run.timed_out, "{what}: hung ({})", run.describe());
    assert_eq!(run.code, Some(1), "{what}: {}", run.describe());
    assert_one_gpupin_line(&run.stderr, what);
}

/// Asserts exit 0 or 1 (never a panic's 101, a signal or a hang), and one `gpupin: `
/// line on stderr for a 1.
#[track_caller]
pub fn assert_zero_or_refused(run: &Run, what: &str) {
    assert!(!run.timed_out, "{what}: hung ({})", run.describe());
    assert!(
        matches!(run.code, Some(0) | Some(1)),
        "{what}: {}",
        run.describe()
    );
    if run.code == Some(1) {
        assert_one_gpupin_line(&run.stderr, what);
    }
}

/// A uid and gid that are neither root nor us: the "other user" of the attacks.
pub const NOBODY: u32 = 65534;

pub fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is a valid NUL-terminated path.
    let r = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        r,
        0,
        "mkfifo {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
}

pub fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(uid)).unwrap();
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The pid of a process that has exited (and was reaped).
pub fn dead_pid() -> i32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

/// Field 22 of /proc/PID/stat, as gpupin records it to tell pid reuse apart.
pub fn start_time(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A gpupin configuration in a temp dir whose `runtime` is a fake that appends its argv
/// to a log and exits 0, so that `gpupin-runtime create` allocates for real without runc.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub state: PathBuf,
    pub config: PathBuf,
    pub fake_runtime: PathBuf,
    pub runtime_log: PathBuf,
}

impl Env {
    pub fn new() -> Env {
        Env::with_config("inventory = \"sim:nvswitch8\"\n")
    }

    /// `text`: the config lines besides state_dir, policy and runtime.
    pub fn with_config(text: &str) -> Env {
        let dir = tempfile::Builder::new()
            .prefix("gpupin-adv")
            .tempdir()
            .unwrap();
        // tempdir is 0700; the state dir itself is made by gpupin.
        let state = dir.path().join("state");
        let fake_runtime = dir.path().join("fake-runc");
        let runtime_log = dir.path().join("fake-runc.log");
        std::fs::write(
            &fake_runtime,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{}'\nexit 0\n",
                runtime_log.display()
            ),
        )
        .unwrap();
        chmod(&fake_runtime, 0o755);
        let env = Env {
            config: dir.path().join("gpupin.toml"),
            dir,
            state,
            fake_runtime,
            runtime_log,
        };
        env.write_config(text);
        env
    }

    /// Rewrites the config with other extra lines.
    pub fn write_config(&self, text: &str) {
        let full = format!(
            "state_dir = {:?}\naudit_log = {:?}\npolicy = \"pack\"\nruntime = {:?}\n{text}\n",
            self.state.to_str().unwrap(),
            self.state.join("audit.log").to_str().unwrap(),
            self.fake_runtime.to_str().unwrap()
        );
        std::fs::write(&self.config, full).unwrap();
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `gpupin --config <ours> ARGS`, bounded.
    pub fn gpupin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut cmd = Command::new(GPUPIN);
        cmd.arg("--config").arg(&self.config).args(args);
        run_bounded(&mut cmd, input, LIMIT)
    }

    /// `gpupin-runtime --gpupin-config <ours> create --bundle BUNDLE ID`, bounded.
    pub fn create(&self, bundle: &Path, id: &str) -> Run {
        let mut cmd = Command::new(RUNTIME);
        cmd.arg("--gpupin-config")
            .arg(&self.config)
            .arg("create")
            .arg("--bundle")
            .arg(bundle)
            .arg(id);
        run_bounded(&mut cmd, b"", LIMIT)
    }

    /// A bundle `bundles/NAME` with a config.json carrying `annotations` and an empty
    /// rootfs with /dev; returns the bundle dir.
    pub fn bundle(&self, name: &str, annotations: &[(&str, &str)]) -> PathBuf {
        let map: serde_json::Map<String, Value> = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(*v)))
            .collect();
        self.bundle_with(name, &spec_json(Value::Object(map), &[]))
    }

    /// A bundle whose config.json is `spec` as written.
    pub fn bundle_with(&self, name: &str, spec: &Value) -> PathBuf {
        let bundle = self.dir.path().join("bundles").join(name);
        std::fs::create_dir_all(bundle.join("rootfs/dev")).unwrap();
        std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
        bundle
    }

    /// The ledger proper: every record and ticket, and the cursor. Not the lock file
    /// (created empty by any locked read), the audit logs and their counts (`audit.log`,
    /// `audit.refusals.log` and its budget, `audit-write-failures`), queue-seq (it counts
    /// every wait ever started, refused or not) nor the directories themselves.
    pub fn ledger(&self) -> BTreeMap<String, Entry> {
        let mut all = snapshot_tree(&self.state);
        all.retain(|k, v| {
            !matches!(k.as_str(), "lock" | "queue-seq")
                && !k.starts_with("audit")
                && *v != Entry::Dir
        });
        all
    }

    /// Names of the record files under holders/ (regular files only).
    pub fn record_files(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state.join("holders")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    pub fn record(&self, id: &str) -> Option<Value> {
        let path = self.state.join("holders").join(format!("{id}.json"));
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !meta.is_file() {
            return None;
        }
        serde_json::from_slice(&std::fs::read(&path).ok()?).ok()
    }

    /// A record as gpupin writes it, made by a real allocation and released again: the
    /// template for planted records, so that they follow the format of the day.
    pub fn record_template(&self) -> Value {
        let bundle = self.bundle("template", &[("gpupin.count", "1")]);
        let run = self.create(&bundle, "template");
        assert_eq!(run.code, Some(0), "template allocation: {}", run.describe());
        let record = self.record("template").expect("a template record");
        let out = self.gpupin(&["release", "--force", "template"], b"");
        assert_eq!(
            out.code,
            Some(0),
            "releasing the template: {}",
            out.describe()
        );
        record
    }

    /// Writes `holders/<file>` from the template, held by `pid` on the first GPU, with
    /// the pid's start time when it is alive (a dead pid makes the record stale); returns
    /// the path.
    pub fn plant_record(
        &self,
        template: &Value,
        file: &str,
        id: &str,
        pid: Option<i32>,
    ) -> PathBuf {
        let mut record = template.clone();
        record["id"] = json!(id);
        record["gpus"] = json!([SIM_UUID0]);
        record["pid"] = json!(pid);
        let alive = |p: &i32| Path::new(&format!("/proc/{p}")).exists();
        record["start_time"] = json!(pid.filter(alive).map(start_time));
        record["created_at"] = json!(unix_now());
        let holders = self.state.join("holders");
        std::fs::create_dir_all(&holders).unwrap();
        let path = holders.join(file);
        std::fs::write(&path, serde_json::to_vec_pretty(&record).unwrap()).unwrap();
        path
    }

    /// Makes the state dir as gpupin would (0755), without allocating.
    pub fn make_state_dir(&self) {
        let out = self.gpupin(&["gc"], b"");
        assert_eq!(
            out.code,
            Some(0),
            "gc on a fresh state dir: {}",
            out.describe()
        );
        assert!(self.state.is_dir());
    }
}

impl Default for Env {
    fn default() -> Self {
        Env::new()
    }
}

/// A minimal OCI spec with `annotations` and `env`, rootfs `rootfs` (bundle-relative).
pub fn spec_json(annotations: Value, env: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {"args": ["sleep", "1"], "env": env, "cwd": "/"},
        "root": {"path": "rootfs"},
        "annotations": annotations,
    })
}

/// The OCI state runc passes to a hook.
pub fn state_json(id: &str, pid: i32, bundle: &Path, annotations: Value) -> Vec<u8> {
    json!({
        "ociVersion": "1.0.2", "id": id, "status": "creating", "pid": pid,
        "bundle": bundle, "annotations": annotations,
    })
    .to_string()
    .into_bytes()
}
