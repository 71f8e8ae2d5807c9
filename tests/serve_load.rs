//! `gpupin serve` under a hostile local user (issue 19): a slowloris, thousands of short
//! requests and a thousand holds of one process of hers, beside an honest user whose
//! `gpupin hold`, `release` and `exec` keep being answered; the daemon's fds and threads
//! stay bounded by its `[serve]` caps, it lives on and still releases a watched holder
//! when its process ends. And the queue: an over-limit waiter of one user does not make
//! root's exec or a container wait.

#[allow(dead_code)]
mod exec_support;

use exec_support::{
    Daemon, GPUPIN, Job, Sleeper, User, gpupin, holder_ids, ok, open_up, queued, requirements,
    scratch, until, until_clean,
};
use gpupin_sandbox::harness::{self, Sandbox};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Env of the hostile client, which is this test run again as the hostile user (the
/// daemon knows callers by SO_PEERCRED, so the load must come from her processes).
const ROLE_SOCKET: &str = "GPUPIN_LOAD_SOCKET";
const ROLE_PID: &str = "GPUPIN_LOAD_PID";
const ROLE_OUT: &str = "GPUPIN_LOAD_OUT";

const SLOWLORIS: usize = 600;
const SHORT_REQUESTS: usize = 10_000;
const HOLDS: usize = 1_000;
/// The bound asserted on the daemon's fds and threads; its caps below keep it far under.
const BOUND: usize = 200;
const CAPS: &str = "[serve]\nmax_connections = 64\nmax_connections_per_user = 8\n\
                    max_watched_per_user = 16\nrequest_timeout = \"5s\"\n\
                    [limits]\nmax_gpus_per_user = 2\n";

/// One request on a connection of its own: its answer, or what went wrong.
fn ask(socket: &Path, line: &str) -> Result<Value, String> {
    let mut stream = UnixStream::connect(socket).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| e.to_string())?;
    // A refusal at the door may come before the request is written.
    let _ = stream.write_all(line.as_bytes());
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("answer {answer:?}: {e}"))
}

/// How long the slowloris goes on at least: well past the daemon's request_timeout.
const SLOWLORIS_FOR: Duration = Duration::from_secs(20);

/// The hostile user's side: a thousand holds of one process, then a slowloris of
/// `SLOWLORIS` connections beside `SHORT_REQUESTS` short requests. Writes what it saw.
fn hostile() -> bool {
    let (Ok(socket), Ok(pid), Ok(out)) = (
        std::env::var(ROLE_SOCKET),
        std::env::var(ROLE_PID),
        std::env::var(ROLE_OUT),
    ) else {
        return false;
    };
    let socket = Path::new(&socket);
    let deadline = Instant::now() + Duration::from_secs(90);
    let answered = AtomicUsize::new(0);
    let granted = AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::<String>::new());
    let count = |reply: Result<Value, String>| match reply {
        Ok(r) => {
            answered.fetch_add(1, Ordering::Relaxed);
            if r["error"].is_null() {
                granted.fetch_add(1, Ordering::Relaxed);
            }
        }
        Err(e) => failures.lock().unwrap().push(e),
    };
    // The same holds again and again (m0, m1), and one over her GPU limit (m2).
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= HOLDS || Instant::now() > deadline {
                        break;
                    }
                    let line = format!(
                        "{{\"op\":\"hold\",\"id\":\"m{}\",\"devices\":\"{}\",\"pid\":{pid}}}\n",
                        i % 3,
                        i % 3
                    );
                    count(ask(socket, &line));
                }
            });
        }
    });
    let stop = AtomicBool::new(false);
    let open_max = AtomicUsize::new(0);
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        s.spawn(|| {
            // A byte every 2 s on each connection; one the daemon closed is made again.
            let mut conns: Vec<Option<UnixStream>> = (0..SLOWLORIS).map(|_| None).collect();
            let since = Instant::now();
            while (since.elapsed() < SLOWLORIS_FOR || !stop.load(Ordering::Relaxed))
                && Instant::now() < deadline
            {
                for c in conns.iter_mut() {
                    let kept = match c.take() {
                        Some(mut stream) => stream.write_all(b" ").is_ok().then_some(stream),
                        None => UnixStream::connect(socket).ok().and_then(|mut stream| {
                            stream.write_all(b"{").is_ok().then_some(stream)
                        }),
                    };
                    *c = kept;
                }
                let open = conns.iter().filter(|c| c.is_some()).count();
                open_max.fetch_max(open, Ordering::Relaxed);
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= SHORT_REQUESTS || Instant::now() > deadline {
                            break;
                        }
                        let line = format!("{{\"op\":\"release\",\"id\":\"nothing-{i}\"}}\n");
                        count(ask(socket, &line));
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
    });
    let failures = failures.into_inner().unwrap();
    let summary = serde_json::json!({
        "answered": answered.into_inner(),
        "unanswered": failures.len(),
        "first_failures": failures.iter().take(3).collect::<Vec<_>>(),
        "granted": granted.into_inner(),
        "slowloris_open_max": open_max.into_inner(),
    });
    std::fs::write(out, summary.to_string()).unwrap();
    true
}

