//! What the `gpupin exec` / `hold` / `serve` end-to-end tests share: throwaway users and
//! groups, a `gpupin serve` child, jobs that report their environment into a scratch
//! directory and wait there for a go, and polling with a deadline.
//!
//! Every guard cleans up in `Drop`, so a failing test leaves no user, daemon or job
//! behind. Declare users first, then the daemon, then jobs: locals drop in reverse order,
//! so jobs end before their daemon and users are deleted last.

use gpupin_sandbox::harness::{self, Gpupin};
use serde_json::Value;
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// How long a state change may take before a test gives up: far above what any of them
/// needs, so that only a hang fails a test.
const DEADLINE: Duration = Duration::from_secs(60);

/// A job script waits at most this many tenths of a second for its go, so that a job a
/// failed test left behind still ends.
const JOB_MAX_TENTHS: u32 = 900;

/// Polls `check` until it gives `Some`, panicking with `what` after `DEADLINE`.
#[track_caller]
pub fn until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = check() {
            return found;
        }
        assert!(start.elapsed() < DEADLINE, "gave up waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What the end-to-end tests need besides root: the tools that make users, and gpupin
/// and this test binary where other users can run them.
pub fn requirements(test: &str) -> bool {
    if !harness::need_root(test) {
        return false;
    }
    let tools = ["useradd", "userdel", "groupadd", "groupdel", "usermod"];
    let missing: Vec<&str> = tools.into_iter().filter(|t| !on_path(t)).collect();
    let found = match missing.is_empty() {
        true => Ok(()),
        false => Err(format!("{} not found", missing.join(", "))),
    };
    let found = found
        .and_then(|()| runnable_by_others(&harness::binary(GPUPIN)))
        .and_then(|()| runnable_by_others(&std::env::current_exe().unwrap()));
    harness::required(test, found).is_some()
}

/// Whether users other than root can run the program at `path`: it and every directory
/// above it let others in.
fn runnable_by_others(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    for p in path.ancestors() {
        let mode = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        if mode.mode() & 0o001 == 0 {
            return Err(format!(
                "other users cannot run {} ({} has mode {:o})",
                path.display(),
                p.display(),
                mode.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

pub fn on_path(tool: &str) -> bool {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|d| d.join(tool).is_file())
}

/// A gpupin configuration (`sim:nvswitch8`, state dir and audit log inside a temp dir)
/// that other users can reach: the temp dir opened to them, and a scratch directory they
/// can write to. `extra`: config lines after the usual ones.
pub fn gpupin(extra: &str) -> Gpupin {
    let g = Gpupin::with_extra(GPUPIN, "sim:nvswitch8", extra);
    open_up(&g);
    g
}

/// Lets other users reach `g`'s socket and config (tempfile makes the dir 0700), and
/// makes the world-writable scratch directory jobs report into.
pub fn open_up(g: &Gpupin) {
    chmod(g.dir.path(), 0o755);
    let scratch = scratch(g);
    std::fs::create_dir_all(&scratch).unwrap();
    chmod(&scratch, 0o777);
}

pub fn scratch(g: &Gpupin) -> PathBuf {
    g.dir.path().join("scratch")
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `gpupin --config <g's> ARGS` as root or as `user`, stdin empty.
pub fn cmd(g: &Gpupin, user: Option<&User>, args: &[&str]) -> Command {
    let mut cmd = Command::new(&g.bin);
    cmd.arg("--config")
        .arg(&g.config)
        .args(args)
        .env_remove("GPUPIN_CONFIG")
        .env_remove("GPUPIN_WITHIN")
        .stdin(Stdio::null());
    if let Some(user) = user {
        user.owns(&mut cmd);
    }
    cmd
}

/// Runs `gpupin ARGS` to its end.
pub fn run(g: &Gpupin, user: Option<&User>, args: &[&str]) -> Output {
    cmd(g, user, args).output().unwrap()
}

/// Runs `gpupin ARGS`, which must succeed; its stdout.
#[track_caller]
pub fn ok(g: &Gpupin, user: Option<&User>, args: &[&str]) -> String {
    let out = run(g, user, args);
    assert!(
        out.status.success(),
        "gpupin {args:?} failed: {}",
        harness::stderr(&out)
    );
    harness::stdout(&out)
}

/// Runs `gpupin ARGS`, which must be refused as every refusal is (exit 1, one
/// `gpupin: ` line); the line, without its newline.
#[track_caller]
pub fn refused(g: &Gpupin, user: Option<&User>, args: &[&str]) -> String {
    refusal(&run(g, user, args), &format!("gpupin {args:?}"))
}

#[track_caller]
pub fn refusal(out: &Output, what: &str) -> String {
    let err = harness::stderr(out);
    if let Some(problem) = harness::refusal_problem(out.status.code(), &err) {
        panic!("{what}: {problem}");
    }
    err.trim_end().to_string()
}

/// The audit log's events, in order, refusals (`audit.refusals.log`) merged in by time
/// as `gpupin log` merges them.
pub fn audit(g: &Gpupin) -> Vec<Value> {
    // The main log, the refusals and each user's log (audit.users/<uid>.log).
    let users = std::fs::read_dir(g.state_dir.join("audit.users"))
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default();
    let files = ["audit.log", "audit.refusals.log"]
        .iter()
        .map(|name| g.state_dir.join(name))
        .chain(users);
    let mut events: Vec<Value> = files
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            text.lines()
                .map(|l| serde_json::from_str(l).expect("an audit line is JSON"))
                .collect::<Vec<Value>>()
        })
        .collect();
    // RFC 3339 UTC to the second sorts as text; a stable sort keeps each log's order.
    events.sort_by(|a, b| a["time"].as_str().cmp(&b["time"].as_str()));
    events
}

/// The audit events of `holder`, as (event, value).
pub fn events_of(g: &Gpupin, holder: &str) -> Vec<Value> {
    audit(g)
        .into_iter()
        .filter(|e| e["holder"] == holder)
        .collect()
}

/// The ledger's record file of `id`, as JSON.
pub fn record(g: &Gpupin, id: &str) -> Value {
    let path = g.state_dir.join("holders").join(format!("{id}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// Requests waiting in the ledger's queue.
pub fn queued(g: &Gpupin) -> usize {
    std::fs::read_dir(g.state_dir.join("queue")).map_or(0, |d| d.count())
}

/// `gpupin serve` as a child process, killed when dropped.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// Starts `gpupin serve` on `g`'s config; returns once its socket takes connections.
    pub fn start(g: &Gpupin) -> Daemon {
        let log = g.dir.path().join("serve.log");
        let mut cmd = cmd(g, None, &["serve"]);
        let daemon = Daemon::spawn(&mut cmd, log);
        daemon.wait_ready(&g.state_dir.join("gpupin.sock"));
        daemon
    }

    /// Runs `cmd`, stderr to `log`, which a panic shows.
    pub fn spawn(cmd: &mut Command, log: PathBuf) -> Daemon {
        let file = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        Daemon { child, log }
    }

    /// Waits until `socket` accepts a connection; the daemon must not have exited.
    pub fn wait_ready(&self, socket: &Path) {
        until("gpupin serve listens", || {
            std::os::unix::net::UnixStream::connect(socket).ok()
        });
    }

    /// What the daemon wrote to stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The daemon's pid (tests/serve_load.rs counts its fds and threads).
    #[allow(dead_code)]
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Whether the daemon still runs.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            harness::say(&format!("gpupin serve's stderr:\n{}", self.log()));
        }
    }
}

/// useradd, userdel and groupadd lock /etc/passwd and /etc/group; tests that run in
/// parallel take turns.
static ACCOUNTS: Mutex<()> = Mutex::new(());

/// Runs an account tool, retrying while another one holds the lock files.
fn account_tool(args: &[&str]) -> Output {
    let _turn = ACCOUNTS.lock().unwrap_or_else(|e| e.into_inner());
    let mut tries = 0;
    loop {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        let locked = harness::stderr(&out).contains("lock");
        if out.status.success() || !locked || tries == 50 {
            return out;
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A throwaway user `gpt-<short>-<pid>` without home directory, deleted when dropped.
pub struct User {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

impl User {
    /// `short`: a few letters unique within the test binary (names stay <= 32 chars).
    pub fn create(short: &str) -> User {
        let name = format!("gpt-{short}-{}", std::process::id());
        assert!(name.len() <= 32, "user name {name} is too long");
        // A user of that name left by an earlier run of this pid would make useradd fail.
        let _ = account_tool(&["userdel", &name]);
        let out = account_tool(&["useradd", "-M", "-N", "-s", "/bin/sh", &name]);
        assert!(
            out.status.success(),
            "useradd {name}: {}",
            harness::stderr(&out)
        );
        let found = nix::unistd::User::from_name(&name)
            .unwrap()
            .expect("the new user");
        User {
            name,
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
        }
    }

    /// `cmd` runs as this user (and its primary group only).
    pub fn owns<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.uid(self.uid).gid(self.gid)
    }
}

impl Drop for User {
    fn drop(&mut self) {
        // A job that has just been told to end may still run for a moment.
        for _ in 0..20 {
            if account_tool(&["userdel", &self.name]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = account_tool(&["userdel", "-f", &self.name]);
    }
}

/// A throwaway group `gpt-<short>-<pid>`, deleted when dropped.
pub struct Group {
    pub name: String,
}

impl Group {
    pub fn create(short: &str, members: &[&User]) -> Group {
        let name = format!("gpt-{short}-{}", std::process::id());
        let _ = account_tool(&["groupdel", &name]);
        let out = account_tool(&["groupadd", &name]);
        assert!(
            out.status.success(),
            "groupadd {name}: {}",
            harness::stderr(&out)
        );
        for user in members {
            let out = account_tool(&["usermod", "-aG", &name, &user.name]);
            assert!(out.status.success(), "usermod: {}", harness::stderr(&out));
        }
        Group { name }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = account_tool(&["groupdel", &self.name]);
    }
}

/// The shell script of a job named `name`: it writes its pid, its GPU variables and its
/// cgroups to `<scratch>/<name>.ready` (renamed into place, so it is whole when it is
/// there), waits for `<scratch>/go-<name>`, then exits with `code`.
pub fn job_script(scratch: &Path, name: &str, code: i32) -> String {
    let s = scratch.display();
    format!(
        "{{ echo PID=$$; env | grep -E '^(CUDA_|NVIDIA_|GPUPIN_)'; \
           sed 's/^/CGROUP=/' /proc/self/cgroup; }} > {s}/{name}.tmp \
         && mv {s}/{name}.tmp {s}/{name}.ready; \
         i=0; while [ ! -e {s}/go-{name} ] && [ $i -lt {JOB_MAX_TENTHS} ]; \
         do sleep 0.1; i=$((i+1)); done; exit {code}"
    )
}

/// What a job wrote to its `.ready` file.
#[derive(Debug, Clone)]
pub struct Report {
    pub pid: i32,
    pub env: BTreeMap<String, String>,
    /// /proc/self/cgroup lines.
    pub cgroups: Vec<String>,
}

impl Report {
    fn parse(text: &str) -> Report {
        let mut pid = None;
        let mut env = BTreeMap::new();
        let mut cgroups = Vec::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("CGROUP=") {
                cgroups.push(rest.to_string());
            } else if let Some(p) = line.strip_prefix("PID=") {
                pid = Some(p.parse().unwrap());
            } else if let Some((k, v)) = line.split_once('=') {
                env.insert(k.to_string(), v.to_string());
            }
        }
        Report {
            pid: pid.expect("the job wrote its pid"),
            env,
            cgroups,
        }
    }

    /// The value of a variable the job had, which must be set.
    #[track_caller]
    pub fn var(&self, name: &str) -> &str {
        self.env
            .get(name)
            .unwrap_or_else(|| panic!("the job had no {name}: {:?}", self.env))
    }

    /// The GPU indices CUDA_VISIBLE_DEVICES named.
    pub fn cuda_indices(&self) -> Vec<u32> {
        self.var("CUDA_VISIBLE_DEVICES")
            .split(',')
            .map(|i| i.parse().unwrap())
            .collect()
    }
}

/// Where this machine mounts the cgroup hierarchy of a /proc/<pid>/cgroup line's
/// controllers (`devices`; empty: cgroup2).
pub fn hierarchy_mount(controllers: &str) -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (dir, fstype, options) = (fields[1], fields[2], fields[3]);
        let found = match controllers {
            "" => fstype == "cgroup2",
            c => fstype == "cgroup" && options.split(',').any(|o| o == c),
        };
        found.then(|| PathBuf::from(dir))
    })
}

/// This process's cgroups in the hierarchies jobs are confined in (v1 devices,
/// cgroup2): a job's own cgroup is made under its gpupin exec's, which the test started.
fn my_cgroup_dirs() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let confining = controllers.is_empty() || controllers == "devices";
            let mount = hierarchy_mount(controllers).filter(|_| confining)?;
            Some(mount.join(path.trim_start_matches('/')))
        })
        .collect()
}

/// Waits until the ledger holds nothing and no job of `g`'s audit log has a cgroup
/// left. The daemon releases a job's GPUs when its process ends and then removes its
/// cgroup: a test that ended in between would kill the daemon before it did.
pub fn until_clean(g: &Gpupin) {
    until("the ledger holds nothing", || {
        holder_ids(&g.status()).is_empty().then_some(())
    });
    let jobs: std::collections::BTreeSet<String> = audit(g)
        .into_iter()
        .filter(|e| e["kind"] == "exec")
        .map(|e| e["holder"].as_str().unwrap().to_string())
        .collect();
    let parents = my_cgroup_dirs();
    until("the jobs' cgroups are removed", || {
        let left = jobs.iter().any(|job| {
            let leaf = format!("gpupin-{job}");
            parents.iter().any(|p| p.join(&leaf).exists())
        });
        (!left).then_some(())
    });
}

/// The directories of a job's own cgroups (`gpupin-<holder>`), from what it reported.
pub fn own_cgroup_dirs(report: &Report, holder: &str) -> Vec<PathBuf> {
    let own = format!("/gpupin-{holder}");
    report
        .cgroups
        .iter()
        .filter(|l| l.ends_with(&own))
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some(hierarchy_mount(controllers)?.join(path.trim_start_matches('/')))
        })
        .collect()
}

