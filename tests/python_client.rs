//! The Python client (python/gpupin) against a real `gpupin serve`: pytest's suite
//! (python/tests) run as a throwaway user, with the daemon as root on a simulated machine
//! of which root holds all but three GPUs, and a limit of two GPUs per user. Acquire, exit,
//! kill -9, the limit, waiting, the refusal after CUDA started, and a user's hold for
//! another user's process (adversarial) are the Python suite's cases; this file sets the
//! stage, then checks from outside what the suite left.
//!
//! With CI=true it fails when python3 or pytest are missing; elsewhere it says why it is
//! skipped. The distributed example (examples/distributed) runs here too, with a stub
//! rank.

#[allow(dead_code)]
mod exec_support;

use exec_support::{Daemon, User, gpupin, ok, python_tree, requirements, scratch, until_clean};
use gpupin_sandbox::harness;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// GPUs the test's users may have: root holds the other five. One more than the limit
/// lets one user have: a limit is reached before the GPUs run out (a refusal by the
/// limit), and a holder at the limit leaves too few for another as big (a wait).
const FREE: usize = 3;
/// limits.max_gpus_per_user.
const LIMIT: usize = 2;

/// A python3 other users can run that has pytest: Debian's first (python3-pytest), then
/// the ones on PATH.
fn python_with_pytest() -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut candidates = vec![PathBuf::from("/usr/bin/python3")];
    candidates.extend(std::env::split_paths(&path).map(|d| d.join("python3")));
    let mut seen = Vec::new();
    for python in candidates.into_iter().filter(|p| p.is_file()) {
        let works = Command::new(&python)
            .args(["-m", "pytest", "--version"])
            .output()
            .is_ok_and(|o| o.status.success());
        if works && others_may_run(&python) {
            return Ok(python);
        }
        seen.push(python.display().to_string());
    }
    Err(format!(
        "no python3 with pytest that other users may run (tried {}): apt-get install python3-pytest",
        if seen.is_empty() {
            "none found".to_string()
        } else {
            seen.join(", ")
        }
    ))
}

/// Whether every directory above `path` lets others through (a pyenv under /root does not).
fn others_may_run(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    path.ancestors()
        .skip(1)
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.mode() & 0o001 != 0))
}

#[test]
fn the_python_client_acquires_releases_waits_and_is_refused_as_the_daemon_says() {
    let test = "the_python_client";
    if !requirements(test) {
        return;
    }
    let Some(python) = harness::required(test, python_with_pytest()) else {
        return;
    };
    let g = gpupin(&format!("[limits]\nmax_gpus_per_user = {LIMIT}"));
    let user = User::create("py");
    let _daemon = Daemon::start(&g);
    let reserved: Vec<String> = (FREE..8).map(|i| i.to_string()).collect();
    ok(
        &g,
        None,
        &[
            "hold",
            "reserved",
            "--devices",
            &reserved.join(","),
            "--until-release",
        ],
    );
    let tree = python_tree(g.dir.path());
    let work = scratch(&g);
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pytest", "-v", "-p", "no:cacheprovider", "-rs"])
        .arg(tree.join("tests"))
        .current_dir(&work)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", &work)
        .env("GPUPIN_SOCKET", g.state_dir.join("gpupin.sock"))
        .env("GPUPIN_BIN", &g.bin)
        .env("GPUPIN_CONFIG", &g.config)
        .env("GPUPIN_TEST_FREE", FREE.to_string())
        .env("GPUPIN_TEST_LIMIT", LIMIT.to_string());
    user.owns(&mut cmd);
    let out = cmd.output().unwrap();
    let report = format!("{}{}", harness::stdout(&out), harness::stderr(&out));
    harness::say(&report);
    assert!(out.status.success(), "pytest failed:\n{report}");
    assert!(
        !report.contains("SKIPPED"),
        "every case ran against the daemon:\n{report}"
    );

    // What the suite left: nothing of the user's; root's reservation as it was.
    let status = g.status();
    let ids = exec_support::holder_ids(&status);
    assert_eq!(ids, ["reserved"], "{status}");
    ok(&g, None, &["release", "reserved"]);
    until_clean(&g);
}