/// The daemon's open fds and threads.
fn fds_and_threads(pid: i32) -> (usize, usize) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    (fds, threads)
}

#[test]
fn a_hostile_user_does_not_stall_the_daemon_for_an_honest_one() {
    let test = "a_hostile_user_does_not_stall_the_daemon_for_an_honest_one";
    if hostile() {
        return;
    }
    if !requirements(test) {
        return;
    }
    let g = gpupin(CAPS);
    let mallory = User::create("mal");
    let hana = User::create("hon");
    let mut daemon = Daemon::start(&g);
    let mut her_process = Sleeper::start(&mallory);
    let honest_process = Sleeper::start(&hana);
    let summary = g.dir.path().join("scratch").join("hostile.json");
    let mut load = Command::new(std::env::current_exe().unwrap());
    load.args(["--exact", test, "--test-threads=1", "-q"])
        .env(ROLE_SOCKET, g.state_dir.join("gpupin.sock"))
        .env(ROLE_PID, her_process.pid().to_string())
        .env(ROLE_OUT, &summary)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .uid(mallory.uid)
        .gid(mallory.gid);
    let mut load = load.spawn().unwrap();

    // The honest user meanwhile: a hold, its release, a job, again and again.
    let started = Instant::now();
    let (mut worst, mut rounds, mut most) = (Duration::ZERO, 0, (0, 0));
    let honest_pid = honest_process.pid().to_string();
    while load.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(150),
            "the hostile client did not end"
        );
        let id = format!("hana-{rounds}");
        let steps: [&[&str]; 3] = [
            &["hold", &id, "--devices", "7", "--pid", &honest_pid],
            &["release", &id],
            &["exec", "--count", "1", "--", "true"],
        ];
        for args in steps {
            let asked = Instant::now();
            ok(&g, Some(&hana), args);
            worst = worst.max(asked.elapsed());
        }
        let (fds, threads) = fds_and_threads(daemon.pid());
        most = (most.0.max(fds), most.1.max(threads));
        assert!(
            fds < BOUND && threads < BOUND,
            "gpupin serve has {fds} fds and {threads} threads open"
        );
        rounds += 1;
    }
    let out = load.wait_with_output().unwrap();
    assert!(
        out.status.success() && harness::stdout(&out).contains("1 passed"),
        "the hostile client: {}{}",
        harness::stdout(&out),
        harness::stderr(&out)
    );
    let seen: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    harness::say(&format!(
        "honest rounds {rounds}, worst answer {worst:?}; daemon at most {} fds, {} threads; hostile: {seen}",
        most.0, most.1
    ));
    assert!(rounds > 0, "the honest user got no round in");
    assert!(daemon.running(), "{}", daemon.log());
    let (fds, threads) = fds_and_threads(daemon.pid());
    assert!(
        fds < BOUND && threads < BOUND,
        "{fds} fds, {threads} threads"
    );

    // Her holds, asked a thousand times, are watched once and go with her process:
    // two of m0, m1, m2 (whichever came first; her limit is 2).
    let held = holder_ids(&g.status());
    let hers = held.iter().filter(|h| h.starts_with('m')).count();
    assert_eq!(hers, 2, "{held:?}");
    her_process.stop();
    until("her holds are released when her process ends", || {
        let held = holder_ids(&g.status());
        (!held.iter().any(|h| h.starts_with('m'))).then_some(())
    });
    assert!(daemon.running(), "{}", daemon.log());
    drop(honest_process);
    until_clean(&g);
}

