//! `gpupin exec`, `hold` and `serve` end to end, as root with real processes: throwaway
//! users who run jobs through a real `gpupin serve`, real device cgroups (v1 and a
//! cgroup2 BPF program) around fake GPU nodes, runc containers in the same queue and
//! nesting, limits, the socket systemd would hand over, and the audit trail.

mod exec_support;

use exec_support::{
    Daemon, GPUPIN, Group, Job, Sleeper, User, alive, audit, events_of, gpupin, holder_ids,
    job_script, ok, open_up, queued, record, refusal, refused, requirements, run, scratch, until,
    until_clean,
};
use gpupin_sandbox::harness::{self, Sandbox, status};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn a_users_job_sees_its_gpus_and_the_ledger_names_the_user_and_the_job() {
    let test = "a_users_job_sees_its_gpus";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("env");
    let _daemon = Daemon::start(&g);
    let mut job = Job::start(&g, Some(&alice), "env", &["--count", "2"]);
    let report = job.ready();
    let holder = job.holder();

    assert_eq!(report.var("GPUPIN_HOLDER"), holder);
    assert_eq!(report.var("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    let indices = report.cuda_indices();
    assert_eq!(indices.len(), 2, "{:?}", report.env);
    assert!(indices.is_sorted(), "indices in bus order: {indices:?}");
    let own_cgroup = format!("/gpupin-{holder}");
    assert!(
        report.cgroups.iter().any(|l| l.ends_with(&own_cgroup)),
        "the job sits in a cgroup of its own: {:?}",
        report.cgroups
    );

    let st = g.status();
    let h = status::holder(&st, &holder).expect("the job's holder is in the ledger");
    assert_eq!(
        h["pid"], report.pid,
        "the job's own pid holds the GPUs: {h}"
    );
    assert_eq!(h["state"], "running");
    let uuids: Vec<String> = indices
        .iter()
        .map(|&i| status::uuid_of(&st, i.into()))
        .collect();
    assert_eq!(report.var("NVIDIA_VISIBLE_DEVICES"), uuids.join(","));
    let mut held = status::holdings(&st)[&holder].clone();
    held.sort();
    let mut seen = uuids.clone();
    seen.sort();
    assert_eq!(held, seen, "CUDA_VISIBLE_DEVICES names the GPUs held");

    let owner = &record(&g, &holder)["owner"];
    assert_eq!(owner["user"], alice.name.as_str());
    assert_eq!(owner["uid"], alice.uid);
    // `status --json` names owners once the holders work is merged; where it does, it
    // must name the same one.
    if let Some(shown) = h.get("owner") {
        assert_eq!(shown["user"], alice.name.as_str(), "{h}");
        assert_eq!(shown["uid"], alice.uid, "{h}");
    }

    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{exit}: {stderr}");
    until_clean(&g);
}

#[test]
fn gpupin_exec_ends_with_the_jobs_status_and_passes_signals_on() {
    let test = "gpupin_exec_ends_with_the_jobs_status";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let bob = User::create("sig");
    let _daemon = Daemon::start(&g);
    for (who, user) in [("user", Some(&bob)), ("root", None)] {
        let out = run(
            &g,
            user,
            &["exec", "--count", "1", "--", "sh", "-c", "exit 7"],
        );
        assert_eq!(
            out.status.code(),
            Some(7),
            "{who}: {}",
            harness::stderr(&out)
        );

        let out = run(
            &g,
            user,
            &["exec", "--count", "1", "--", "sh", "-c", "kill -KILL $$"],
        );
        assert_eq!(
            out.status.code(),
            Some(137),
            "{who}: a job killed by KILL: {}",
            harness::stderr(&out)
        );

        // The trap is set before the job says it runs; TERM goes to gpupin, not the job.
        let name = format!("trap-{who}");
        let script = format!(
            "trap 'exit 42' TERM; {}",
            job_script(&scratch(&g), &name, 1)
        );
        let mut job = Job::start_with(&g, user, &name, &["--count", "1"], &[], &script);
        let report = job.ready();
        assert_ne!(report.pid, job.gpupin_pid());
        job.signal(libc::SIGTERM);
        let (exit, stderr) = job.wait();
        assert_eq!(exit.code(), Some(42), "{who}: {stderr}");
    }
    until_clean(&g);
}

#[test]
fn a_job_outlives_its_killed_gpupin_and_keeps_its_gpus_until_it_ends() {
    let test = "a_job_outlives_its_killed_gpupin";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let carol = User::create("orph");
    let _daemon = Daemon::start(&g);

    // Two jobs of root's and one of a user's (through the daemon), all running at once.
    let mut by_alloc = Job::start(&g, None, "root-alloc", &["--count", "2"]);
    let mut by_gc = Job::start(&g, None, "root-gc", &["--count", "1"]);
    let mut users = Job::start(&g, Some(&carol), "user", &["--count", "1"]);
    let mut orphans = Vec::new();
    let mut reports = Vec::new();
    for job in [&mut by_alloc, &mut by_gc, &mut users] {
        let report = job.ready();
        let holder = job.holder();
        job.signal(libc::SIGKILL);
        let (exit, _) = job.wait();
        assert_eq!(exit.signal(), Some(libc::SIGKILL));
        assert!(alive(report.pid), "{}: the job goes on", job.name);
        let h = g.holder(&holder).expect("the job still holds its GPUs");
        assert_eq!(h["pid"], report.pid, "under the job's pid: {h}");
        assert_eq!(h["state"], "running", "{h}");
        orphans.push((holder, report.pid));
        reports.push(report);
    }
    let [(alloc_id, alloc_pid), (gc_id, gc_pid), (user_id, user_pid)] = &orphans[..] else {
        unreachable!()
    };

    // The user's job: the daemon watches its pid and releases the moment it ends.
    users.go();
    until("the user's job ends", || (!alive(*user_pid)).then_some(()));
    until("the daemon releases the user's job", || {
        g.holder(user_id).is_none().then_some(())
    });
    let events: Vec<Value> = events_of(&g, user_id);
    assert_eq!(events.last().unwrap()["event"], "release", "{events:?}");

    // Root's jobs had no daemon watching: the ledger sees them gone, and the next
    // allocation or `gpupin gc` reaps them.
    for (job, pid) in [(&by_alloc, alloc_pid), (&by_gc, gc_pid)] {
        job.go();
        until("root's job ends", || (!alive(*pid)).then_some(()));
    }
    for id in [alloc_id, gc_id] {
        assert_eq!(g.holder(id).expect("kept until reaped")["state"], "gone");
    }
    let all_but_one = ["exec", "--count", "7", "--", "true"];
    let out = run(&g, None, &all_but_one);
    assert!(
        out.status.success(),
        "the gone job's GPUs are free again: {}",
        harness::stderr(&out)
    );
    assert!(g.holder(alloc_id).is_none(), "reaped by the allocation");
    ok(&g, None, &["gc"]);
    assert!(g.holder(gc_id).is_none(), "reaped by gpupin gc");
    for id in [alloc_id, gc_id] {
        let events = events_of(&g, id);
        assert_eq!(events.last().unwrap()["event"], "reap", "{events:?}");
    }
    // A root job's cgroups were its gpupin exec's to remove, and that was killed: the
    // reap, which finds them in the record, removes them (issue 19, finding 12).
    for (report, id) in reports.iter().zip([alloc_id, gc_id]) {
        let dirs = exec_support::own_cgroup_dirs(report, id);
        assert!(!dirs.is_empty(), "{:?}", report.cgroups);
        for dir in dirs {
            assert!(!dir.exists(), "{id}: {} was left", dir.display());
        }
    }
    until_clean(&g);
}

/// `cat` of each of the 8 fake GPU nodes under `dev`, then the process's cgroups, as
/// lines `NODE <minor> <cat's message>` and `CGROUP <line>`.
fn probe_script(dev: &Path) -> String {
    let d = dev.display();
    format!(
        "echo \"HOLDER $GPUPIN_HOLDER\"; \
         for i in 0 1 2 3 4 5 6 7; do echo \"NODE $i $(cat {d}/nvidia$i 2>&1)\"; done; \
         sed 's/^/CGROUP /' /proc/self/cgroup"
    )
}

/// What opening each node gave, by minor: "ENXIO" (no driver behind the node: the
/// cgroup let it through), "EPERM" (the cgroup denied it), or cat's own words.
fn node_results(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("NODE "))
        .map(|l| {
            if l.ends_with("No such device or address") {
                "ENXIO".to_string()
            } else if l.ends_with("Operation not permitted") {
                "EPERM".to_string()
            } else {
                l.to_string()
            }
        })
        .collect()
}

/// Expected `node_results` for a job that holds `own`: its node reaches the (missing)
/// driver, every other one is denied.
fn only_own(own: usize) -> Vec<String> {
    (0..8)
        .map(|m| if m == own { "ENXIO" } else { "EPERM" }.to_string())
        .collect()
}

fn confinement(test: &str, mode: &str) {
    if !requirements(test) {
        return;
    }
    let (controllers, what) = match mode {
        "v1" => ("devices", "a cgroup v1 devices hierarchy"),
        _ => ("", "a cgroup2 hierarchy"),
    };
    let mounted = exec_support::hierarchy_mount(controllers)
        .ok_or_else(|| format!("this machine has no {what} mounted"));
    if harness::required(test, mounted).is_none() {
        return;
    }
    let g = gpupin(&format!("confine = {mode:?}"));
    let dev = scratch(&g).join("dev");
    std::fs::create_dir(&dev).unwrap();
    for minor in 0..8 {
        let node = dev.join(format!("nvidia{minor}"));
        let out = Command::new("mknod")
            .arg("-m")
            .arg("666")
            .arg(&node)
            .args(["c", &harness::GPU_MAJOR.to_string(), &minor.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "mknod: {}", harness::stderr(&out));
    }
    let dave = User::create(&format!("cf{mode}"));
    let _daemon = Daemon::start(&g);
    let probe = probe_script(&dev);

    // Without gpupin every node opens as far as the (missing) driver: the denials below
    // are the cgroup's, not the file system's.
    let mut control = Command::new("sh");
    control.args(["-c", &probe]).env("LC_ALL", "C");
    let out = dave.owns(&mut control).output().unwrap();
    assert_eq!(
        node_results(&harness::stdout(&out)),
        vec!["ENXIO"; 8],
        "{}",
        harness::stdout(&out)
    );

    for (who, user, own) in [("user", Some(&dave), 3), ("root", None, 4)] {
        let own_arg = own.to_string();
        let mut cmd = exec_support::cmd(
            &g,
            user,
            &["exec", "--devices", &own_arg, "--", "sh", "-c", &probe],
        );
        let out = cmd.env("LC_ALL", "C").output().unwrap();
        let stdout = harness::stdout(&out);
        assert!(out.status.success(), "{who}: {}", harness::stderr(&out));
        assert_eq!(node_results(&stdout), only_own(own), "{who}: {stdout}");
        let holder = stdout
            .lines()
            .find_map(|l| l.strip_prefix("HOLDER "))
            .unwrap();
        let own_cgroup = format!("/gpupin-{holder}");
        let confined = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("CGROUP "))
            .any(|l| {
                let hierarchy = match mode {
                    "v1" => l.contains(":devices:"),
                    _ => l.starts_with("0::"),
                };
                hierarchy && l.ends_with(&own_cgroup)
            });
        assert!(confined, "{who}: the job sits in {own_cgroup}: {stdout}");
    }
    until_clean(&g);
}

#[test]
fn a_job_opens_only_its_own_gpu_under_cgroup_v1() {
    confinement("a_job_opens_only_its_own_gpu_under_cgroup_v1", "v1");
}

#[test]
fn a_job_opens_only_its_own_gpu_under_a_cgroup2_bpf_program() {
    confinement(
        "a_job_opens_only_its_own_gpu_under_a_cgroup2_bpf_program",
        "v2",
    );
}

#[test]
fn a_user_at_their_limit_is_refused_with_one_line_and_nothing_more_is_held() {
    let test = "a_user_at_their_limit_is_refused";
    if !requirements(test) {
        return;
    }
    let g = gpupin("[limits]\nmax_gpus_per_user = 1");
    let erin = User::create("lim");
    let _daemon = Daemon::start(&g);
    let mut first = Job::start(&g, Some(&erin), "first", &["--count", "1"]);
    first.ready();
    let before = g.ledger_snapshot();

    let line = refused(
        &g,
        Some(&erin),
        &["exec", "--count", "1", "--", "sh", "-c", "echo ran"],
    );
    let n = &erin.name;
    assert_eq!(
        line,
        format!(
            "gpupin: {n} holds 1 GPU and {n} asks for 1 more; their limit is 1 (limits.max_gpus_per_user)"
        )
    );
    assert_eq!(g.ledger_snapshot(), before, "nothing more is held");
    let last = audit(&g)
        .into_iter()
        .rev()
        .find(|e| e["event"] == "refuse")
        .unwrap();
    assert_eq!(last["event"], "refuse", "{last}");
    assert_eq!(last["user"], n.as_str(), "{last}");

    // Issue 32, item 8: pick answers what her exec would do, limit included.
    let picked = refused(&g, Some(&erin), &["pick", "--count", "1"]);
    assert_eq!(
        picked,
        format!(
            "gpupin: {n} holds 1 GPU and {n} asks for 1 more; their limit is 1 (limits.max_gpus_per_user)"
        )
    );
    let root_picks = ok(&g, None, &["pick", "--count", "1"]);
    assert!(root_picks.contains("would pick GPU"), "{root_picks}");

    // Limits are for users: root is not held to them.
    let out = run(&g, None, &["exec", "--count", "2", "--", "true"]);
    assert!(out.status.success(), "{}", harness::stderr(&out));

    let (exit, stderr) = first.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
}

#[test]
fn a_groups_members_only_get_the_groups_gpus() {
    let test = "a_groups_members_only_get_the_groups_gpus";
    if !requirements(test) {
        return;
    }
    let frank = User::create("grp");
    let group = Group::create("grpg", &[&frank]);
    let g = gpupin(&format!("[limits.groups.{:?}]\ngpus = [6, 7]", group.name));
    let _daemon = Daemon::start(&g);
    // Pack would give GPU 0 first; the group's list leaves only 6 and 7, and pick says
    // what frank's exec gets (issue 32, item 8), root's what root's gets.
    let picked = ok(&g, Some(&frank), &["pick", "--count", "1"]);
    assert!(picked.contains(" would pick GPU 6\n"), "{picked}");
    let root_picks = ok(&g, None, &["pick", "--count", "1"]);
    assert!(!root_picks.contains("pick GPU 6\n"), "{root_picks}");
    let mut a = Job::start(&g, Some(&frank), "a", &["--count", "1"]);
    let mut b = Job::start(&g, Some(&frank), "b", &["--count", "1"]);
    let mut got = [a.ready().cuda_indices(), b.ready().cuda_indices()].concat();
    got.sort();
    assert_eq!(got, [6, 7]);

    for devices in [&["--count", "1"][..], &["--devices", "0"][..]] {
        let mut args = vec!["exec"];
        args.extend_from_slice(devices);
        args.extend_from_slice(&["--", "true"]);
        let line = refused(&g, Some(&frank), &args);
        let why = format!("the GPUs {}'s groups may use", frank.name);
        assert!(line.contains(&why), "{devices:?}: {line}");
    }
    assert_eq!(holder_ids(&g.status()).len(), 2);
    for job in [&mut a, &mut b] {
        let (exit, stderr) = job.finish();
        assert!(exit.success(), "{stderr}");
    }
    until_clean(&g);
}

/// A sandbox for runc containers whose gpupin config users can reach too.
fn sandbox(test: &str) -> Option<Sandbox> {
    if !requirements(test) {
        return None;
    }
    let sb = Sandbox::new(GPUPIN, test)?;
    open_up(&sb.gpupin);
    Some(sb)
}

#[test]
fn waiting_containers_and_jobs_get_gpus_in_arrival_order() {
    let test = "waiting_containers_and_jobs_in_arrival_order";
    let Some(sb) = sandbox(test) else {
        return;
    };
    let g = &sb.gpupin;
    let gina = User::create("fifo");
    let _daemon = Daemon::start(g);
    // Every GPU held, in three holds so that they can be given back one at a time.
    for (id, devices) in [("rest", "0,1,2,3,4,5"), ("g6", "6"), ("g7", "7")] {
        ok(
            g,
            None,
            &["hold", id, "--devices", devices, "--until-release"],
        );
    }

    let id = sb.id("waiter");
    let spec = sb
        .spec()
        .annotation("gpupin.count", "1")
        .annotation("gpupin.wait", "60s");
    std::thread::scope(|s| {
        let container = s.spawn(|| sb.start(&id, &spec));
        until("the container waits", || (queued(g) == 1).then_some(()));
        let wait = ["--count", "1", "--wait", "60s"];
        let mut job = Job::start(g, Some(&gina), "queued", &wait);
        until("the job waits behind it", || (queued(g) == 2).then_some(()));
        assert!(!container.is_finished() && !job.has_started());

        ok(g, None, &["release", "g6"]);
        let c = container
            .join()
            .unwrap()
            .expect("the container, first in line, starts");
        assert_eq!(g.held_minors(c.id()), [6]);
        assert_eq!(queued(g), 1, "the job still waits");
        assert!(!job.has_started() && !job.has_ended());

        ok(g, None, &["release", "g7"]);
        let report = job.ready();
        assert_eq!(report.cuda_indices(), [7]);
        let allocated: Vec<String> = audit(g)
            .into_iter()
            .filter(|e| e["event"] == "allocate")
            .map(|e| e["holder"].as_str().unwrap().to_string())
            .filter(|h| h == c.id() || *h == job.holder())
            .collect();
        assert_eq!(allocated, [c.id().to_string(), job.holder()]);
        let (exit, stderr) = job.finish();
        assert!(exit.success(), "{stderr}");
        drop(c);
    });
    ok(g, None, &["release", "rest"]);
    until_clean(g);
}

/// `queue = "fair"` (the default) with real processes: alice queues three jobs, then bob
/// one, each through `gpupin serve`. `gpupin queue` numbers bob's second, and as GPUs are
/// given back one at a time bob's job is the second to get one, ahead of alice's two
/// that came before it.
#[test]
fn fair_waiting_serves_bobs_one_job_before_alices_second() {
    let test = "fair_waiting_serves_bob_second";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("fair");
    let bob = User::create("fairb");
    let _daemon = Daemon::start(&g);
    for (id, devices) in [
        ("rest", "0,1,2,3"),
        ("g4", "4"),
        ("g5", "5"),
        ("g6", "6"),
        ("g7", "7"),
    ] {
        ok(
            &g,
            None,
            &["hold", id, "--devices", devices, "--until-release"],
        );
    }
    let wait = ["--count", "1", "--wait", "120s"];
    let mut jobs = Vec::new();
    for (n, (user, name)) in [(&alice, "a1"), (&alice, "a2"), (&alice, "a3"), (&bob, "b1")]
        .into_iter()
        .enumerate()
    {
        jobs.push(Job::start(&g, Some(user), name, &wait));
        until(&format!("{name} waits"), || {
            (queued(&g) == n + 1).then_some(())
        });
    }
    let holder = |i: usize| jobs[i].holder();
    let listed: Value = serde_json::from_str(&ok(&g, None, &["queue", "--json"])).unwrap();
    let shown: Vec<(u64, String)> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["position"].as_u64().unwrap(),
                w["holder"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            (1, holder(0)),
            (2, holder(3)),
            (3, holder(1)),
            (4, holder(2))
        ],
        "{listed}"
    );

    // One GPU given back at a time: the next in that order, and only it, gets it.
    let mut started: Vec<usize> = Vec::new();
    for hold in ["g4", "g5", "g6", "g7"] {
        ok(&g, None, &["release", hold]);
        let next = until(&format!("a job starts on {hold}'s GPU"), || {
            (0..jobs.len()).find(|&i| !started.contains(&i) && jobs[i].has_started())
        });
        started.push(next);
    }
    let names: Vec<&str> = started.iter().map(|&i| jobs[i].name.as_str()).collect();
    assert_eq!(names, ["a1", "b1", "a2", "a3"]);
    // Each once in the trail (alice's and bob's lines are in logs of their own, merged
    // by time to the second: the order above is the one to check).
    let mut allocated: Vec<String> = audit(&g)
        .into_iter()
        .filter(|e| e["event"] == "allocate")
        .map(|e| e["holder"].as_str().unwrap().to_string())
        .collect();
    allocated.sort();
    let mut expected = [holder(0), holder(3), holder(1), holder(2)];
    expected.sort();
    assert_eq!(allocated, expected);
    for job in &mut jobs {
        let (exit, stderr) = job.finish();
        assert!(exit.success(), "{stderr}");
    }
    ok(&g, None, &["release", "rest"]);
    until_clean(&g);
}

