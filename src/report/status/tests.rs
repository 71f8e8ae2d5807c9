//! The status views against fixed ledgers: which holder each names, the figures and
//! processes, the fit to 80 columns, colour only when asked.

use super::*;
use crate::input::config::DEFAULT_CLAIM_GRACE;
use crate::model::holder::{ContainerInfo, HolderKind, Owner};
use crate::policy::testing::machine;
use crate::report::{STATUS_WIDTH, holder};
use crate::state::ledger::Mode;
use serde_json::Value;
use serde_json::json;

use crate::state::ledger::testing::record;

fn container(id: &str, gpu: &str, engine: &str, name: &str, image: &str) -> Record {
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    Record {
        container: Some(ContainerInfo {
            engine: some(engine),
            name: some(name),
            image: some(image),
        }),
        ..record(id, &[gpu])
    }
}

fn job(id: &str, gpu: &str, kind: HolderKind, user: &str) -> Record {
    Record {
        kind,
        owner: Some(Owner {
            uid: 1000,
            user: user.into(),
            groups: vec!["ml".into()],
        }),
        ..record(id, &[gpu])
    }
}

fn hold_without_process(id: &str, gpu: &str, user: &str) -> Record {
    Record {
        pid: None,
        start_time: None,
        until_release: true,
        ..job(id, gpu, HolderKind::Hold, user)
    }
}

/// The table's line for GPU `index` (the first, with several holders).
fn line(table: &str, index: u32) -> &str {
    let prefix = format!("{index}  ");
    table
        .lines()
        .skip(1)
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for GPU {index}:\n{table}"))
}

fn words(line: &str) -> Vec<&str> {
    line.split("  ")
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn status_json_lists_holders_per_gpu() {
    let inv = machine(3);
    let v = Status::new(&inv, &[record("c1", &["GPU-test-1"])], DEFAULT_CLAIM_GRACE).json();
    assert_eq!(v["total"], 3);
    assert_eq!(v["free"], 2);
    assert_eq!(v["gpus"][1]["holders"][0]["id"], "c1");
    assert_eq!(v["gpus"][1]["holders"][0]["state"], "running");
    assert_eq!(v["gpus"][0]["holders"].as_array().unwrap().len(), 0);
    assert_eq!(v["holders"][0]["since"], "2100-01-01T00:00:00Z");
    assert_eq!(v["holders"][0]["kind"], "container");
    assert_eq!(v["holders"][0]["owner"], Value::Null);
    assert_eq!(v["holders"][0]["container"], Value::Null);
    assert_eq!(v["holders"][0]["until_release"], false);
}

#[test]
fn status_json_says_who_holds_a_gpu() {
    let inv = machine(3);
    let records = [
        container("abc", "GPU-test-0", "docker", "trainer", ""),
        hold_without_process("big-run", "GPU-test-1", "alice"),
    ];
    let v = Status::new(&inv, &records, DEFAULT_CLAIM_GRACE).json();
    let docker = &v["gpus"][0]["holders"][0];
    assert_eq!(
        docker["container"],
        json!({"engine": "docker", "name": "trainer", "image": null})
    );
    let hold = &v["holders"][1];
    assert_eq!(hold["kind"], "hold");
    // The groups stay in the ledger: scripts get who, not what they may do.
    assert_eq!(hold["owner"], json!({"uid": 1000, "user": "alice"}));
    assert_eq!(hold["until_release"], true);
    assert_eq!(hold["pid"], Value::Null);
    assert_eq!(hold["state"], "running");
}

/// The one-line view: a GPU shared by three holders of two users names each holder
/// and each user once.
#[test]
fn the_one_line_view_names_each_user_once() {
    let inv = machine(2);
    let records = [
        job("a1", "GPU-test-0", HolderKind::Exec, "alice"),
        job("b1", "GPU-test-0", HolderKind::Exec, "bob"),
        job("a2", "GPU-test-0", HolderKind::Exec, "alice"),
    ];
    let status = Status::new(&inv, &records, DEFAULT_CLAIM_GRACE);
    let text = status.compact(false);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        words(lines[0]),
        ["GPU", "MODEL", "UTIL", "MEMORY", "HOLDER", "USER", "SINCE"]
    );
    assert!(
        lines[1].contains("a1, b1, a2") && lines[1].contains(" alice,bob "),
        "{text}"
    );
    assert_eq!(words(lines[2])[4..], ["-", "-", "-"], "{text}");
}

