//! `gpupin drain` and `undrain` end to end, as an admin and a user would check them: what
//! `drain` prints, what `gpupin status` shows, what a request for a drained GPU is told,
//! that its holder keeps it until it ends (`--wait` returns then), what `pick --explain`
//! says, the audit trail, and that only root may drain.

#[allow(dead_code)]
mod exec_support;

use exec_support::{User, audit, gpupin, ok, refused, requirements, run};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Not a timed assertion: how long `drain --wait` may take to see its holder gone,
/// so that one that never returns fails the test instead of hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

#[test]
fn a_drained_gpu_goes_to_no_one_its_holder_keeps_it_and_undrain_brings_it_back() {
    let test = "a_drained_gpu_goes_to_no_one";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    ok(
        &g,
        None,
        &["hold", "busy", "--devices", "3", "--until-release"],
    );
    let said = ok(
        &g,
        None,
        &["drain", "3", "5", "--reason", "fan swap, ticket 4411"],
    );
    let uuid = |i: usize| format!("GPU-5a1e0001-0000-4000-8000-00000000000{i}");
    assert_eq!(
        said,
        format!(
            "drained GPU 3 ({}): fan swap, ticket 4411\ndrained GPU 5 ({}): fan swap, ticket 4411\nnew requests skip it; busy (root) keeps it until it ends\n",
            uuid(3),
            uuid(5)
        )
    );

    // What status shows: the fence per GPU, the count, the holder kept.
    let status: Value = serde_json::from_str(&ok(&g, None, &["status", "--json"])).unwrap();
    assert_eq!(status["fenced"], 2);
    assert_eq!(
        status["free"], 6,
        "8 less GPU 3 (held and drained) and GPU 5 (drained)"
    );
    for i in [3, 5] {
        let fence = &status["gpus"][i]["fence"];
        assert_eq!(fence["state"], "drained", "{fence}");
        assert_eq!(fence["reason"], "fan swap, ticket 4411");
        assert_eq!(fence["by"], "root");
    }
    assert!(status["gpus"][4]["fence"].is_null());
    assert_eq!(status["gpus"][3]["holders"][0]["id"], "busy");
    let table = ok(&g, None, &["status"]);
    let line5 = table.lines().find(|l| l.starts_with("5 ")).unwrap();
    assert!(line5.contains("DRAINED: fan swap"), "{table}");
    assert!(
        table.contains("6 of 8 GPUs free, 2 out of allocation, 1 holder"),
        "{table}"
    );

    // What a request is told.
    let line = refused(&g, None, &["exec", "--devices", "5", "--", "true"]);
    assert_eq!(
        line,
        format!(
            "gpupin: cannot allocate GPU 5 ({}) for {}: it is drained by root: fan swap, ticket 4411; it comes back with gpupin undrain 5",
            uuid(5),
            exec_id(&g)
        )
    );
    let seven = refused(
        &g,
        None,
        &["exec", "--count", "7", "--wait", "1h", "--", "true"],
    );
    assert!(
        seven.ends_with("2 GPUs are out of allocation (drained or unhealthy: gpupin status says why), so no wait helps: ask for at most 6"),
        "{seven}"
    );
    let explained = ok(&g, None, &["pick", "--count", "1", "--explain"]);
    assert!(
        explained.contains("not chosen from: GPU 5 is drained by root: fan swap, ticket 4411; it comes back with gpupin undrain 5"),
        "{explained}"
    );

    // Only root drains.
    let alice = User::create("drn");
    let line = refused(&g, Some(&alice), &["drain", "1", "--reason", "mine now"]);
    assert_eq!(
        line,
        "gpupin: gpupin drain changes which GPUs everyone may get: run it as root (sudo gpupin drain ...)"
    );

    // --wait returns once the holder has ended, not before.
    let mut waiting = exec_support::cmd(
        &g,
        None,
        &["drain", "3", "--reason", "fan swap, ticket 4411", "--wait"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        waiting.try_wait().unwrap().is_none(),
        "returned while busy holds GPU 3"
    );
    ok(&g, None, &["release", "busy"]);
    let started = Instant::now();
    while waiting.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < PATIENCE, "drain --wait did not return");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = waiting.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.ends_with("busy ended\nno holder has it any more: it is free and drained\n"),
        "{text}"
    );

    // Undrain: what each was, and which was not drained; GPU 5 is handed out again.
    let said = ok(&g, None, &["undrain", "5", "6"]);
    assert_eq!(
        said,
        "undrained GPU 5 (was drained by root: fan swap, ticket 4411): it is handed out again\nGPU 6 was not drained\n"
    );
    let out = run(&g, None, &["exec", "--devices", "5", "--", "true"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The trail: one line per GPU drained and undrained, who and why.
    let fences: Vec<(String, String, String)> = audit(&g)
        .iter()
        .filter(|e| e["event"] == "drain" || e["event"] == "undrain")
        .map(|e| {
            (
                e["event"].as_str().unwrap().to_string(),
                e["holder"].as_str().unwrap().to_string(),
                e["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let drained = |gpu: &str| {
        (
            "drain".to_string(),
            gpu.to_string(),
            "fan swap, ticket 4411".to_string(),
        )
    };
    assert_eq!(
        fences,
        [
            drained("gpu-3"),
            drained("gpu-5"),
            drained("gpu-3"),
            (
                "undrain".into(),
                "gpu-5".into(),
                "was drained: fan swap, ticket 4411".into()
            ),
        ]
    );
    assert!(
        audit(&g)
            .iter()
            .filter(|e| e["event"] == "drain")
            .all(|e| e["user"] == "root" && e["code"] == "drained")
    );
}

/// The id of the exec refused last (`exec-<pid>`), from the refusals log.
fn exec_id(g: &gpupin_sandbox::harness::Gpupin) -> String {
    audit(g)
        .iter()
        .rev()
        .find(|e| e["event"] == "refuse")
        .and_then(|e| e["holder"].as_str())
        .unwrap()
        .to_string()
}

/// A user who could pause `gpupin serve`'s GPU health watch (what `gpupin reset` asks
/// for) would keep every GPU's failures from being seen: the daemon refuses the pause and
/// the resume from anyone but root, audits the attempt and goes on; `gpupin reset` itself
/// is root's.
#[test]
fn only_root_pauses_the_health_watch_or_resets_a_gpu() {
    let test = "only_root_pauses_the_health_watch";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let mut daemon = exec_support::Daemon::start(&g);
    let mallory = User::create("hpm");
    let socket = g.state_dir.join("gpupin.sock");
    // A hand-made client, run as the user: the kernel tells the daemon who connects.
    let ask = |request: &str| -> Value {
        let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode()+b'\\n')\nprint(s.makefile().readline(),end='')";
        let out = std::process::Command::new("python3")
            .args(["-c", script])
            .arg(&socket)
            .arg(request)
            .uid(mallory.uid)
            .gid(mallory.gid)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let paused = ask(r#"{"op":"pause_health","secs":600}"#);
    assert_eq!(
        paused["error"],
        format!(
            "only root may pause the GPU health watch (uid {} asked)",
            mallory.uid
        )
    );
    let resumed = ask(r#"{"op":"resume_health"}"#);
    assert_eq!(
        resumed["error"],
        format!(
            "only root may resume the GPU health watch (uid {} asked)",
            mallory.uid
        )
    );
    let refusals: Vec<Value> = audit(&g)
        .into_iter()
        .filter(|e| e["event"] == "refuse" && e["code"] == "not_yours")
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(daemon.running(), "{}", daemon.log());

    let line = refused(&g, Some(&mallory), &["reset", "1"]);
    assert_eq!(
        line,
        "gpupin: gpupin reset changes which GPUs everyone may get: run it as root (sudo gpupin reset ...)"
    );
}