/// `gpupin exec ... -- sh -c <job_script>` running in the background: killed when dropped,
/// after its job was told to go.
pub struct Job {
    pub name: String,
    scratch: PathBuf,
    /// Where gpupin exec's stderr goes.
    stderr: PathBuf,
    child: Option<Child>,
}

impl Job {
    /// Starts `gpupin exec EXEC_ARGS -- sh -c <job_script(name, 0)>` as root or `user`.
    pub fn start(g: &Gpupin, user: Option<&User>, name: &str, exec_args: &[&str]) -> Job {
        let script = job_script(&scratch(g), name, 0);
        Job::start_with(g, user, name, exec_args, &[], &script)
    }

    /// Starts `gpupin exec EXEC_ARGS -- sh -c SCRIPT` as root or `user`, with `env` added;
    /// `script` reports as `job_script` does, under `name`.
    pub fn start_with(
        g: &Gpupin,
        user: Option<&User>,
        name: &str,
        exec_args: &[&str],
        env: &[(&str, &str)],
        script: &str,
    ) -> Job {
        let scratch = scratch(g);
        let mut args = vec!["exec"];
        args.extend_from_slice(exec_args);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        // Files, not pipes: a job whose gpupin is killed keeps them open, and a pipe
        // would not end before the job.
        let output = |ext: &str| g.dir.path().join(format!("{name}.{ext}"));
        let mut cmd = cmd(g, user, &args);
        cmd.envs(env.iter().copied())
            .stdout(std::fs::File::create(output("out")).unwrap())
            .stderr(std::fs::File::create(output("err")).unwrap());
        let child = cmd.spawn().unwrap();
        Job {
            name: name.to_string(),
            stderr: output("err"),
            scratch,
            child: Some(child),
        }
    }