/// An idle holder (`gpupin serve`'s looks) is marked in the one-line view, in
/// `--long` and in the JSON; a busy one is not.
#[test]
fn an_idle_holder_is_marked_in_each_view() {
    let inv = machine(2);
    let records = [
        job("nb", "GPU-test-0", HolderKind::Exec, "alice"),
        job("train", "GPU-test-1", HolderKind::Exec, "bob"),
    ];
    let since = crate::state::ledger::unix_now() - (3600 + 5 * 60 + 30);
    let idle = [Idle {
        holder: "nb".into(),
        since,
    }];
    let status = Status {
        idle: &idle,
        ..Status::new(&inv, &records, DEFAULT_CLAIM_GRACE)
    };
    let compact = status.compact(false);
    let lines: Vec<&str> = compact.lines().collect();
    assert!(lines[1].contains("nb (idle 1h05m)"), "{compact}");
    assert!(!lines[2].contains("idle"), "{compact}");
    let long = status.table(false);
    assert!(long.contains("nb (alice, idle 1h05m)"), "{long}");
    assert!(long.contains("train (bob)"), "{long}");
    let json = status.json();
    let holder = |id: &str| {
        json["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == id)
            .unwrap()
            .clone()
    };
    let nb = holder("nb");
    assert!(nb["idle"]["seconds"].as_u64().unwrap() >= 3930, "{nb}");
    assert_eq!(
        nb["idle"]["since"],
        humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_secs(since))
            .to_string()
    );
    assert!(holder("train")["idle"].is_null());
    assert_eq!(json["gpus"][0]["holders"][0]["idle"], nb["idle"]);
}

#[test]
fn status_table_shows_holder_and_summary() {
    let inv = machine(2);
    let t = status_table(&inv, &[record("c1", &["GPU-test-0"])], DEFAULT_CLAIM_GRACE);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(
        words(lines[0]),
        ["GPU", "HOLDER", "KIND", "IMAGE", "PID", "AGE"]
    );
    let pid = std::process::id().to_string();
    assert_eq!(words(lines[1]), ["0", "c1", "container", &pid, "0s"], "{t}");
    assert_eq!(lines[2], "1    -", "{t}");
    assert_eq!(lines[3], "1 of 2 GPUs free, 1 holder (test)");
}

#[test]
fn status_table_names_containers_jobs_and_holds() {
    let inv = machine(5);
    let pid = std::process::id().to_string();
    let records = [
        container("3f2a9c", "GPU-test-0", "docker", "trainer", "my/trainer:2"),
        container("77e1b0", "GPU-test-1", "podman", "", ""),
        record("runc-1", &["GPU-test-2"]),
        job("exec-42", "GPU-test-3", HolderKind::Exec, "bob"),
        hold_without_process("big-run", "GPU-test-4", "alice"),
    ];
    let t = status_table(&inv, &records, DEFAULT_CLAIM_GRACE);
    let row = |i| words(line(&t, i));
    assert_eq!(
        row(0),
        ["0", "trainer", "docker", "my/trainer:2", &pid, "0s"]
    );
    // Podman tells no name: the id, as for plain runc.
    assert_eq!(row(1), ["1", "77e1b0", "podman", &pid, "0s"]);
    assert_eq!(row(2), ["2", "runc-1", "container", &pid, "0s"]);
    assert_eq!(row(3), ["3", "exec-42 (bob)", "exec", &pid, "0s"]);
    assert_eq!(
        row(4),
        ["4", "big-run (alice)", "hold", holder::UNTIL_RELEASED, "0s"]
    );
}

#[test]
fn status_shows_mig_instances_under_their_gpu() {
    let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
    let instance = inv.find_mig("0:2").unwrap().uuid.clone();
    let mut r = crate::state::ledger::testing::record("c1", &[instance.as_str()]);
    r.indices = vec![0];
    let records = [r];
    let status = Status::new(&inv, &records, Duration::from_secs(60));
    let text = status.compact(false);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[1].starts_with("0 ") && lines[1].contains("MIG: 3 of 4 free"),
        "{text}"
    );
    assert!(
        lines[4].starts_with(" 0:2") && lines[4].contains("MIG 1g.10gb"),
        "{text}"
    );
    assert!(lines[4].contains("c1"), "{text}");
    assert!(lines[12].contains("MIG mode, no instances"), "{text}");
    assert!(
        text.contains("6 of 6 GPUs free, 3 of 4 MIG instances free, 1 holder"),
        "{text}"
    );
    assert!(
        text.lines().all(|l| l.chars().count() <= STATUS_WIDTH),
        "{text}"
    );
    let long = status.table(false);
    assert!(long.contains(" 0:2  c1"), "{long}");
    let json = status.json();
    assert_eq!(json["mig_total"], 4);
    assert_eq!(json["mig_free"], 3);
    assert_eq!(json["total"], 6);
    assert_eq!(json["gpus"][0]["mig"][2]["address"], "0:2");
    assert_eq!(json["gpus"][0]["mig"][2]["holders"][0]["id"], "c1");
    assert_eq!(json["gpus"][7]["mig"], serde_json::json!([]));
    assert!(json["gpus"][1].get("mig").is_none());
}

