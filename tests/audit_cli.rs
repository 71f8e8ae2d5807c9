//! `gpupin log` and `gpupin usage` over a known audit trail: a rotated file and the live
//! one, events a few hours old. Needs neither root nor runc.

use gpupin_sandbox::harness::{binary, need_root, stderr, stdout};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const HOUR: u64 = 3600;

/// A config whose ledger and audit log are in a temp dir, and "now" to the second.
struct Trail {
    dir: tempfile::TempDir,
    config: PathBuf,
    log: PathBuf,
    now: u64,
}

impl Trail {
    /// Adds `lines` to the config.
    fn configure(&self, lines: &str) {
        let mut text = std::fs::read_to_string(&self.config).unwrap();
        text.push_str(lines);
        std::fs::write(&self.config, text).unwrap();
    }

    fn new() -> Trail {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log/audit.log");
        std::fs::create_dir(log.parent().unwrap()).unwrap();
        let config = dir.path().join("gpupin.toml");
        let text = format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch8\"\n",
            dir.path().join("state"),
            log
        );
        std::fs::write(&config, text).unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        Trail {
            dir,
            config,
            log,
            now,
        }
    }

    /// RFC 3339 for `ago` seconds before now.
    fn time(&self, ago: u64) -> String {
        let at = UNIX_EPOCH + Duration::from_secs(self.now - ago);
        humantime::format_rfc3339_seconds(at).to_string()
    }

    fn gpupin(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    /// `gpupin --config <the trail's> ARGS`, not started yet.
    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(binary(GPUPIN));
        cmd.env_remove("GPUPIN_CONFIG")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.gpupin(args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    }
}

fn gpus(indices: &[u32]) -> Value {
    indices
        .iter()
        .map(|i| json!({"index": i, "uuid": format!("GPU-5a1e0001-0000-4000-8000-{i:012x}")}))
        .collect()
}

/// The known history, lines of the rotated file and of the live one: a container on GPUs
/// 0-1 for 2h; alice's hold of 2-3 for 3h with a job nested in it; bob's job on 4, reaped
/// after 1h30m; a refusal; and one line that is no event.
fn history(t: &Trail) -> (Vec<String>, Vec<String>) {
    let alice = json!({"kind": "hold", "user": "alice", "uid": 1000});
    let bob = json!({"kind": "exec", "user": "bob", "uid": 1001});
    let train =
        json!({"kind": "container", "engine": "docker", "name": "train", "image": "pytorch:24.05"});
    let ev = |ago: u64, event: &str, holder: &str, who: &Value, on: &[u32], extra: Value| {
        let mut v = json!({"time": t.time(ago), "event": event, "holder": holder});
        let fields = v.as_object_mut().unwrap();
        fields.extend(who.as_object().unwrap().clone());
        if !on.is_empty() {
            fields.insert("gpus".into(), gpus(on));
        }
        fields.extend(extra.as_object().unwrap().clone());
        v.to_string()
    };
    let held = |seconds: u64| json!({"held_s": seconds});
    let rotated = vec![
        ev(5 * HOUR, "allocate", "c-train", &train, &[0, 1], json!({})),
        ev(5 * HOUR, "hold", "res", &alice, &[2, 3], json!({})),
    ];
    let why = json!({"reason": "alice may hold 2 GPUs at a time"});
    let nested = json!({"within": "res", "held_s": HOUR / 2});
    let live = vec![
        ev(
            3 * HOUR,
            "release",
            "c-train",
            &train,
            &[0, 1],
            held(2 * HOUR),
        ),
        ev(3 * HOUR, "allocate", "j1", &bob, &[4], json!({})),
        "{\"time\": torn".to_string(),
        ev(5 * HOUR / 2, "refuse", "j2", &alice, &[], why),
        ev(5 * HOUR / 2, "release", "inner", &alice, &[3], nested),
        ev(2 * HOUR, "release", "res", &alice, &[2, 3], held(3 * HOUR)),
        ev(HOUR, "reap", "j1", &bob, &[4], held(3 * HOUR / 2)),
    ];
    (rotated, live)
}