/// Adversarial: bob, through the Python client's requests, holds GPUs for alice's Python
/// process (whose GPUs would then go with it), as alice, or releases her holder: each is
/// refused in one line, and her holder and the ledger stay as they were.
#[test]
fn adversarial_a_user_cannot_acquire_for_another_users_python_process() {
    let test = "adversarial_a_user_cannot_acquire_for_another_users_python_process";
    if !requirements(test) {
        return;
    }
    let Some(python) = harness::required(test, python_with_pytest()) else {
        return;
    };
    let g = gpupin("");
    let alice = User::create("pya");
    let bob = User::create("pyb");
    let _daemon = Daemon::start(&g);
    let tree = python_tree(g.dir.path());
    let socket = g.state_dir.join("gpupin.sock");
    let as_user = |user: &User, script: &str| {
        let mut cmd = Command::new(&python);
        cmd.args(["-c", script])
            .current_dir(scratch(&g))
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("PYTHONPATH", &tree)
            .env("GPUPIN_SOCKET", &socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        user.owns(&mut cmd);
        cmd
    };
    let mut alices = as_user(
        &alice,
        "import gpupin, sys\nprint(gpupin.acquire(count=1).holder, flush=True)\nsys.stdin.read()\n",
    )
    .spawn()
    .unwrap();
    let mut line = String::new();
    BufReader::new(alices.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let holder = line.trim().to_string();
    assert!(!holder.is_empty(), "alice's acquire printed no holder");
    let before = g.ledger_snapshot();
    let pid = alices.id();
    let script = format!(
        r#"import gpupin, json
ask = {{"op": "hold", "id": "bobs", "devices": "", "request": [["gpupin.count", "1"]]}}
lines = []
for request in [dict(ask, pid={pid}), dict(ask, pid={pid}, user={alice:?}), {{"op": "release", "id": {holder:?}, "exact": True}}]:
    try:
        gpupin._ask(request)
        lines.append(None)
    except gpupin.Error as e:
        lines.append(str(e))
print(json.dumps(lines))
"#,
        alice = alice.name
    );
    let out = as_user(&bob, &script).output().unwrap();
    assert!(out.status.success(), "{}", harness::stderr(&out));
    let lines: Vec<Option<String>> = serde_json::from_str(&harness::stdout(&out)).unwrap();
    assert_eq!(
        lines,
        [
            Some(format!("pid {pid} is not a process of uid {}", bob.uid)),
            Some(format!(
                "only root may hold GPUs for another user ({})",
                alice.name
            )),
            Some(format!(
                "holder {holder} is {}'s, not {}'s: only {} or root may release it",
                alice.name, bob.name, alice.name
            )),
        ]
    );
    assert_eq!(g.ledger_snapshot(), before, "nothing changed");
    assert_eq!(
        exec_support::holder_ids(&g.status()),
        std::slice::from_ref(&holder)
    );
    drop(alices.stdin.take());
    alices.wait().unwrap();
    until_clean(&g);
}

/// examples/distributed/launch.py under `gpupin exec --count 4`: one rank per GPU, each
/// picking its device by LOCAL_RANK among the pinned CUDA_VISIBLE_DEVICES, run with a
/// stub rank that prints what it would use.
#[test]
fn the_distributed_example_runs_one_rank_per_pinned_gpu() {
    let test = "the_distributed_example";
    if !requirements(test) {
        return;
    }
    let Some(python) = harness::required(test, python_with_pytest()) else {
        return;
    };
    let g = gpupin("");
    let user = User::create("dist");
    let _daemon = Daemon::start(&g);
    // Four GPUs taken first: the job gets the other four, not 0-3.
    ok(
        &g,
        None,
        &["hold", "taken", "--devices", "0,2,5,7", "--until-release"],
    );
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/distributed");
    let dest = g.dir.path().join("distributed");
    std::fs::create_dir_all(&dest).unwrap();
    for file in ["launch.py", "stub_rank.py"] {
        std::fs::copy(examples.join(file), dest.join(file)).unwrap();
        std::fs::set_permissions(dest.join(file), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let python = python.to_str().unwrap();
    let launch = dest.join("launch.py");
    let stub = dest.join("stub_rank.py");
    let out = exec_support::run(
        &g,
        Some(&user),
        &[
            "exec",
            "--count",
            "4",
            "--",
            python,
            launch.to_str().unwrap(),
            "--",
            python,
            stub.to_str().unwrap(),
        ],
    );
    let stdout = harness::stdout(&out);
    assert!(out.status.success(), "{stdout}{}", harness::stderr(&out));
    let mut lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("rank ")).collect();
    lines.sort();
    // The free GPUs in bus order are 1,3,4,6: rank N uses the Nth, as cuda:N.
    assert_eq!(
        lines,
        [
            "rank 0 of 4: LOCAL_RANK=0 CUDA_VISIBLE_DEVICES=1,3,4,6 device cuda:0 = GPU 1",
            "rank 1 of 4: LOCAL_RANK=1 CUDA_VISIBLE_DEVICES=1,3,4,6 device cuda:1 = GPU 3",
            "rank 2 of 4: LOCAL_RANK=2 CUDA_VISIBLE_DEVICES=1,3,4,6 device cuda:2 = GPU 4",
            "rank 3 of 4: LOCAL_RANK=3 CUDA_VISIBLE_DEVICES=1,3,4,6 device cuda:3 = GPU 6",
        ],
        "{stdout}"
    );
    ok(&g, None, &["release", "taken"]);
    until_clean(&g);
}