#[test]
fn status_table_fits_80_columns_whatever_the_names() {
    let inv = machine(3);
    let id = "f".repeat(64);
    let image = format!("registry.example.com/{}trainer:v2", "team/".repeat(40));
    let mut shared = container(&id, "GPU-test-0", "docker", "", &image);
    shared.mode = Mode::Shared;
    shared.request.reserve = Some(20 << 30);
    let records = [
        shared,
        container("c2", "GPU-test-1", "containerd", &"n".repeat(200), ""),
        hold_without_process(&"h".repeat(100), "GPU-test-2", "alice"),
    ];
    let t = status_table(&inv, &records, DEFAULT_CLAIM_GRACE);
    for l in t.lines() {
        assert!(
            l.chars().count() <= STATUS_WIDTH,
            "{} columns: {l}\n{t}",
            l.chars().count()
        );
    }
    let first = line(&t, 0);
    assert!(first.contains("  fff… (shared, 20GiB)  docker"), "{t}");
    assert!(first.contains("/team/trainer:v2  "), "{t}");
    assert!(line(&t, 1).contains("nnnn…"), "{t}");
    assert!(line(&t, 2).contains("hhh… (alice)"), "{t}");
    assert!(line(&t, 2).contains(holder::UNTIL_RELEASED), "{t}");
}

#[test]
fn status_table_marks_shared_holders_and_their_reservations() {
    let inv = machine(1);
    let mut a = record("a", &["GPU-test-0"]);
    a.mode = Mode::Shared;
    a.request.share = crate::input::request::Share::Shared;
    a.request.reserve = Some(20 << 30);
    let mut b = record("b", &["GPU-test-0"]);
    b.mode = Mode::Shared;
    let t = status_table(&inv, &[a, b], DEFAULT_CLAIM_GRACE);
    assert!(t.contains("a (shared, 20GiB)"), "{t}");
    assert!(t.contains("b (shared)"), "{t}");
    assert!(t.ends_with("0 of 1 GPUs free, 2 holders (test)\n"), "{t}");
}

fn seen(pid: i32, ancestors: &[i32], user: &str, command: &str) -> Seen {
    Seen {
        pid,
        used_memory: Some(3 << 29),
        process: Some(crate::host::whose::Process {
            pid,
            start_time: 1,
            uid: Some(1000),
            user: Some(user.into()),
            command: command.into(),
            ancestors: ancestors.to_vec(),
            cgroup: String::new(),
        }),
    }
}

/// Two GPUs: `c1` (this process) holds GPU 0 and runs a child there; GPU 1 runs
/// bob's process, which no holder owns, and one /proc does not show.
fn live_machine() -> (Inventory, Vec<Record>, Vec<Live>, Vec<Vec<Seen>>) {
    let me = std::process::id() as i32;
    let live = vec![
        Live {
            utilization: Some(35),
            memory_free: 20 << 30,
            temperature: Some(41),
            power: Some(120),
            processes: None,
        },
        Live {
            utilization: Some(99),
            memory_free: 70 << 30,
            ..Live::default()
        },
    ];
    let hidden = Seen {
        pid: 7,
        used_memory: None,
        process: None,
    };
    let long = format!("python {}", "x".repeat(200));
    let processes = vec![
        vec![seen(4300, &[me, 1], "root", "python serve.py")],
        vec![seen(4242, &[1], "bob", &long), hidden],
    ];
    let records = vec![container("c1", "GPU-test-0", "docker", "trainer", "")];
    (machine(2), records, live, processes)
}

