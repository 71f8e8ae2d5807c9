//! Processes on GPUs with real pids in the live file (NVML lists them on a real machine):
//! a `sleep` inside a runc container, and one `runc exec`'d into it, are the container's;
//! a `sleep` started outside is no one's, shows as "not gpupin's", and keeps its GPU from
//! exclusive requests unless the config says `foreign = "ignore"`.

use gpupin_sandbox::harness::{Sandbox, Sleeper};
use gpupin_sandbox::hook_message;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// A live file for sim:nvswitch8 with `processes[i]` on GPU i.
fn write_live(path: &Path, processes: &[&[i32]; 8]) {
    let gpus: Vec<Value> = (0..8)
        .map(|i| {
            let list: Vec<Value> = processes[i]
                .iter()
                .map(|pid| json!({"pid": pid, "used_memory": "1GiB"}))
                .collect();
            json!({"index": i, "utilization": 10 * i, "memory_free": "40GiB",
                   "temperature": 40, "power": 100, "processes": list})
        })
        .collect();
    std::fs::write(path, json!({ "gpus": gpus }).to_string()).unwrap();
}

fn sandbox(test: &str, extra: &str) -> Option<(Sandbox, PathBuf)> {
    let config = format!("live_file = \"live.json\"\n{extra}");
    let sb = Sandbox::with_config(GPUPIN, test, "sim:nvswitch8", &config)?;
    let live = sb.gpupin.config.parent().unwrap().join("live.json");
    write_live(&live, &[&[]; 8]);
    Some((sb, live))
}

fn start_one(sb: &Sandbox, name: &str) -> gpupin_sandbox::Container {
    let spec = sb.spec().annotation("gpupin.count", "1");
    sb.start(&sb.id(name), &spec).unwrap()
}

/// `runc exec -d` of `sleep 1001` into container `id`: what `docker exec` does, a
/// process that is no child of the container's init. Its host pid.
fn exec_sleep(sb: &Sandbox, id: &str) -> i32 {
    let pid_file = sb.gpupin.dir.path().join(format!("{id}.exec.pid"));
    let status = Command::new(&sb.runc.binary)
        .arg("--root")
        .arg(&sb.runc.root)
        .args(["exec", "-d", "--pid-file"])
        .arg(&pid_file)
        .args([id, "sleep", "1001"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "runc exec -d into {id}");
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    pid.trim().parse().unwrap()
}

/// The parent, grandparent, … of `pid`, from /proc.
fn ancestors(pid: i32) -> Vec<i32> {
    let parent = |pid: i32| -> Option<i32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
    };
    let mut chain = Vec::new();
    let mut next = parent(pid);
    while let Some(p) = next.filter(|&p| p > 0 && chain.len() < 64) {
        chain.push(p);
        next = parent(p);
    }
    chain
}

/// The processes `status --json` lists on GPU `index`.
fn processes_on(status: &Value, index: usize) -> Vec<Value> {
    status["gpus"][index]["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no process list for GPU {index}: {status:#}"))
        .clone()
}