/// Env of the client that queues, hangs up and lives on: the socket, and a directory
/// in which it and the test tell each other how far they got.
const HANGUP_SOCKET: &str = "GPUPIN_LOAD_HANGUP_SOCKET";
const HANGUP_DIR: &str = "GPUPIN_LOAD_HANGUP_DIR";

/// Waits (at most a minute) until `path` exists.
fn until_file(path: &Path) {
    let start = Instant::now();
    while !path.exists() && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A caller that asks for a GPU with a wait, closes its connection once queued, and
/// lives on until told to end: its ticket must go with the connection.
fn hangup_client() -> bool {
    let (Ok(socket), Ok(dir)) = (std::env::var(HANGUP_SOCKET), std::env::var(HANGUP_DIR)) else {
        return false;
    };
    let dir = Path::new(&dir);
    let mut stream = UnixStream::connect(socket).unwrap();
    let exec = r#"{"op":"exec","request":[["gpupin.count","1"],["gpupin.wait","90s"]]}"#;
    writeln!(stream, "{exec}").unwrap();
    until_file(&dir.join("queued"));
    drop(stream);
    std::fs::write(dir.join("closed"), "").unwrap();
    until_file(&dir.join("done"));
    true
}

#[test]
fn an_over_limit_waiter_makes_neither_roots_exec_nor_a_container_wait() {
    let test = "an_over_limit_waiter_makes_neither_roots_exec_nor_a_container_wait";
    if hangup_client() {
        return;
    }
    if !requirements(test) {
        return;
    }
    let extra = "[limits]\nmax_gpus_per_user = 1\n";
    let Some(sb) = Sandbox::with_config(GPUPIN, test, "sim:nvswitch8", extra) else {
        return;
    };
    let g = &sb.gpupin;
    open_up(g);
    let alice = User::create("park");
    let _daemon = Daemon::start(g);
    let mut hers = Sleeper::start(&alice);
    let pid = hers.pid().to_string();
    ok(
        g,
        Some(&alice),
        &["hold", "a1", "--devices", "0", "--pid", &pid],
    );
    // At her limit, she queues for one more GPU, for a long time.
    let wait = ["--count", "1", "--wait", "90s"];
    let mut job = Job::start(g, Some(&alice), "parked", &wait);
    until("her job waits", || (queued(g) == 1).then_some(()));

    // Root's exec and a container's hook do not wait behind her, with 7 GPUs free.
    let out = ok(g, None, &["exec", "--count", "1", "--", "true"]);
    drop(out);
    let id = sb.id("beside");
    let container = sb
        .start(&id, &sb.spec().annotation("gpupin.count", "1"))
        .expect("the container is not refused behind alice's waiter");
    assert_eq!(g.held_minors(container.id()).len(), 1);
    assert!(!job.has_started() && queued(g) == 1, "she still waits");
    drop(container);

    // A second request of hers that hangs up once queued, its process alive: its ticket
    // goes with the connection.
    let talk = scratch(g).join("hangup");
    std::fs::create_dir(&talk).unwrap();
    std::fs::set_permissions(&talk, std::fs::Permissions::from_mode(0o777)).unwrap();
    let mut client = Command::new(std::env::current_exe().unwrap());
    client
        .args(["--exact", test, "--test-threads=1", "-q"])
        .env(HANGUP_SOCKET, g.state_dir.join("gpupin.sock"))
        .env(HANGUP_DIR, &talk)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .uid(alice.uid)
        .gid(alice.gid);
    let mut client = client.spawn().unwrap();
    until("her second request waits", || {
        (queued(g) == 2).then_some(())
    });
    std::fs::write(talk.join("queued"), "").unwrap();
    until("her second request hangs up", || {
        talk.join("closed").exists().then_some(())
    });
    until("its ticket goes with the connection", || {
        (queued(g) == 1).then_some(())
    });
    assert!(
        client.try_wait().unwrap().is_none(),
        "the caller still runs"
    );
    std::fs::write(talk.join("done"), "").unwrap();
    assert!(client.wait().unwrap().success());

    // Her own hold ends: she is served.
    hers.stop();
    let report = job.ready();
    assert_eq!(report.cuda_indices().len(), 1);
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(g);
}

/// A cgroup of the pids controller (v1 `pids` hierarchy, or cgroup2 with `pids` enabled
/// at its root), removed when dropped; the processes in it must be gone by then.
struct PidsCgroup(std::path::PathBuf);

impl PidsCgroup {
    fn create(name: &str) -> Result<PidsCgroup, String> {
        let v1 = Path::new("/sys/fs/cgroup/pids");
        let v2 = Path::new("/sys/fs/cgroup");
        let parent = if v1.join("cgroup.procs").exists() {
            v1
        } else if std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .is_ok_and(|c| c.split_whitespace().any(|c| c == "pids"))
        {
            v2
        } else {
            return Err("no pids cgroup controller to limit the daemon's threads".into());
        };
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(PidsCgroup(dir))
    }

    fn limit(&self, max: usize, pid: i32) {
        std::fs::write(self.0.join("pids.max"), max.to_string()).unwrap();
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).unwrap();
    }
}