    /// The pid of `gpupin exec` (not the job's).
    pub fn gpupin_pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    /// The holder id gpupin exec records the job under without --name.
    pub fn holder(&self) -> String {
        format!("exec-{}", self.gpupin_pid())
    }

    fn ready_path(&self) -> PathBuf {
        self.scratch.join(format!("{}.ready", self.name))
    }

    /// What the job reported, once it runs; panics if gpupin exec ends first.
    #[track_caller]
    pub fn ready(&mut self) -> Report {
        let path = self.ready_path();
        let text = until(&format!("job {} runs", self.name), || {
            if let Ok(text) = std::fs::read_to_string(&path) {
                return Some(text);
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "gpupin exec for {} ended ({status}) before its job ran: {}",
                    self.name,
                    self.stderr()
                );
            }
            None
        });
        Report::parse(&text)
    }

    /// Whether the job has reported that it runs.
    pub fn has_started(&self) -> bool {
        self.ready_path().exists()
    }

    /// Whether gpupin exec has ended.
    pub fn has_ended(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_some()
    }

    /// Tells the job to end.
    pub fn go(&self) {
        let go = self.scratch.join(format!("go-{}", self.name));
        let _ = std::fs::write(go, "");
    }

    /// Waits for gpupin exec to end; its status and stderr.
    pub fn wait(&mut self) -> (ExitStatus, String) {
        let status = self.child.take().unwrap().wait().unwrap();
        (status, self.stderr())
    }

    /// What gpupin exec wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Tells the job to end and waits for gpupin exec.
    pub fn finish(&mut self) -> (ExitStatus, String) {
        self.go();
        self.wait()
    }

    /// Sends `signal` to gpupin exec.
    pub fn signal(&self, signal: i32) {
        send(self.gpupin_pid(), signal);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        self.go();
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// kill(2), which must succeed.
#[track_caller]
pub fn send(pid: i32, signal: i32) {
    // SAFETY: kill has no memory effects.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

/// Whether process `pid` runs (exists and is no zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name's closing parenthesis.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        !matches!(state, Some(Some('Z' | 'X')))
    })
}

/// A process of `user`'s (`sleep`), for holds that last while it lives; killed when
/// dropped.
pub struct Sleeper(Child);

impl Sleeper {
    pub fn start(user: &User) -> Sleeper {
        let mut cmd = Command::new("sleep");
        cmd.arg("300").stdin(Stdio::null());
        Sleeper(user.owns(&mut cmd).spawn().unwrap())
    }

    pub fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    pub fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The holders of `status` by id.
pub fn holder_ids(status: &Value) -> Vec<String> {
    harness::status::holders(status)
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_string())
        .collect()
}

/// The repository's python/ copied where the test's user can read it (python_client,
/// first_day).
#[allow(dead_code)]
pub fn python_tree(dest: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("python");
    let out = Command::new("cp")
        .arg("-r")
        .arg(&src)
        .arg(dest)
        .output()
        .unwrap();
    assert!(out.status.success(), "cp: {}", harness::stderr(&out));
    let copy = dest.join("python");
    let out = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&copy)
        .output()
        .unwrap();
    assert!(out.status.success(), "chmod: {}", harness::stderr(&out));
    copy
}