#[test]
fn processes_map_to_their_container_and_a_foreign_one_keeps_its_gpu() {
    let Some((sb, live)) = sandbox(
        "processes_map_to_their_container_and_a_foreign_one_keeps_its_gpu",
        "",
    ) else {
        return;
    };
    let a = start_one(&sb, "a");
    assert_eq!(sb.gpupin.held_minors(a.id()), [0]);
    let init = a.pid().unwrap();
    let execd = exec_sleep(&sb, a.id());
    // So only its cgroup can tell that it is the container's.
    assert!(
        !ancestors(execd).contains(&init),
        "runc exec'd a child of the container's init"
    );
    let outside = Sleeper::start();
    write_live(
        &live,
        &[
            &[init, execd],
            &[outside.pid()],
            &[],
            &[],
            &[],
            &[],
            &[],
            &[],
        ],
    );

    let status = sb.gpupin.status();
    let on_a = processes_on(&status, 0);
    for (p, pid) in on_a.iter().zip([init, execd]) {
        assert_eq!(p["pid"], pid, "{status:#}");
        assert_eq!(p["holder"], a.id(), "{p}");
        assert_eq!(p["foreign"], false, "{p}");
    }
    assert_eq!(on_a[1]["command"], "sleep 1001");
    let foreign = &processes_on(&status, 1)[0];
    assert_eq!(foreign["pid"], outside.pid());
    assert_eq!(foreign["holder"], Value::Null);
    assert_eq!(foreign["foreign"], true);
    assert_eq!(foreign["user"], "root");
    assert_eq!(foreign["command"], "sleep 1000");
    assert_eq!(status["foreign"], 1);
    assert_eq!(status["gpus"][1]["live"]["temperature"], 40);

    let table = sb.gpupin.run(&["status", "--long"], "");
    let table = String::from_utf8_lossy(&table.stdout);
    let row = table
        .lines()
        .find(|l| l.contains(&outside.pid().to_string()))
        .unwrap_or_else(|| panic!("no row for the foreign sleep:\n{table}"));
    assert!(
        row.starts_with("1 ") && row.contains("not gpupin's"),
        "{table}"
    );
    assert!(row.ends_with("sleep 1000"), "{table}");
    assert!(table.contains("1 process not gpupin's"), "{table}");
    assert!(!table.contains('\x1b'), "no colour into a pipe:\n{table}");
    // One line per GPU by default: GPU 0 is the container's, GPU 1 busy with the foreign
    // sleep though nobody holds it, and --free leaves both out.
    let compact = sb.gpupin.run(&["status"], "");
    let compact = String::from_utf8_lossy(&compact.stdout).to_string();
    let line = |index: &str| {
        compact
            .lines()
            .find(|l| l.split_whitespace().next() == Some(index))
            .unwrap_or_else(|| panic!("no line for GPU {index}:\n{compact}"))
            .to_string()
    };
    assert!(
        line("0").contains(a.id()) && line("1").contains(" 10% "),
        "{compact}"
    );
    assert!(
        line("1").contains(&format!("busy: pid {} (root)", outside.pid())),
        "{compact}"
    );
    let free = sb.gpupin.run(&["status", "--free", "--json"], "");
    let free: Value = serde_json::from_slice(&free.stdout).unwrap();
    let indices: Vec<u64> = free["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [2, 3, 4, 5, 6, 7], "{free:#}");

    // Pack would take GPU 1: the foreign sleep keeps it.
    let b = start_one(&sb, "b");
    assert_eq!(sb.gpupin.held_minors(b.id()), [2]);
    let spec = sb.spec().annotation("gpupin.devices", "1");
    let err = sb.start(&sb.id("c"), &spec).unwrap_err().to_string();
    let line = hook_message(&err).unwrap_or_else(|| panic!("no gpupin line in {err}"));
    assert!(
        line.ends_with(&format!(
            ": it runs pid {} (root: sleep 1000), not started through gpupin",
            outside.pid()
        )),
        "{line}"
    );

    // Once it has ended, the GPU is free again.
    drop(outside);
    let d = start_one(&sb, "d");
    assert_eq!(sb.gpupin.held_minors(d.id()), [1]);
}

#[test]
fn foreign_ignore_allocates_as_before() {
    let Some((sb, live)) = sandbox("foreign_ignore_allocates_as_before", "foreign = \"ignore\"")
    else {
        return;
    };
    let outside = Sleeper::start();
    write_live(
        &live,
        &[&[outside.pid()], &[], &[], &[], &[], &[], &[], &[]],
    );
    let a = start_one(&sb, "a");
    assert_eq!(sb.gpupin.held_minors(a.id()), [0]);
    // status still says whose the process is.
    assert_eq!(processes_on(&sb.gpupin.status(), 0)[0]["foreign"], true);
}