/// Writes the live file of `g` (`live_file = "live.json"`): GPU i at `utilization[i]`%.
fn write_live(g: &gpupin_sandbox::harness::Gpupin, utilization: [u32; 8]) {
    let gpus: Vec<Value> = utilization
        .iter()
        .enumerate()
        .map(|(i, u)| serde_json::json!({"index": i, "utilization": u, "memory_free": "40GiB"}))
        .collect();
    let text = serde_json::json!({ "gpus": gpus }).to_string();
    // Renamed into place: the daemon never reads half a file.
    let tmp = g.dir.path().join("live.json.tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, g.dir.path().join("live.json")).unwrap();
}

/// Idle holders found by `gpupin serve` from the live figures (the live file drives
/// utilization): a forgotten hold and a user's job that both sit on quiet GPUs are
/// marked idle in status, metrics and the audit log (once each); under `idle_action =
/// "release-holds"` the hold is released and the job keeps running with its GPU; a
/// hold on a busy GPU is neither; and the job's GPU busy again ends its idleness.
#[test]
fn idle_holders_are_found_and_only_idle_holds_are_released() {
    let test = "idle_holders_are_found";
    if !requirements(test) {
        return;
    }
    let g =
        gpupin("live_file = \"live.json\"\nidle_after = \"3s\"\nidle_action = \"release-holds\"\n");
    write_live(&g, [0, 0, 80, 0, 0, 0, 0, 0]);
    let alice = User::create("idle");
    let _daemon = Daemon::start(&g);
    ok(
        &g,
        None,
        &["hold", "forgotten", "--devices", "0", "--until-release"],
    );
    ok(
        &g,
        None,
        &["hold", "working", "--devices", "2", "--until-release"],
    );
    let mut job = Job::start(&g, Some(&alice), "quiet", &["--devices", "1"]);
    job.ready();
    let holder = job.holder();

    until("the forgotten hold is released", || {
        status::holder(&g.status(), "forgotten")
            .is_none()
            .then_some(())
    });
    until("the job is shown idle", || {
        let h = status::holder(&g.status(), &holder)?;
        (!h["idle"].is_null()).then_some(h)
    });
    let st = g.status();
    assert!(
        status::holder(&st, "working").unwrap()["idle"].is_null(),
        "{st}"
    );
    assert!(!job.has_ended(), "a job is never stopped for being idle");
    assert_eq!(status::held_minors(&st, &holder).len(), 1, "{st}");
    // The one-line view: GPU 1's line says idle, even with the holder's name cut.
    let screen = ok(&g, None, &["status"]);
    let line = screen.lines().find(|l| l.starts_with("1 ")).unwrap();
    assert!(
        line.contains("exec-") && line.contains(" (idle "),
        "{screen}"
    );
    assert!(!screen.contains("working (idle"), "{screen}");
    let metrics = ok(&g, None, &["metrics"]);
    let sample = format!(
        "gpupin_holder_idle_seconds{{holder=\"{holder}\",kind=\"exec\",user=\"{}\"}} ",
        alice.name
    );
    assert!(metrics.contains(&sample), "{metrics}");
    assert!(
        !metrics.contains("gpupin_holder_idle_seconds{holder=\"working\""),
        "{metrics}"
    );

    // A few looks later, still one idle line each in the audit log.
    let looks = || std::fs::read_to_string(g.state_dir.join("idle.json")).unwrap();
    let first = looks();
    until("two more looks", || {
        let now = looks();
        (now != first).then_some(now)
    });
    let second = looks();
    until("one more look", || (looks() != second).then_some(()));
    let events = audit(&g);
    let idle: Vec<&str> = events
        .iter()
        .filter(|e| e["event"] == "idle")
        .map(|e| e["holder"].as_str().unwrap())
        .collect();
    let mut idle_sorted = idle.clone();
    idle_sorted.sort();
    let mut expected = vec!["forgotten", holder.as_str()];
    expected.sort();
    assert_eq!(idle_sorted, expected, "{events:?}");
    let released: Vec<&Value> = events.iter().filter(|e| e["event"] == "release").collect();
    assert_eq!(released.len(), 1, "{released:?}");
    assert_eq!(released[0]["holder"], "forgotten");
    assert_eq!(
        released[0]["reason"],
        "idle: GPUs under 5% utilization for 3s (idle_action = \"release-holds\")"
    );

    // Its GPU busy again: no longer idle.
    write_live(&g, [0, 60, 80, 0, 0, 0, 0, 0]);
    until("the job is no longer idle", || {
        status::holder(&g.status(), &holder)?["idle"]
            .is_null()
            .then_some(())
    });
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    ok(&g, None, &["release", "working"]);
    until_clean(&g);
}

#[test]
fn a_hold_shares_its_gpus_with_a_container_and_its_users_job_only() {
    let test = "a_hold_shares_its_gpus";
    let Some(sb) = sandbox(test) else {
        return;
    };
    let g = &sb.gpupin;
    let hank = User::create("nest");
    let ivy = User::create("nesto");
    let _daemon = Daemon::start(g);
    let user = hank.name.as_str();
    let hold = [
        "hold",
        "slurm-42",
        "--devices",
        "5,6",
        "--until-release",
        "--user",
        user,
    ];
    ok(g, None, &hold);

    // The hold's name alone, as an image's ENV or any annotation could write it, takes
    // nothing: the review's first finding (a container entered any holder by name).
    let bare = sb
        .spec()
        .env("GPUPIN_WITHIN", "slurm-42")
        .env("GPUPIN_COUNT", "1");
    let err = match sb.start(&sb.id("bare"), &bare) {
        Ok(c) => panic!("container {} entered the hold by its name alone", c.id()),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("taking GPUs from slurm-42 needs its key"),
        "{err}"
    );

    let id = sb.id("inner");
    let key = ok(g, None, &["key", "slurm-42"]);
    // The hold's owner gets the same key through the daemon; another user gets none.
    assert_eq!(ok(g, Some(&hank), &["key", "slurm-42"]), key);
    let line = refused(g, Some(&ivy), &["key", "slurm-42"]);
    assert!(
        line.ends_with(&format!(
            "holder slurm-42 is {}'s: only its owner or root may have its key",
            hank.name
        )),
        "{line}"
    );
    let spec = sb
        .spec()
        .annotation("gpupin.within", key.trim())
        .annotation("gpupin.count", "1");
    let container = sb.start(&id, &spec).expect("a container within the hold");
    let in_container = g.held_minors(container.id());
    assert!(
        in_container == [5] || in_container == [6],
        "{in_container:?}"
    );

    // GPUPIN_WITHIN, as a Slurm TaskProlog sets it, stands in for --within.
    let within = [("GPUPIN_WITHIN", "slurm-42")];
    let script = job_script(&scratch(g), "inner", 0);
    let mut job = Job::start_with(g, Some(&hank), "inner", &["--count", "1"], &within, &script);
    let report = job.ready();
    let other = if in_container == [5] { 6 } else { 5 };
    assert_eq!(report.cuda_indices(), [other]);
    assert_eq!(record(g, &job.holder())["request"]["within"], "slurm-42");

    let mut third = exec_support::cmd(g, Some(&hank), &["exec", "--count", "1", "--", "true"]);
    let out = third.envs(within).output().unwrap();
    let line = refusal(&out, "a third request within the full hold");
    assert!(line.contains("within slurm-42"), "{line}");

    let line = refused(
        g,
        Some(&ivy),
        &["exec", "--count", "1", "--within", "slurm-42", "--", "true"],
    );
    assert!(
        line.contains(&format!("is {}'s, not {}'s", hank.name, ivy.name)),
        "{line}"
    );
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    drop(container);
    ok(g, None, &["release", "slurm-42"]);
    until_clean(g);
}

/// Env of `raw_client`: the socket, the pid to bind, and where to write the answers.
const RAW_SOCKET: &str = "GPUPIN_E2E_RAW_SOCKET";
const RAW_VICTIM: &str = "GPUPIN_E2E_RAW_VICTIM";
const RAW_OUT: &str = "GPUPIN_E2E_RAW_OUT";

/// The hand-made client of `a_user_cannot_touch_another_users_job`, which runs that very
/// test again as another user with these variables set (the kernel tells the daemon who
/// connects, so the connection must come from a process of that user). It asks for a
/// GPU, then tries to bind it to another user's job, writes both answers and returns
/// true; without the variables it returns false and the test runs as itself.
fn raw_client() -> bool {
    let (Ok(socket), Ok(victim), Ok(out)) = (
        std::env::var(RAW_SOCKET),
        std::env::var(RAW_VICTIM),
        std::env::var(RAW_OUT),
    ) else {
        return false;
    };
    let mut stream = UnixStream::connect(socket).unwrap();
    let mut input = BufReader::new(stream.try_clone().unwrap());
    let mut answers = String::new();
    let exec = r#"{"op":"exec","request":[["gpupin.count","1"]]}"#;
    let bind = format!(r#"{{"op":"bind","pid":{victim}}}"#);
    for request in [exec, &bind] {
        writeln!(stream, "{request}").unwrap();
        input.read_line(&mut answers).unwrap();
    }
    std::fs::write(out, answers).unwrap();
    true
}

/// Sends `bytes` on a new connection to the daemon and reads its one-line answer.
fn send_raw(socket: &Path, bytes: Vec<u8>) -> Value {
    let mut stream = UnixStream::connect(socket).unwrap();
    let writer = stream.try_clone().unwrap();
    // The daemon stops reading an oversized line and answers: write beside it.
    let sending = std::thread::spawn(move || {
        let mut writer = writer;
        let _ = writer.write_all(&bytes);
    });
    let mut line = String::new();
    BufReader::new(&mut stream).read_line(&mut line).unwrap();
    let _ = stream.shutdown(std::net::Shutdown::Both);
    sending.join().unwrap();
    assert!(line.ends_with('\n'), "one whole line: {line:?}");
    serde_json::from_str(&line).unwrap()
}

#[test]
fn a_user_cannot_touch_another_users_job() {
    let test = "a_user_cannot_touch_another_users_job";
    if raw_client() {
        return;
    }
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("isoa");
    let bob = User::create("isob");
    let mut daemon = Daemon::start(&g);
    let mut job = Job::start(&g, Some(&alice), "alices", &["--count", "1"]);
    let alices = job.ready();
    let holder = job.holder();
    let record_file = format!("{holder}.json");
    let before = g.ledger_snapshot()[&record_file].clone();
    let unchanged = |what: &str| {
        assert_eq!(
            g.ledger_snapshot().get(&record_file),
            Some(&before),
            "{what}: alice's record is unchanged"
        );
        assert_eq!(
            holder_ids(&g.status()),
            std::slice::from_ref(&holder),
            "{what}"
        );
    };

    let line = refused(&g, Some(&bob), &["release", &holder]);
    assert_eq!(
        line,
        format!(
            "gpupin: holder {holder} is {}'s, not {}'s: only {} or root may release it",
            alice.name, bob.name, alice.name
        )
    );
    unchanged("release");

    let bobs = Sleeper::start(&bob);
    let bobs_pid = bobs.pid().to_string();
    let alices_pid = alices.pid.to_string();
    let attempts: [(&[&str], &str); 3] = [
        (
            &[
                "hold",
                "h1",
                "--devices",
                "3",
                "--user",
                &alice.name,
                "--pid",
                &bobs_pid,
            ],
            "only root may hold GPUs for another user",
        ),
        (
            &["hold", "h2", "--devices", "3", "--until-release"],
            "only root may hold GPUs until released",
        ),
        (
            &["hold", "h3", "--devices", "3", "--pid", &alices_pid],
            &format!("pid {alices_pid} is not a process of uid {}", bob.uid),
        ),
    ];
    for (args, expected) in attempts {
        let line = refused(&g, Some(&bob), args);
        assert!(line.contains(expected), "{args:?}: {line}");
        unchanged(&format!("{args:?}"));
    }

    // By hand: GPUs for a job of bob's, then alice's job named as that job.
    let answers = scratch(&g).join("raw-answers");
    let mut raw = Command::new(std::env::current_exe().unwrap());
    raw.args(["--exact", test, "--test-threads=1", "-q"])
        .env(RAW_SOCKET, g.state_dir.join("gpupin.sock"))
        .env(RAW_VICTIM, &alices_pid)
        .env(RAW_OUT, &answers)
        .stdin(Stdio::null());
    let out = raw.uid(bob.uid).gid(bob.gid).output().unwrap();
    assert!(out.status.success(), "{}", harness::stdout(&out));
    assert!(
        harness::stdout(&out).contains("1 passed"),
        "the client ran no test: {}",
        harness::stdout(&out)
    );
    let text = std::fs::read_to_string(&answers).unwrap();
    let replies: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(replies.len(), 2, "{text}");
    assert!(replies[0]["error"].is_null(), "exec is granted: {text}");
    let error = replies[1]["error"].as_str().expect("bind is refused");
    assert!(
        error.contains(&format!("pid {alices_pid} is not a process the caller")),
        "{error}"
    );
    unchanged("a hand-made bind");

    // Garbage and an oversized line: one line of error each, and the daemon goes on.
    let socket = g.state_dir.join("gpupin.sock");
    let mut oversized = vec![b'x'; 65 << 10];
    oversized.push(b'\n');
    for bytes in [b"this is no request\n".to_vec(), oversized] {
        let reply = send_raw(&socket, bytes);
        let error = reply["error"].as_str().expect("an error");
        assert!(
            error.starts_with("unreadable request") && !error.contains('\n'),
            "{error}"
        );
    }
    assert!(daemon.running(), "{}", daemon.log());
    let out = ok(
        &g,
        Some(&bob),
        &["hold", "h4", "--devices", "3", "--pid", &bobs_pid],
    );
    assert!(out.contains("h4 holds GPU 3"), "{out}");
    ok(&g, Some(&bob), &["release", "h4"]);
    unchanged("bob's own hold and release");

    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
}

#[test]
fn a_users_job_runs_through_a_socket_systemd_hands_over() {
    let test = "a_users_job_runs_through_a_socket_systemd_hands_over";
    if !requirements(test) {
        return;
    }
    let tool = "systemd-socket-activate";
    let found = match exec_support::on_path(tool) {
        true => Ok(()),
        false => Err(format!("{tool} not found (Debian package systemd)")),
    };
    if harness::required(test, found).is_none() {
        return;
    }
    let g = gpupin("");
    // Not in the state dir: systemd makes the socket before gpupin makes that.
    let socket = g.dir.path().join("activated.sock");
    let mut config = std::fs::OpenOptions::new()
        .append(true)
        .open(&g.config)
        .unwrap();
    writeln!(config, "socket = {:?}", socket.to_str().unwrap()).unwrap();
    let judy = User::create("sock");
    let mut activate = Command::new(tool);
    activate
        .arg("-l")
        .arg(&socket)
        .arg(&g.bin)
        .arg("--config")
        .arg(&g.config)
        .arg("serve")
        .env_remove("GPUPIN_CONFIG")
        .stdin(Stdio::null());
    let daemon = Daemon::spawn(&mut activate, g.dir.path().join("activate.log"));
    until("systemd-socket-activate listens", || {
        socket.exists().then_some(())
    });
    // What gpupin.socket's SocketMode=0666 does.
    let open = std::fs::Permissions::from_mode(0o666);
    std::fs::set_permissions(&socket, open).unwrap();

    for round in ["first", "second"] {
        let mut job = Job::start(&g, Some(&judy), round, &["--count", "1"]);
        let report = job.ready();
        let h = g.holder(&job.holder()).expect("held");
        assert_eq!(h["pid"], report.pid);
        assert_eq!(h["source"], "serve");
        let (exit, stderr) = job.finish();
        assert!(exit.success(), "{round}: {stderr}\n{}", daemon.log());
        until_clean(&g);
    }
    assert!(
        !g.state_dir.join("gpupin.sock").exists(),
        "gpupin serve made no socket of its own"
    );
    drop(daemon);
}

#[test]
fn the_audit_log_and_usage_account_for_holds_and_jobs() {
    let test = "the_audit_log_and_usage_account";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let kim = User::create("aud");
    let _daemon = Daemon::start(&g);

    let sleeper = Sleeper::start(&kim);
    let pid = sleeper.pid().to_string();
    let out = ok(
        &g,
        Some(&kim),
        &["hold", "pair", "--devices", "2,3", "--pid", &pid],
    );
    assert!(out.contains("pair holds GPUs 2,3"), "{out}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    ok(&g, Some(&kim), &["release", "pair"]);

    let job = [
        "exec",
        "--devices",
        "4",
        "--name",
        "one-second",
        "--",
        "sleep",
        "1",
    ];
    ok(&g, Some(&kim), &job);
    until_clean(&g);
    drop(sleeper);

    let indices = |e: &Value| -> Vec<u64> {
        e["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|gpu| gpu["index"].as_u64().unwrap())
            .collect()
    };
    let pair = events_of(&g, "pair");
    let kinds: Vec<&str> = pair.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["hold", "release"], "{pair:?}");
    for e in &pair {
        assert_eq!(e["user"], kim.name.as_str(), "{e}");
        assert_eq!(e["uid"], kim.uid, "{e}");
        assert_eq!(indices(e), [2, 3], "{e}");
    }
    assert!(pair[1]["held_s"].as_u64().unwrap() >= 2, "{}", pair[1]);

    let one = events_of(&g, "one-second");
    let kinds: Vec<&str> = one.iter().map(|e| e["event"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["allocate", "bind", "release"], "{one:?}");
    for e in &one {
        assert_eq!(e["user"], kim.name.as_str(), "{e}");
        assert_eq!(indices(e), [4], "{e}");
    }
    assert!(one[2]["held_s"].as_u64().unwrap() >= 1, "{}", one[2]);

    // `gpupin log --user` gives back the same lines; `gpupin usage` sums them.
    let logged = ok(&g, None, &["log", "--user", &kim.name, "--json"]);
    assert_eq!(logged.lines().count(), pair.len() + one.len(), "{logged}");
    let usage = ok(&g, None, &["usage", "--by", "holder", "--json"]);
    let usage: Value = serde_json::from_str(&usage).unwrap();
    let hours = |key: &str| {
        let rows = usage["rows"].as_array().unwrap();
        let row = rows.iter().find(|r| r["key"] == key);
        row.unwrap_or_else(|| panic!("no row {key}: {usage}"))["gpu_hours"]
            .as_f64()
            .unwrap()
    };
    let held_s = |e: &Value| e["held_s"].as_f64().unwrap();
    let expected_pair = 2.0 * held_s(&pair[1]) / 3600.0;
    assert!((hours("pair") - expected_pair).abs() < 1e-9, "{usage}");
    let expected_one = held_s(&one[2]) / 3600.0;
    assert!((hours("one-second") - expected_one).abs() < 1e-9, "{usage}");
}

/// Issue 19, finding 7: a job that starts a `setsid` child and exits is not over while
/// the child runs in its cgroup. With `leftovers = "wait"` it keeps its GPU (another
/// user's exclusive request for it is refused, root's `gpupin exec` waits) until the child
/// is killed; with "kill" the child is killed and the GPU released. Root's own
/// `gpupin exec` and a user's job through `gpupin serve` alike.
#[test]
fn a_job_that_leaves_a_setsid_child_is_over_when_its_cgroup_is_empty() {
    let test = "a_job_that_leaves_a_setsid_child";
    if !requirements(test) {
        return;
    }
    let alice = User::create("lefa");
    let bob = User::create("lefb");
    for leftovers in ["wait", "kill"] {
        let g = gpupin(&format!("leftovers = \"{leftovers}\"\nlog = \"debug\""));
        let daemon = Daemon::start(&g);
        for (who, user) in [("root", None), ("user", Some(&alice))] {
            let name = format!("{leftovers}-{who}");
            let s = scratch(&g);
            let child_file = s.join(format!("{name}.child"));
            let script = format!(
                "setsid sh -c 'echo $$ > {}; exec sleep 300' </dev/null >/dev/null 2>&1 & {}",
                child_file.display(),
                job_script(&s, &name, 0)
            );
            let mut job = Job::start_with(&g, user, &name, &["--devices", "3"], &[], &script);
            let report = job.ready();
            let holder = job.holder();
            let child: i32 = until("the setsid child says its pid", || {
                std::fs::read_to_string(&child_file)
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            });
            let own: Vec<Value> = exec_support::own_cgroup_dirs(&report, &holder)
                .iter()
                .map(|d| Value::from(d.to_str().unwrap()))
                .collect();
            assert!(!own.is_empty(), "{:?}", report.cgroups);
            assert_eq!(
                record(&g, &holder)["cgroups"],
                Value::from(own),
                "{who} {leftovers}: the record names the job's cgroups"
            );
            job.go();
            until("the job's main process ends", || {
                (!alive(report.pid)).then_some(())
            });
            if leftovers == "wait" {
                // Whoever watches the job has seen its main process end, and waits.
                match user {
                    None => until("gpupin exec waits for the leftover", || {
                        job.stderr()
                            .contains("waiting for the 1 process it left in its cgroup")
                            .then_some(())
                    }),
                    Some(_) => until("the daemon waits for the leftover", || {
                        let log = daemon.log();
                        let seen = log.lines().any(|l| {
                            l.contains("the job's cgroup still has processes")
                                && l.contains(&holder)
                        });
                        seen.then_some(())
                    }),
                }
                let h = g.holder(&holder).expect("the job keeps its GPU");
                assert_eq!(h["state"], "running", "{who}: {h}");
                let line = refused(&g, Some(&bob), &["exec", "--devices", "3", "--", "true"]);
                assert!(line.contains("GPU 3"), "{who}: {line}");
                if user.is_none() {
                    assert!(!job.has_ended(), "root's gpupin exec waits");
                }
                assert!(alive(child), "{who}: the leftover runs on");
                // Issue 32, item 4: status says which process keeps the GPU, for its
                // user and everyone else, in both views and the JSON.
                let said = format!(
                    "{holder}: main process {} exited; leftover pid {child} (sleep 300) keeps its GPUs: end it, or gpupin evict {holder}",
                    report.pid
                );
                for (viewer, args) in [
                    (user, &["status", "--long"][..]),
                    (Some(&bob), &["status"][..]),
                ] {
                    let shown = ok(&g, viewer, args);
                    assert!(shown.contains(&said), "{who} {args:?}: {shown}");
                }
                let json: Value =
                    serde_json::from_str(&ok(&g, Some(&bob), &["status", "--json"])).unwrap();
                assert_eq!(json["leftovers"][0]["pid"], child, "{json}");
                exec_support::send(child, libc::SIGKILL);
            }
            let (exit, stderr) = job.wait();
            assert!(exit.success(), "{who} {leftovers}: {exit}: {stderr}");
            until("the job's GPU is released", || {
                g.holder(&holder).is_none().then_some(())
            });
            until("the leftover is gone", || (!alive(child)).then_some(()));
            // The audit line is written before the record goes (both under the ledger's
            // lock, which a reader of the log does not take).
            let events = until("the release is in the audit log", || {
                let events = events_of(&g, &holder);
                (events.last()?["event"] == "release").then_some(events)
            });
            assert_eq!(events.last().unwrap()["event"], "release", "{events:?}");
            let out = run(&g, Some(&bob), &["exec", "--devices", "3", "--", "true"]);
            assert!(
                out.status.success(),
                "{who} {leftovers}: the GPU is free again: {}",
                harness::stderr(&out)
            );
        }
        until_clean(&g);
        drop(daemon);
    }
}

/// Issue 19, finding 12: a daemon restarted while a user's job runs finds the job's
/// cgroups in its record: the job still lasts until its cgroup is empty (here a `setsid`
/// child outlives its main process), and the new daemon removes the cgroups at its end.
#[test]
fn a_restarted_daemon_waits_for_the_jobs_cgroup_and_removes_it() {
    let test = "a_restarted_daemon_waits_for_the_jobs_cgroup";
    if !requirements(test) {
        return;
    }
    let alice = User::create("rsta");
    let g = gpupin("log = \"debug\"");
    let first = Daemon::start(&g);
    let name = "restarted";
    let s = scratch(&g);
    let child_file = s.join(format!("{name}.child"));
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 300' </dev/null >/dev/null 2>&1 & {}",
        child_file.display(),
        job_script(&s, name, 0)
    );
    let mut job = Job::start_with(&g, Some(&alice), name, &["--count", "1"], &[], &script);
    let report = job.ready();
    let holder = job.holder();
    let child: i32 = until("the setsid child says its pid", || {
        std::fs::read_to_string(&child_file)
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let dirs = exec_support::own_cgroup_dirs(&report, &holder);
    assert!(!dirs.is_empty(), "{:?}", report.cgroups);
    drop(first);
    let second = Daemon::start(&g);
    // A request answered: the daemon serves once it watches what the ledger holds.
    let out = run(&g, Some(&alice), &["release", "nothing-held-here"]);
    assert!(!out.status.success(), "{}", harness::stderr(&out));
    // A script's release of what is not there, through the daemon, is no error.
    let said = ok(
        &g,
        Some(&alice),
        &[
            "release",
            "--exact",
            "--ignore-missing",
            "nothing-held-here",
        ],
    );
    assert_eq!(
        said.trim_end(),
        "no holder \"nothing-held-here\": nothing to release"
    );

    job.go();
    until("the job's main process ends", || {
        (!alive(report.pid)).then_some(())
    });
    until("the new daemon waits for the leftover", || {
        let log = second.log();
        let seen = log
            .lines()
            .any(|l| l.contains("the job's cgroup still has processes") && l.contains(&holder));
        seen.then_some(())
    });
    let h = g
        .holder(&holder)
        .expect("the job keeps its GPU while its child runs");
    assert_eq!(h["state"], "running", "{h}");
    assert!(dirs.iter().all(|d| d.exists()));

    exec_support::send(child, libc::SIGKILL);
    until("the job's GPU is released", || {
        g.holder(&holder).is_none().then_some(())
    });
    until("the new daemon removes the job's cgroups", || {
        dirs.iter().all(|d| !d.exists()).then_some(())
    });
    let (exit, stderr) = job.wait();
    assert!(exit.success(), "{exit}: {stderr}");
    until_clean(&g);
}

/// `gpupin evict` of a user's job: a job that ignores SIGTERM is killed after the
/// grace, `gpupin exec` ends with the job's signal, the GPU is free again, and the audit
/// log says root evicted it, as the job's `gpupin exec` does on its stderr.
#[test]
fn evict_kills_a_job_that_ignores_term_and_frees_its_gpu() {
    let test = "evict_kills_a_job_that_ignores_term_and_frees_its_gpu";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let bob = User::create("evict");
    let _daemon = Daemon::start(&g);
    let name = "stubborn";
    let script = format!("trap '' TERM; {}", job_script(&scratch(&g), name, 0));
    let args = ["--count", "1", "--name", name];
    let mut job = Job::start_with(&g, Some(&bob), name, &args, &[], &script);
    job.ready();
    let said = ok(&g, None, &["evict", name, "--grace", "1s"]);
    assert!(
        said.starts_with(&format!(
            "evicted {name} (killed: still running 1s after SIGTERM); released GPU-"
        )),
        "{said}"
    );
    let (exit, stderr) = job.wait();
    assert_eq!(
        exit.signal().or(exit.code().map(|c| c - 128)),
        Some(libc::SIGKILL),
        "{stderr}"
    );
    assert!(
        stderr.ends_with(&format!(
            "gpupin: {name} was ended by root (gpupin evict)\n"
        )),
        "{stderr}"
    );
    let events = events_of(&g, name);
    let evict = events
        .iter()
        .find(|e| e["event"] == "evict")
        .unwrap_or_else(|| panic!("{events:?}"));
    assert_eq!(evict["user"], bob.name);
    assert!(
        evict["reason"]
            .as_str()
            .unwrap()
            .starts_with("gpupin evict by root"),
        "{evict}"
    );
    until_clean(&g);
}

/// `gpupin serve` as an admin runs it: it says where it listens; SIGHUP (the usual reload
/// signal, which used to end it silently and leave a stale socket) re-reads the config,
/// so a new limit applies to the next request while a job that runs keeps its GPU; a
/// config that does not read is reported and the old one stays; SIGTERM stops it, exit
/// 0, and its socket is gone.
#[test]
fn serve_reloads_on_sighup_and_stops_cleanly_on_sigterm() {
    let test = "serve_reloads_on_sighup_and_stops_cleanly_on_sigterm";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let ann = User::create("hup");
    let mut daemon = Daemon::start(&g);
    let socket = g.state_dir.join("gpupin.sock");
    let hup = |daemon: &Daemon| {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(daemon.pid(), libc::SIGHUP) };
    };
    assert!(
        daemon.log().starts_with(&format!(
            "gpupin serve: listening on {}, pid {}",
            socket.display(),
            daemon.pid()
        )),
        "{}",
        daemon.log()
    );
    let mut first = Job::start(&g, Some(&ann), "before-hup", &["--count", "1"]);
    first.ready();
    let config = std::fs::read_to_string(&g.config).unwrap();
    std::fs::write(
        &g.config,
        format!("{config}\n[limits]\nmax_gpus_per_user = 1\n"),
    )
    .unwrap();
    hup(&daemon);
    until("the reload is reported", || {
        daemon
            .log()
            .contains("gpupin serve: reloaded ")
            .then_some(())
    });
    assert!(daemon.running());
    let line = refused(&g, Some(&ann), &["exec", "--count", "1", "--", "true"]);
    assert!(line.contains("(limits.max_gpus_per_user)"), "{line}");
    // A config with a typo is not taken: the one it had stays, and says why.
    std::fs::write(&g.config, format!("{config}\npolcy = \"pack\"\n")).unwrap();
    hup(&daemon);
    until("the failed reload is reported", || {
        daemon
            .log()
            .contains("gpupin serve: not reloaded, the config it had stays: invalid config ")
            .then_some(())
    });
    // The client reads the same file for the socket: put the good one back, unreloaded.
    std::fs::write(
        &g.config,
        format!("{config}\n[limits]\nmax_gpus_per_user = 1\n"),
    )
    .unwrap();
    let line = refused(&g, Some(&ann), &["exec", "--count", "1", "--", "true"]);
    assert!(line.contains("(limits.max_gpus_per_user)"), "{line}");
    let (exit, stderr) = first.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
    // SIGTERM: a clean stop that takes its socket with it.
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(daemon.pid(), libc::SIGTERM) };
    until("gpupin serve stops", || (!daemon.running()).then_some(()));
    assert!(!socket.exists(), "the socket is removed");
    assert!(
        daemon.log().ends_with("gpupin serve: stopped\n"),
        "{}",
        daemon.log()
    );
    until_clean(&g);
}

/// Issue 31, finding 5: `hold --for 500000000000y` once stored an end no time could hold,
/// and from then on `status --json`, `status --long` and the daemon's status op panicked
/// for everyone. A hold's time is bounded where it is read, from the CLI and from a
/// request a user writes by hand.
#[test]
fn a_hold_for_ever_is_refused_and_status_still_answers_everyone() {
    let test = "a_hold_for_ever_is_refused";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let mallory = User::create("ever");
    let _daemon = Daemon::start(&g);
    let sleeper = Sleeper::start(&mallory);
    let pid = sleeper.pid().to_string();
    let before = g.ledger_snapshot();

    let out = run(
        &g,
        Some(&mallory),
        &[
            "hold",
            "h",
            "--devices",
            "2",
            "--pid",
            &pid,
            "--for",
            "500000000000y",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", harness::stderr(&out));
    let line = harness::stderr(&out);
    assert!(
        line.starts_with("gpupin: invalid --for \"500000000000y\": a hold lasts at most 366 days")
            && line.trim_end().lines().count() == 1,
        "{line}"
    );

    // The same by hand, past the CLI: the daemon refuses it in one line.
    let request = format!(
        r#"{{"op":"hold","id":"h","devices":"2","pid":{pid},"for_secs":{}}}"#,
        u64::MAX
    );
    let script = "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(sys.argv[2].encode()+b'\\n')\nprint(s.makefile().readline(),end='')";
    let out = Command::new("/usr/bin/python3")
        .args(["-c", script])
        .arg(g.state_dir.join("gpupin.sock"))
        .arg(&request)
        .uid(mallory.uid)
        .gid(mallory.gid)
        .output()
        .unwrap();
    let reply: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", harness::stderr(&out)));
    let error = reply["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("a hold lasts at most 366 days") && !error.contains('\n'),
        "{reply}"
    );
    assert_eq!(
        g.ledger_snapshot(),
        before,
        "nothing is held after the refusals"
    );

    // A hold for a year still works, and everyone's status shows its end.
    ok(
        &g,
        Some(&mallory),
        &[
            "hold",
            "h",
            "--devices",
            "2",
            "--pid",
            &pid,
            "--for",
            "365days",
        ],
    );
    for user in [None, Some(&mallory)] {
        let long = ok(&g, user, &["status", "--long"]);
        assert!(long.contains("left"), "{long}");
        let json: Value = serde_json::from_str(&ok(&g, user, &["status", "--json"])).unwrap();
        assert!(json["holders"][0]["expires_at"].is_string(), "{json}");
    }
    ok(&g, Some(&mallory), &["release", "h"]);
    until_clean(&g);
}

/// Issue 31, finding 2: the documented `gpupin exec --within ID:KEY` left the key in
/// /proc/PID/cmdline for the whole job, where any local user reads it and takes the
/// holder's GPUs; and at `log = debug` the daemon logged it. Now a key comes from a file
/// only its user reads (or the environment), never from an argument, and no log line
/// has it.
#[test]
fn a_holders_key_never_shows_on_a_command_line_or_in_the_log() {
    let test = "a_holders_key_never_shows";
    if !requirements(test) {
        return;
    }
    let g = gpupin("log = \"debug\"");
    let alice = User::create("keya");
    let bob = User::create("keyb");
    let daemon = Daemon::start(&g);
    let sleeper = Sleeper::start(&alice);
    let pid = sleeper.pid().to_string();
    ok(
        &g,
        Some(&alice),
        &["hold", "alice-h", "--devices", "2,3", "--pid", &pid],
    );
    let key_line = ok(&g, Some(&alice), &["key", "alice-h"]);
    let key = key_line
        .trim()
        .split_once(':')
        .expect("ID:KEY")
        .1
        .to_string();
    assert_eq!(key.len(), 32, "{key_line}");
    let before = g.ledger_snapshot();

    let line = refused(
        &g,
        Some(&bob),
        &[
            "exec",
            "--count",
            "1",
            "--within",
            &format!("alice-h:{key}"),
            "--",
            "true",
        ],
    );
    assert!(
        line.contains("--within alice-h:KEY puts the key on the command line")
            && !line.contains(&key),
        "{line}"
    );
    assert_eq!(
        g.ledger_snapshot(),
        before,
        "nothing held after the refusal"
    );

    // From a file only bob reads, as `gpupin key` printed it.
    let file = scratch(&g).join("bobs-key");
    std::fs::write(&file, &key_line).unwrap();
    std::os::unix::fs::chown(&file, Some(bob.uid), Some(bob.gid)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let file = file.to_str().unwrap();
    let mut job = Job::start(
        &g,
        Some(&bob),
        "bobs",
        &["--count", "1", "--within", "alice-h", "--key-file", file],
    );
    let report = job.ready();
    assert!(
        [[2], [3]].contains(&report.cuda_indices().as_slice().try_into().unwrap()),
        "a GPU of alice's hold: {:?}",
        report.cuda_indices()
    );
    // While the job runs, no process on the machine shows the key on its command line.
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            assert!(
                !String::from_utf8_lossy(&cmdline).contains(&key),
                "{:?} shows the key: {}",
                entry.path(),
                String::from_utf8_lossy(&cmdline).replace('\0', " ")
            );
        }
    }
    let log = daemon.log();
    assert!(
        log.contains("alice-h:(key)"),
        "the request is logged: {log}"
    );
    assert!(!log.contains(&key), "the daemon's log has the key: {log}");
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    ok(&g, Some(&alice), &["release", "alice-h"]);
    until_clean(&g);
}

/// Issue 32, item 5: on sim:dgxa100mig (6 of 8 GPUs handed out whole) `exec --count 7`
/// was told "0 of 8 GPUs held, 8 free; add --wait 10m", a wait that can never succeed;
/// `--model A100` on an H100 box likewise, in an annotation's words. A user now reads the
/// counts of what can be handed out and what would have to change, in the CLI's words.
#[test]
fn a_refusal_suggests_a_wait_only_where_one_can_succeed() {
    let test = "a_refusal_suggests_a_wait_only_where_one_can_succeed";
    if !requirements(test) {
        return;
    }
    let g = gpupin_sandbox::harness::Gpupin::with_extra(GPUPIN, "sim:dgxa100mig", "");
    open_up(&g);
    let carol = User::create("wai");
    let _daemon = Daemon::start(&g);
    let before = g.ledger_snapshot();
    for wait in [&[][..], &["--wait", "1h"][..]] {
        let mut args = vec!["exec", "--count", "7"];
        args.extend_from_slice(wait);
        args.extend_from_slice(&["--", "true"]);
        let line = refused(&g, Some(&carol), &args);
        assert!(
            line.ends_with(": 0 of 6 GPUs held, 6 free; 2 GPUs are in MIG mode (handed out as instances), so no wait helps: ask for at most 6"),
            "{wait:?}: {line}"
        );
    }
    let line = refused(
        &g,
        Some(&carol),
        &["exec", "--count", "1", "--model", "H100", "--", "true"],
    );
    assert!(
        line.contains("0 can take --model H100;")
            && line.contains("not --model H100 (this machine has NVIDIA A100-SXM4-80GB)")
            && !line.contains("wait 10m"),
        "{line}"
    );
    // Where a wait can succeed, it is still what the refusal suggests.
    let mut job = Job::start(&g, Some(&carol), "six", &["--count", "6"]);
    job.ready();
    let line = refused(&g, Some(&carol), &["exec", "--count", "1", "--", "true"]);
    assert!(
        line.ends_with(": 6 of 6 GPUs held, 0 free; add --wait 10m to wait until they free up"),
        "{line}"
    );
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
    assert_eq!(g.ledger_snapshot(), before);
}

/// Issue 31, finding 3: alice waiting `--wait 24h` for a GPU she holds herself stayed at
/// the head of the queue, and every other request on the node was refused ("requests
/// are waiting ahead of it") with 6 of 8 GPUs free. Now bob's job is served at once, and
/// a container's hook (which never waits) too.
#[test]
fn a_user_waiting_for_her_own_gpu_blocks_no_one_else() {
    let test = "a_user_waiting_for_her_own_gpu";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("owna");
    let bob = User::create("ownb");
    let _daemon = Daemon::start(&g);
    let mut first = Job::start(&g, Some(&alice), "first", &["--devices", "2"]);
    first.ready();
    let mut again = exec_support::cmd(
        &g,
        Some(&alice),
        &["exec", "--devices", "2", "--wait", "24h", "--", "true"],
    );
    let mut waiting = again.stderr(Stdio::null()).spawn().unwrap();
    until("alice waits in the queue", || {
        (queued(&g) == 1).then_some(())
    });
    let out = ok(&g, Some(&bob), &["exec", "--count", "1", "--", "true"]);
    assert_eq!(out, "", "bob's job ran");
    let out = ok(&g, None, &["exec", "--count", "6", "--", "true"]);
    assert_eq!(out, "", "root's job for the 6 other GPUs ran");
    assert_eq!(queued(&g), 1, "alice still waits");
    waiting.kill().unwrap();
    waiting.wait().unwrap();
    let (exit, stderr) = first.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
}

/// Issue 31, finding 7: one user looping hold-then-release through the daemon wrote
/// thousands of lines a second, and at the defaults the whole trail and `gpupin usage`
/// history rotated out in minutes, everyone's with it. Each user's holders now have a
/// log of their own, rotated on its own: mallory's loop (on a trail capped at 4KiB a
/// file) rotates only her own lines, and alice's job stays in `gpupin log` and
/// `gpupin usage`.
#[test]
fn a_users_flood_of_holds_rotates_no_one_elses_events_away() {
    let test = "a_users_flood_of_holds_rotates_no_one_elses";
    if !requirements(test) {
        return;
    }
    let g = gpupin("audit_max_size = \"4KiB\"\naudit_keep = 1");
    let alice = User::create("flda");
    let mallory = User::create("fldm");
    let _daemon = Daemon::start(&g);
    let mut job = Job::start(&g, Some(&alice), "alices", &["--count", "1"]);
    job.ready();
    let holder = job.holder();
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    until_clean(&g);
    let sleeper = Sleeper::start(&mallory);
    let pid = sleeper.pid().to_string();
    for _ in 0..60 {
        ok(
            &g,
            Some(&mallory),
            &["hold", "m", "--devices", "5", "--pid", &pid],
        );
        ok(&g, Some(&mallory), &["release", "m"]);
    }
    let log = ok(&g, None, &["log", "--user", &alice.name, "--json"]);
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["holder"] == holder.as_str())
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["allocate", "bind", "release"], "{log}");
    let usage = ok(&g, None, &["usage", "--by", "user"]);
    assert!(usage.contains(&alice.name), "{usage}");
    assert!(
        g.state_dir
            .join(format!("audit.users/{}.log.1", mallory.uid))
            .exists(),
        "mallory's own log rotated"
    );
}

/// Issue 32, item 11: the CLI ignored `GPUPIN_SOCKET` while the Python client read only
/// it. Both now take `GPUPIN_SOCKET`, else the config's socket: a user whose config names
/// another state dir reaches the daemon through the variable.
#[test]
fn gpupin_socket_in_the_environment_wins_over_the_config() {
    let test = "gpupin_socket_in_the_environment_wins";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("sock");
    let _daemon = Daemon::start(&g);
    let sleeper = Sleeper::start(&alice);
    let pid = sleeper.pid().to_string();
    let elsewhere = scratch(&g).join("elsewhere.toml");
    std::fs::write(
        &elsewhere,
        "state_dir = \"/nonexistent/gpupin\"\ninventory = \"sim:nvswitch8\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o644)).unwrap();
    let hold = |socket: Option<&Path>| {
        let mut cmd = Command::new(&g.bin);
        cmd.arg("--config")
            .arg(&elsewhere)
            .args(["hold", "h", "--devices", "4", "--pid", &pid])
            .env_remove("GPUPIN_CONFIG")
            .env_remove("GPUPIN_SOCKET")
            .stdin(Stdio::null());
        if let Some(socket) = socket {
            cmd.env("GPUPIN_SOCKET", socket);
        }
        alice.owns(&mut cmd);
        cmd.output().unwrap()
    };
    let out = hold(None);
    assert!(
        harness::stderr(&out)
            .contains("cannot reach gpupin serve at /nonexistent/gpupin/gpupin.sock"),
        "{}",
        harness::stderr(&out)
    );
    let out = hold(Some(&g.state_dir.join("gpupin.sock")));
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert!(
        harness::stdout(&out).contains("h holds GPU 4"),
        "{}",
        harness::stdout(&out)
    );
    ok(&g, Some(&alice), &["release", "h"]);
    until_clean(&g);
}

/// Issue 31 finding 3 and issue 32 item 7: alice's `exec --wait` for a GPU she holds
/// herself, and root's maintenance hold on another, stop no one: with 6 of 8 GPUs free
/// bob's `exec --count 1` is served at once, `gpupin queue` says why alice waits (its
/// WHY column, `reason` in JSON), and so does her exec's stderr (a file here, not a
/// terminal). Once her first job ends, her second gets GPU 3.
#[test]
fn a_wait_for_a_gpu_its_user_holds_does_not_stop_others() {
    let test = "a_wait_for_a_gpu_its_user_holds";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("ownw");
    let bob = User::create("ownwb");
    let _daemon = Daemon::start(&g);
    ok(
        &g,
        None,
        &["hold", "maint", "--devices", "5", "--until-release"],
    );
    let mut mine = Job::start(&g, Some(&alice), "mine", &["--devices", "3"]);
    assert_eq!(mine.ready().cuda_indices(), [3]);
    let wait = ["--devices", "3", "--wait", "120s"];
    let mut again = Job::start(&g, Some(&alice), "again", &wait);
    until("alice waits", || (queued(&g) == 1).then_some(()));
    let why = until("her wait has a reason", || {
        let listed: Value = serde_json::from_str(&ok(&g, None, &["queue", "--json"])).unwrap();
        listed[0]["reason"].as_str().map(String::from)
    });
    assert_eq!(why, "no free GPU of its kind");
    let table = ok(&g, None, &["queue"]);
    let (header, row) = (table.lines().next().unwrap(), table.lines().nth(1).unwrap());
    assert!(header.ends_with("WHY"), "{table}");
    assert!(row.ends_with("no free GPU of its kind"), "{table}");
    let mut job = Job::start(&g, Some(&bob), "bobs", &["--count", "1"]);
    let got = job.ready().cuda_indices();
    assert!(got.len() == 1 && got[0] != 3 && got[0] != 5, "{got:?}");
    let (exit, stderr) = job.finish();
    assert!(exit.success(), "{stderr}");
    until("her exec says why it waits", || {
        again
            .stderr()
            .contains("(no free GPU of its kind), ")
            .then_some(())
    });
    let (exit, stderr) = mine.finish();
    assert!(exit.success(), "{stderr}");
    assert_eq!(again.ready().cuda_indices(), [3]);
    let (exit, stderr) = again.finish();
    assert!(exit.success(), "{stderr}");
    ok(&g, None, &["release", "maint"]);
    until_clean(&g);
}