#[test]
fn status_table_shows_figures_and_whose_each_process_is() {
    let (inv, records, live, processes) = live_machine();
    let status = Status {
        live: Some(&live),
        processes: Some(&processes),
        ..Status::new(&inv, &records, DEFAULT_CLAIM_GRACE)
    };
    let t = status.table(false);
    assert!(
        // GPU 1 runs a process of no holder: not free (issue 32, item 5).
        t.contains("0 of 2 GPUs free, 1 holder, 1 process not gpupin's (test)\n"),
        "{t}"
    );
    let figures: Vec<Vec<&str>> = t
        .lines()
        .skip_while(|l| !l.starts_with("GPU  UTIL"))
        .skip(1)
        .take(2)
        .map(words)
        .collect();
    assert_eq!(
        figures[0],
        ["0", "35%", "60.0/80.0GiB", "41C", "120W"],
        "{t}"
    );
    assert_eq!(figures[1], ["1", "99%", "10.0/80.0GiB", "-", "-"], "{t}");
    let rows: Vec<&str> = t
        .lines()
        .skip_while(|l| !l.starts_with("GPU  PID"))
        .skip(1)
        .collect();
    assert_eq!(
        words(rows[0]),
        ["0", "4300", "root", "1.5GiB", "trainer", "python serve.py"]
    );
    assert!(
        rows[1].starts_with("1    4242  bob   1.5GiB  not gpupin's  python xxx"),
        "{t}"
    );
    assert!(rows[1].ends_with('…'), "{t}");
    assert_eq!(words(rows[2]), ["1", "7", "?", "-", "?"]);
    for l in t.lines() {
        assert!(l.chars().count() <= STATUS_WIDTH, "{l}\n{t}");
    }
    assert!(!t.contains('\x1b'));
}

#[test]
fn status_colours_headers_and_foreign_processes_only_when_asked() {
    let (inv, records, live, processes) = live_machine();
    let status = Status {
        live: Some(&live),
        processes: Some(&processes),
        ..Status::new(&inv, &records, DEFAULT_CLAIM_GRACE)
    };
    let t = status.table(true);
    let yellow: Vec<&str> = t.lines().filter(|l| l.starts_with("\x1b[33m")).collect();
    assert_eq!(yellow.len(), 1, "{t}");
    assert!(yellow[0].contains("4242"), "{t}");
    assert_eq!(
        t.lines().filter(|l| l.starts_with("\x1b[1mGPU")).count(),
        3,
        "{t}"
    );
}

#[test]
fn status_json_carries_figures_and_processes() {
    let (inv, records, live, processes) = live_machine();
    let status = Status {
        live: Some(&live),
        processes: Some(&processes),
        ..Status::new(&inv, &records, DEFAULT_CLAIM_GRACE)
    };
    let v = status.json();
    assert_eq!(v["foreign"], 1);
    assert_eq!(v["live_error"], Value::Null);
    let g0 = &v["gpus"][0];
    assert_eq!(
        g0["live"],
        json!({"utilization": 35, "memory_free": 20u64 << 30, "memory_used": 60u64 << 30,
               "memory_total": 80u64 << 30, "temperature": 41, "power": 120})
    );
    assert_eq!(g0["processes"][0]["holder"], "c1");
    assert_eq!(g0["processes"][0]["foreign"], false);
    let bob = &v["gpus"][1]["processes"][0];
    assert_eq!(bob["holder"], Value::Null);
    assert_eq!(bob["foreign"], true);
    assert_eq!(
        (bob["user"].as_str(), bob["uid"].as_u64()),
        (Some("bob"), Some(1000))
    );
    let hidden = &v["gpus"][1]["processes"][1];
    assert_eq!(
        (hidden["foreign"].clone(), hidden["command"].clone()),
        (Value::Null, Value::Null)
    );
    let without = Status::new(&inv, &records, DEFAULT_CLAIM_GRACE).json();
    assert_eq!(without["gpus"][0]["live"], Value::Null);
    assert_eq!(without["gpus"][0]["processes"], Value::Null);
}

#[test]
fn a_live_error_is_one_line_under_the_summary() {
    let inv = machine(1);
    let status = Status {
        live_error: Some("reading live file /x/live.json: No such file"),
        ..Status::new(&inv, &[], DEFAULT_CLAIM_GRACE)
    };
    let t = status.table(false);
    assert!(
        t.ends_with("(test)\nno live figures: reading live file /x/live.json: No such file\n"),
        "{t}"
    );
}

#[test]
fn status_table_marks_holders_that_are_gone() {
    let inv = machine(1);
    let mut gone = record("c1", &["GPU-test-0"]);
    gone.pid = Some(i32::MAX);
    let t = status_table(&inv, &[gone], DEFAULT_CLAIM_GRACE);
    assert!(line(&t, 0).contains("c1 (gone)"), "{t}");
}