/// Writes the history; returns its lines in the order they were written.
fn write_history(t: &Trail) -> Vec<String> {
    let (rotated, live) = history(t);
    let text = |lines: &[String]| lines.join("\n") + "\n";
    std::fs::write(t.log.with_file_name("audit.log.1"), text(&rotated)).unwrap();
    std::fs::write(&t.log, text(&live)).unwrap();
    [rotated, live].concat()
}

/// The table's rows as (EVENT, HOLDER, USER, GPUS) and the whole DETAIL.
fn rows(table: &str) -> Vec<(String, String)> {
    let mut lines = table.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("TIME"), "{table}");
    let detail = header.find("DETAIL").unwrap();
    lines
        .map(|l| {
            let cols: Vec<&str> = l[..detail.min(l.len())].split_whitespace().collect();
            (
                cols[1..].join(" "),
                l.get(detail..).unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn log_of_one_user_by_name_or_uid() {
    let t = Trail::new();
    write_history(&t);
    let table = t.ok(&["log", "--user", "alice"]);
    assert_eq!(
        rows(&table),
        pairs(&[
            ("hold res alice 2,3", ""),
            ("refuse j2 alice -", "alice may hold 2 GPUs at a time"),
            ("release inner alice 3", "held for 30m00s; within res"),
            ("release res alice 2,3", "held for 3h00m"),
        ])
    );
    assert!(
        table.lines().nth(1).unwrap().starts_with(&t.time(5 * HOUR)),
        "{table}"
    );
    let by_uid = t.ok(&["log", "--user", "1001"]);
    assert_eq!(
        rows(&by_uid),
        pairs(&[
            ("allocate j1 bob 4", ""),
            ("reap j1 bob 4", "held for 1h30m")
        ])
    );
    // Containers have no user: they go by their engine, as `usage --by user` lists them;
    // HOLDER is the container's name, as docker ps shows it, DETAIL its image.
    let docker = t.ok(&["log", "--user", "docker"]);
    let container = pairs(&[
        ("allocate train docker 0,1", "pytorch:24.05"),
        ("release train docker 0,1", "held for 2h00m; pytorch:24.05"),
    ]);
    assert_eq!(rows(&docker), container);
    // --holder takes the name or the id, as people know either.
    assert_eq!(rows(&t.ok(&["log", "--holder", "train"])), container);
    assert_eq!(rows(&t.ok(&["log", "--holder", "c-train"])), container);
}

/// `gpupin log --follow`: the events so far, then each new one as it is written (here a
/// hold and its release through the CLI), with the filters applied to both.
#[test]
fn log_follow_prints_new_events_as_they_are_written() {
    use std::io::{BufRead, BufReader};
    // Holds until released are root's.
    if !gpupin_sandbox::harness::need_root("log_follow_prints_new_events_as_they_are_written") {
        return;
    }
    let t = Trail::new();
    write_history(&t);
    let mut follow = t
        .command(&["log", "--follow", "--holder", "maint"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Not a timed assertion: a bound, so that a follower that prints nothing fails the
    // test (its stdout closes) instead of hanging it.
    let (done, watchdog) = std::sync::mpsc::channel::<()>();
    let pid = follow.id() as i32;
    std::thread::spawn(move || {
        if watchdog.recv_timeout(Duration::from_secs(120)).is_err() {
            // SAFETY: a signal to our own child, which has not been waited for.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    });
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let header = lines.next().unwrap().unwrap();
    assert!(header.starts_with("TIME"), "{header}");
    t.ok(&["hold", "other", "--devices", "5", "--until-release"]);
    t.ok(&["hold", "maint", "--devices", "6", "--until-release"]);
    t.ok(&["release", "maint"]);
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        seen.push(words[1..=4].join(" "));
        if seen.len() == 2 {
            break;
        }
    }
    let _ = done.send(());
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(seen, ["hold maint root 6", "release maint root 6"]);
}

#[test]
fn log_of_one_gpu_by_index_or_uuid() {
    let t = Trail::new();
    write_history(&t);
    let expected = pairs(&[
        ("hold res alice 2,3", ""),
        ("release inner alice 3", "held for 30m00s; within res"),
        ("release res alice 2,3", "held for 3h00m"),
    ]);
    assert_eq!(rows(&t.ok(&["log", "--gpu", "3"])), expected);
    let uuid = "GPU-5a1e0001-0000-4000-8000-000000000003";
    assert_eq!(rows(&t.ok(&["log", "--gpu", uuid])), expected);
}

#[test]
fn log_json_is_the_lines_as_written_oldest_file_first() {
    let t = Trail::new();
    let written = write_history(&t);
    let out = t.gpupin(&["log", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let events: Vec<String> = written
        .into_iter()
        .filter(|l| !l.contains("torn"))
        .collect();
    assert_eq!(stdout(&out), events.join("\n") + "\n");
    assert_eq!(
        stderr(&out),
        "gpupin: 1 unreadable line skipped in the audit log\n"
    );
    // 2h40m: ten minutes to spare either side of the events 2h30m and 3h ago.
    let since = t.ok(&["log", "--json", "--since", "2h40m"]);
    let holders: Vec<String> = since
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["holder"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(holders, ["j2", "inner", "res", "j1"]);
}

#[test]
fn usage_by_user_and_by_gpu_in_exact_gpu_hours() {
    let t = Trail::new();
    write_history(&t);
    let by_user: Value = serde_json::from_str(&t.ok(&["usage", "--by", "user", "--json"])).unwrap();
    // The nested job is alice's hold's time already: not counted twice.
    assert_eq!(
        by_user["rows"],
        json!([
            {"key": "alice", "gpu_hours": 6.0, "holders": 1},
            {"key": "docker", "gpu_hours": 4.0, "holders": 1},
            {"key": "bob", "gpu_hours": 1.5, "holders": 1},
        ])
    );
    assert_eq!(by_user["total"], json!({"gpu_hours": 11.5, "holders": 3}));
    assert_eq!(by_user["by"], "user");
    let by_gpu: Value = serde_json::from_str(&t.ok(&["usage", "--by", "gpu", "--json"])).unwrap();
    assert_eq!(
        by_gpu["rows"],
        json!([
            {"key": "2", "gpu_hours": 3.0, "holders": 1},
            {"key": "3", "gpu_hours": 3.0, "holders": 1},
            {"key": "0", "gpu_hours": 2.0, "holders": 1},
            {"key": "1", "gpu_hours": 2.0, "holders": 1},
            {"key": "4", "gpu_hours": 1.5, "holders": 1},
        ])
    );
    // Since 3h30m ago: the container's 2h end 3h ago (30m on 2 GPUs count), alice's
    // 1h30m of 3h, bob's all.
    let since = t.time(7 * HOUR / 2);
    let clipped: Value =
        serde_json::from_str(&t.ok(&["usage", "--since", &since, "--json"])).unwrap();
    assert_eq!(clipped["since"], since);
    assert_eq!(
        clipped["rows"],
        json!([
            {"key": "alice", "gpu_hours": 3.0, "holders": 1},
            {"key": "bob", "gpu_hours": 1.5, "holders": 1},
            {"key": "docker", "gpu_hours": 1.0, "holders": 1},
        ])
    );
}

#[test]
fn usage_table_has_two_decimals_and_a_total() {
    let t = Trail::new();
    write_history(&t);
    let table = t.ok(&["usage", "--by", "holder"]);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[..5],
        [
            "HOLDER  GPU-HOURS  HOLDERS",
            "res          6.00        1",
            // The container by its name, as status and log show it.
            "train        4.00        1",
            "j1           1.50        1",
            "total       11.50        3",
        ]
    );
    assert!(lines[5].starts_with("from "), "{table}");
}

#[test]
fn a_missing_log_is_no_events_and_a_symlinked_one_is_refused() {
    let t = Trail::new();
    let empty = t.gpupin(&["log"]);
    assert!(empty.status.success(), "{}", stderr(&empty));
    assert_eq!(stdout(&empty), "TIME  EVENT  HOLDER  USER  GPUS  DETAIL\n");
    assert_eq!(stderr(&empty), "");
    let target = t.dir.path().join("elsewhere.log");
    std::fs::write(&target, "").unwrap();
    std::os::unix::fs::symlink(&target, &t.log).unwrap();
    for args in [&["log"][..], &["usage"]] {
        let out = t.gpupin(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains(&format!("refusing audit log {}", t.log.display())),
            "{err}"
        );
    }
}

#[test]
fn a_bad_value_is_one_line_naming_it_and_exit_2() {
    let t = Trail::new();
    for (args, message) in [
        (
            &["log", "--since", "yesterday"][..],
            r#"invalid --since "yesterday": expected a duration such as 2h or 7d, or an RFC 3339 time"#,
        ),
        (
            &["usage", "--since", "2024-05-01"],
            r#"invalid --since "2024-05-01": expected a duration"#,
        ),
        (
            &["log", "--gpu", "first"],
            r#"invalid --gpu "first": expected a GPU index"#,
        ),
        (
            &["usage", "--by", "team"],
            r#"invalid --by "team": expected user, holder or gpu"#,
        ),
    ] {
        let out = t.gpupin(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with(&format!("gpupin: {message}")), "{err}");
    }
}

/// The finding of issue 19: hold a parent, run a 2-GPU job within it, release the parent
/// at once. The job's 20 s were billed as the parent's 2 s; every GPU-second is billed
/// once now, the part after the parent's release to the job.
#[test]
fn usage_bills_a_job_whose_parent_was_released_at_once() {
    let t = Trail::new();
    let alice = json!({"user": "alice", "uid": 1000});
    let ev = |ago: u64, event: &str, holder: &str, extra: Value| {
        let mut v =
            json!({"time": t.time(ago), "event": event, "holder": holder, "gpus": gpus(&[5, 6])});
        let fields = v.as_object_mut().unwrap();
        fields.extend(alice.as_object().unwrap().clone());
        fields.extend(extra.as_object().unwrap().clone());
        v.to_string()
    };
    let lines = [
        ev(100, "hold", "res", json!({"kind": "hold"})),
        ev(
            99,
            "allocate",
            "job",
            json!({"kind": "exec", "within": "res"}),
        ),
        ev(98, "release", "res", json!({"kind": "hold", "held_s": 2})),
        ev(
            79,
            "release",
            "job",
            json!({"kind": "exec", "within": "res", "held_s": 20}),
        ),
    ];
    std::fs::write(&t.log, lines.join("\n") + "\n").unwrap();
    let by_holder: Value =
        serde_json::from_str(&t.ok(&["usage", "--by", "holder", "--json"])).unwrap();
    let hours = |seconds: u64| seconds as f64 / 3600.0;
    assert_eq!(
        by_holder["rows"],
        json!([
            {"key": "job", "gpu_hours": hours(2 * 19), "holders": 1},
            {"key": "res", "gpu_hours": hours(2 * 2), "holders": 1},
        ])
    );
    // Two GPUs for 21 s, each second once.
    assert_eq!(
        by_holder["total"],
        json!({"gpu_hours": hours(2 * 21), "holders": 2})
    );
}

/// The finding of issue 19: 700 refusals quoting 1,000 unknown names of 64 characters
/// each (a ~65 KB line apiece) pushed another user's hold out of every rotated file.
/// Refusals are bounded, summarised past a budget per requester and kept in a log of
/// their own: the hold is still in `gpupin log` after the flood.
#[test]
fn a_flood_of_refusals_leaves_an_honest_hold_in_the_log() {
    if !need_root("a_flood_of_refusals_leaves_an_honest_hold_in_the_log") {
        return;
    }
    let t = Trail::new();
    // Small files, so that the old behaviour lost the hold within a few refusals.
    t.configure("audit_max_size = \"4KiB\"\naudit_keep = 1\n");
    t.ok(&[
        "hold",
        "honest",
        "--devices",
        "2",
        "--user",
        "nobody",
        "--until-release",
    ]);
    let names: Vec<String> = (0..1000).map(|i| format!("GPU-{i:060}")).collect();
    let devices = names.join(",");
    for i in 0..700 {
        let id = format!("flood-{i}");
        let out = t.gpupin(&["hold", &id, "--devices", &devices, "--until-release"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        if i == 0 {
            let err = stderr(&out);
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                err.contains("names 1000 GPUs, more than the 8 GPUs of this machine"),
                "{err}"
            );
        }
    }
    let nobody = t.ok(&["log", "--user", "nobody"]);
    assert_eq!(
        rows(&nobody),
        pairs(&[("hold honest nobody 2", "")]),
        "{nobody}"
    );
    // The flood: at most the budget a minute written in full (the 700 may span a
    // minute's turn), each line bounded.
    let json = t.ok(&["log", "--json", "--user", "root"]);
    let refusals: Vec<&str> = json.lines().filter(|l| l.contains("\"refuse\"")).collect();
    assert!(
        !refusals.is_empty()
            && refusals.len() <= 2 * gpupin::parts::REFUSALS_PER_MINUTE as usize + 1,
        "{} refusal lines",
        refusals.len()
    );
    for line in refusals {
        assert!(line.len() <= 8192, "{} bytes: {line:.200}", line.len());
    }
}

/// A tmpfs of 64 KiB, mounted for the test and filled up: the real failure, not a path
/// that only looks like one. Unmounted when dropped.
struct FullDisk {
    dir: PathBuf,
}

impl FullDisk {
    fn mount(at: PathBuf) -> FullDisk {
        std::fs::create_dir(&at).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs on {}", at.display());
        let disk = FullDisk { dir: at };
        let mut fill = std::fs::File::create(disk.dir.join("fill")).unwrap();
        let page = [0u8; 4096];
        while std::io::Write::write_all(&mut fill, &page).is_ok() {}
        disk
    }
}

impl Drop for FullDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// On a full disk an allocation succeeded with no audit line at all. Now
/// `audit_failure = "refuse"` undoes it with one line naming the log and the key;
/// `"warn"`, the default since any user who fills the disk would otherwise stop every
/// allocation (issue 31, finding 6), lets it go on with the line in gpupin's own log;
/// both count the failed writes in `gpupin metrics`.
#[test]
fn a_full_audit_disk_refuses_the_allocation_or_warns_as_configured() {
    if !need_root("a_full_audit_disk_refuses_the_allocation_or_warns_as_configured") {
        return;
    }
    let t = Trail::new();
    let disk = FullDisk::mount(t.dir.path().join("full"));
    let log = disk.dir.join("audit.log");
    let text = format!(
        "state_dir = {:?}\naudit_log = {log:?}\ninventory = \"sim:nvswitch8\"\n",
        t.dir.path().join("state")
    );
    std::fs::write(&t.config, format!("audit_failure = \"refuse\"\n{text}")).unwrap();

    let out = t.gpupin(&["hold", "h1", "--devices", "1", "--until-release"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    // One message; beside it, the refusal's own line, which the full log could not take,
    // in gpupin's stderr (the undone allocation's is no part of the trail).
    let said: Vec<&str> = err.lines().filter(|l| l.starts_with("gpupin:")).collect();
    assert_eq!(said.len(), 1, "{err}");
    let fallback: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("audit line not written"))
        .collect();
    assert_eq!(fallback.len(), 1, "{err}");
    assert!(fallback[0].contains("\"event\":\"refuse\""), "{err}");
    let err = said[0];
    assert!(
        err.contains(&format!("could not write the audit log {}", log.display())),
        "{err}"
    );
    assert!(err.contains("audit_failure"), "{err}");
    let status = t.ok(&["status"]);
    assert!(
        !status.contains("h1"),
        "nothing held after the refusal: {status}"
    );

    std::fs::write(&t.config, &text).unwrap();
    let out = t.gpupin(&["hold", "h1", "--devices", "1", "--until-release"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The line that did not fit is in gpupin's own log (stderr here), whole.
    assert!(
        stderr(&out).contains("audit line not written")
            && stderr(&out).contains("\"holder\":\"h1\""),
        "{}",
        stderr(&out)
    );
    assert!(t.ok(&["status"]).contains("h1"));
    let metrics = t.ok(&["metrics"]);
    // The allocation refused, its refusal line, the allocation let through.
    assert!(
        metrics.contains("\ngpupin_audit_write_failures_total 3\n"),
        "{metrics}"
    );
}

/// `gpupin hold --count N --reason TEXT` and `--for DURATION`, as an admin takes GPUs out
/// of service: the policy chooses the GPUs, status shows why and how long is left, the
/// log keeps the reason, and a hold whose time is up is released by gc (a `reap` line).
#[test]
fn holds_by_count_with_a_reason_and_for_a_while() {
    if !gpupin_sandbox::harness::need_root("holds_by_count_with_a_reason_and_for_a_while") {
        return;
    }
    let t = Trail::new();
    let said = t.ok(&[
        "hold",
        "maint",
        "--count",
        "2",
        "--reason",
        "firmware update",
        "--until-release",
    ]);
    assert!(
        said.starts_with("maint holds GPUs ") && said.trim_end().ends_with("until released"),
        "{said}"
    );
    let said = t.ok(&["hold", "brief", "--devices", "7", "--for", "1s"]);
    assert_eq!(
        said.trim_end(),
        "brief holds GPU 7 for 1s, or until released"
    );
    let status: Value = serde_json::from_str(&t.ok(&["status", "--json"])).unwrap();
    let holders = status["holders"].as_array().unwrap();
    let maint = holders.iter().find(|h| h["id"] == "maint").unwrap();
    assert_eq!(maint["gpus"].as_array().unwrap().len(), 2);
    assert_eq!(maint["reason"], "firmware update");
    let table = t.ok(&["status", "--long"]);
    assert!(table.contains("maint (root, firmware update)"), "{table}");
    // The filters of the one-line-per-GPU view: a user's GPUs, some GPUs, the free ones.
    let indices = |args: &[&str]| -> Vec<u64> {
        let mut all = vec!["status", "--json"];
        all.extend_from_slice(args);
        let status: Value = serde_json::from_str(&t.ok(&all)).unwrap();
        status["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g["index"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(indices(&["--user", "root"]).len(), 3);
    assert_eq!(indices(&["--gpu", "7,1"]), [1, 7]);
    assert_eq!(indices(&["--free"]).len(), 5);
    let compact = t.ok(&["status", "--gpu", "7"]);
    let row = compact.lines().nth(1).unwrap();
    assert!(
        row.starts_with("7 ") && row.contains(" brief ") && row.contains(" root "),
        "{compact}"
    );
    let log = t.ok(&["log", "--holder", "maint"]);
    assert!(log.contains("firmware update"), "{log}");
    // Once its time is up, gc releases the hold for a while; the other stays.
    std::thread::sleep(Duration::from_millis(2100));
    let gc = t.ok(&["gc"]);
    assert!(gc.contains("released brief"), "{gc}");
    let status: Value = serde_json::from_str(&t.ok(&["status", "--json"])).unwrap();
    let ids: Vec<&str> = status["holders"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["maint"]);
    // Bad input: one line each, nothing held.
    for (args, wanted) in [
        (
            &[
                "hold",
                "x",
                "--count",
                "1",
                "--reason",
                " ",
                "--until-release",
            ][..],
            "gpupin: invalid --reason: it is empty; say why the GPUs are held",
        ),
        (
            &["hold", "x", "--count", "0", "--until-release"],
            "gpupin: invalid --count \"0\": expected a positive integer, such as 2 (see gpupin hold --help)",
        ),
    ] {
        let out = t.gpupin(args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(stderr(&out).trim_end(), wanted, "{args:?}");
    }
    let out = t.gpupin(&[
        "hold",
        "x",
        "--count",
        "1",
        "--devices",
        "2",
        "--until-release",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot be used with"),
        "{}",
        stderr(&out)
    );
}