impl Drop for PidsCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_daemon_that_cannot_start_a_thread_refuses_and_keeps_watching() {
    let test = "a_daemon_that_cannot_start_a_thread_refuses_and_keeps_watching";
    if !requirements(test) {
        return;
    }
    let name = format!("gpupin-test-{}", std::process::id());
    let Some(cgroup) = harness::required(test, PidsCgroup::create(&name)) else {
        return;
    };
    // Caps far above what the tasks limit lets the daemon start.
    let g = gpupin("[serve]\nmax_connections = 1000\nmax_connections_per_user = 1000\n");
    let alice = User::create("spawn");
    let mut daemon = Daemon::start(&g);
    let mut hers = Sleeper::start(&alice);
    let pid = hers.pid().to_string();
    ok(
        &g,
        Some(&alice),
        &["hold", "a1", "--devices", "1", "--pid", &pid],
    );

    // A tasks limit a few threads above what the daemon runs now, then idle connections.
    let (_, threads) = fds_and_threads(daemon.pid());
    cgroup.limit(threads + 4, daemon.pid());
    let socket = g.state_dir.join("gpupin.sock");
    let conns: Vec<UnixStream> = (0..40)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let refused = until("some connections are refused", || {
        let answered: Vec<String> = conns
            .iter()
            .filter_map(|c| {
                c.set_nonblocking(true).unwrap();
                let mut line = String::new();
                BufReader::new(c).read_line(&mut line).ok()?;
                (!line.is_empty()).then_some(line)
            })
            .collect();
        (!answered.is_empty()).then_some(answered)
    });
    assert!(
        refused
            .iter()
            .all(|l| l.contains("gpupin serve cannot take this request now") && l.ends_with("}\n")),
        "{refused:?}"
    );
    assert!(daemon.running(), "{}", daemon.log());

    // The idle connections go: the daemon answers again, and still watches a1.
    drop(conns);
    let args = ["hold", "a2", "--devices", "2", "--pid", &pid];
    until("alice is answered again", || {
        cmd_ok(&g, &alice, &args).then_some(())
    });
    hers.stop();
    until("her holds are released when her process ends", || {
        holder_ids(&g.status()).is_empty().then_some(())
    });
    assert!(daemon.running(), "{}", daemon.log());
    drop(daemon);
    drop(cgroup);
}

/// Whether `gpupin ARGS` as `user` succeeds.
fn cmd_ok(g: &gpupin_sandbox::harness::Gpupin, user: &User, args: &[&str]) -> bool {
    exec_support::run(g, Some(user), args).status.success()
}
