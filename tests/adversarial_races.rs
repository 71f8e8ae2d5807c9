//! The adversarial suite, part 1: real hook processes racing for the GPUs of a simulated
//! machine, killed mid-flight, holders whose pid was reused, and a local user against
//! root's ledger. Each test asserts what the issue requires of the ledger afterwards, not
//! what the code happens to do today.
//!
//! Sizes: GPUPIN_ADV_N concurrent prestarts (default 500), GPUPIN_ADV_ROUNDS kill rounds
//! (default 30, and at most about 60 s of them) of GPUPIN_ADV_KILL_HOOKS hooks (default
//! 20), GPUPIN_ADV_SEED to replay a run's requests and victims.
//!
//! Needs root, `unshare` and the cgroup v1 devices controller (the user test also
//! `useradd`, `userdel`, `setpriv`). Tests may run in parallel: each has its own state dir
//! and cgroup names carry the test process's pid; the two heavy ones take turns.
//! `cargo test --test adversarial_races -- --nocapture --test-threads=1` shows the seeds
//! and timings.

mod adversarial_support;

use adversarial_support::{
    FakeContainer, Hook, Rig, Rng, audit_count, containers, env_count, holder_ids,
    holder_violations, holdings, lock_is_free, oci_state, output_refusal_problem, queue_tickets,
    raise_fd_limit, refusal_problem, release_and_wait, runnable, snapshot, temp_files, text,
    unsafe_modes, wait_all,
};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The two heavy tests start hundreds of processes on a small machine; run alone, each
/// stays within its time bounds. The others may run beside them.
static HEAVY: Mutex<()> = Mutex::new(());

fn heavy() -> std::sync::MutexGuard<'static, ()> {
    HEAVY.lock().unwrap_or_else(|e| e.into_inner())
}

/// What a request is, for what its hook may do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// May get GPUs or be refused for lack of them.
    Valid,
    /// Asks for more than the machine has: always refused.
    Impossible,
    /// Not a request gpupin accepts: always refused, before the ledger is touched.
    Malformed,
}

/// One random request: its annotations and what it is.
fn request(rng: &mut Rng) -> (Vec<(String, String)>, Kind) {
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let count = |rng: &mut Rng, max: u64| (1 + rng.below(max)).to_string();
    let reserve = |rng: &mut Rng| format!("{}GiB", 4 * (1 + rng.below(4)));
    // Exclusive requests are few: each one closes its GPUs to sharing, and the point is
    // to crowd the shared holders against their limit and their reservations.
    let roll = rng.below(100);
    match roll {
        0..=9 => (vec![pair("gpupin.count", &count(rng, 4))], Kind::Valid),
        10..=59 => (
            vec![
                pair("gpupin.count", &count(rng, 2)),
                pair("gpupin.share", "shared"),
                pair("gpupin.reserve", &reserve(rng)),
            ],
            Kind::Valid,
        ),
        60..=64 => (
            vec![pair("gpupin.count", "1"), pair("gpupin.share", "shared")],
            Kind::Valid,
        ),
        65..=74 => (
            vec![
                pair("gpupin.count", &count(rng, 2)),
                pair("gpupin.memory", "20GiB"),
            ],
            Kind::Valid,
        ),
        75..=84 => (
            vec![
                pair("gpupin.count", "1"),
                pair("gpupin.share", "shared"),
                pair("gpupin.reserve", "8GiB"),
                pair("gpupin.memory", "20GiB"),
            ],
            Kind::Valid,
        ),
        85..=89 => (vec![pair("gpupin.count", "17")], Kind::Impossible),
        _ => {
            let bad = match rng.below(5) {
                0 => vec![pair("gpupin.count", "-1")],
                1 => vec![pair("gpupin.count", "1"), pair("gpupin.colour", "red")],
                2 => vec![pair("gpupin.count\nx", "1")],
                3 => vec![pair("gpupin.count", "1\ngpupin: 2")],
                _ => vec![pair("gpupin.count", "1"), pair("gpupin.reserve", "4GiB")],
            };
            (bad, Kind::Malformed)
        }
    }
}

fn container_id(rig: &Rig, n: usize) -> String {
    format!("{}-c{n}", rig.prefix)
}

/// Fails with every problem found, the first 40 spelled out.
fn fail_if(problems: &[String], what: &str) {
    let shown: Vec<&str> = problems.iter().take(40).map(String::as_str).collect();
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n{}",
        problems.len(),
        shown.join("\n")
    );
}

/// What a user checks in a container that got GPUs: its /dev has exactly the nodes of
/// its GPUs (and the control nodes), its device cgroup allows exactly those GPUs, and the
/// bundle tells later hooks which GPUs they are.
fn container_problems(
    id: &str,
    c: &FakeContainer,
    gpus: &[String],
    minors: &BTreeMap<String, u32>,
    bundle: &Path,
) -> Vec<String> {
    let mut problems = Vec::new();
    let want: BTreeSet<u32> = gpus.iter().map(|u| minors[u]).collect();
    let nodes: BTreeSet<u32> = c
        .dev_entries()
        .iter()
        .filter_map(|n| n.strip_prefix("nvidia")?.parse().ok())
        .collect();
    if nodes != want {
        problems.push(format!(
            "{id}: /dev has GPU nodes {nodes:?}, holds minors {want:?}"
        ));
    }
    if !c.dev_entries().contains("nvidiactl") {
        problems.push(format!("{id}: /dev has no nvidiactl"));
    }
    let list = c.devices_list();
    let allowed: BTreeSet<u32> = list
        .iter()
        .filter_map(|rule| {
            let rest = rule.strip_prefix(&format!("c {}:", adversarial_support::GPU_MAJOR))?;
            rest.split(' ').next()?.parse().ok()
        })
        .filter(|m| *m < 255)
        .collect();
    if allowed != want || list.iter().any(|r| r.starts_with("a ")) {
        problems.push(format!(
            "{id}: devices.list {list:?}, holds minors {want:?}"
        ));
    }
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let visible = format!("NVIDIA_VISIBLE_DEVICES={}", gpus.join(","));
    let env = spec["process"]["env"].as_array().unwrap();
    if !env.iter().any(|e| e == visible.as_str()) {
        problems.push(format!("{id}: bundle env {env:?} lacks {visible}"));
    }
    problems
}

/// Fake containers, each with a random request, whose hooks run together.
struct Wave {
    ids: Vec<String>,
    boxes: Vec<FakeContainer>,
    bundles: Vec<PathBuf>,
    requests: Vec<(Vec<(String, String)>, Kind)>,
}

impl Wave {
    /// `n` containers numbered from `first`, started and settled.
    fn new(rig: &Rig, rng: &mut Rng, first: usize, n: usize) -> Wave {
        let started = Instant::now();
        let boxes = containers(rig, n);
        eprintln!("{n} fake containers in {:?}", started.elapsed());
        let ids: Vec<String> = (first..first + n).map(|i| container_id(rig, i)).collect();
        Wave {
            bundles: ids.iter().map(|id| rig.bundle(id)).collect(),
            requests: (0..n).map(|_| request(rng)).collect(),
            ids,
            boxes,
        }
    }

    /// One `stage` hook per container, each blocked until released.
    fn hooks(&self, rig: &Rig, stage: &str) -> Vec<Hook> {
        (0..self.ids.len())
            .map(|i| {
                let state = oci_state(
                    &self.ids[i],
                    self.boxes[i].pid,
                    &self.bundles[i],
                    &self.requests[i].0,
                );
                Hook::spawn(rig, stage, &self.ids[i], state)
            })
            .collect()
    }

    /// Which prestarts (in container order) got GPUs, and what is wrong with the
    /// outcomes: a refused request that succeeded, a refusal that is not one line.
    fn outcomes(&self, prestarts: &[Hook]) -> (BTreeSet<String>, Vec<String>) {
        let mut problems = Vec::new();
        let mut succeeded = BTreeSet::new();
        for (h, (request, kind)) in prestarts.iter().zip(&self.requests) {
            if h.succeeded() {
                succeeded.insert(h.id.clone());
                if *kind != Kind::Valid {
                    problems.push(format!("{} ({kind:?} {request:?}) succeeded", h.id));
                }
            } else if let Some(p) = h.refusal_problem() {
                problems.push(format!("{} ({request:?}): {p}", h.id));
            }
        }
        eprintln!(
            "{} of {} prestarts got GPUs",
            succeeded.len(),
            prestarts.len()
        );
        (succeeded, problems)
    }

    /// Records of this wave's containers that are not bound to them, running.
    fn binding_problems(&self, status: &serde_json::Value) -> Vec<String> {
        let mut problems = Vec::new();
        for h in status["holders"].as_array().unwrap() {
            let Some(i) = self.ids.iter().position(|id| h["id"] == id.as_str()) else {
                continue;
            };
            if h["pid"] != self.boxes[i].pid || h["state"] != "running" {
                problems.push(format!(
                    "{} is not bound to its container: {h}",
                    self.ids[i]
                ));
            }
        }
        problems
    }

    /// What a sample of containers see: the refused ones no node and no device, those
    /// that got GPUs exactly theirs.
    fn container_checks(
        &self,
        rig: &Rig,
        status: &serde_json::Value,
        succeeded: &BTreeSet<String>,
    ) -> Vec<String> {
        let mut problems = Vec::new();
        let refused = (0..self.ids.len()).filter(|i| !succeeded.contains(&self.ids[*i]));
        for i in refused.take(25) {
            let nodes: Vec<String> = self.boxes[i]
                .dev_entries()
                .into_iter()
                .filter(|e| e.starts_with("nvidia"))
                .collect();
            let list = self.boxes[i].devices_list();
            if !nodes.is_empty() || !list.is_empty() {
                problems.push(format!(
                    "refused {} has {nodes:?}, allows {list:?}",
                    self.ids[i]
                ));
            }
        }
        let minors = rig.minors();
        let held = holdings(status);
        for (i, id) in self
            .ids
            .iter()
            .enumerate()
            .filter(|(_, id)| held.contains_key(*id))
            .take(25)
        {
            let c = &self.boxes[i];
            problems.extend(container_problems(
                id,
                c,
                &held[id],
                &minors,
                &self.bundles[i],
            ));
        }
        problems
    }
}

/// Releases the hooks together and waits; hung hooks fail the test at once.
fn run_together(hooks: &mut [Hook], what: &str) {
    let started = Instant::now();
    let hung = release_and_wait(hooks, Duration::from_secs(120));
    eprintln!("{} {what} in {:?}", hooks.len(), started.elapsed());
    assert!(
        hung.is_empty(),
        "{what} still running after 120 s: {hung:?}"
    );
}

/// Poststop must succeed for every container, refused or not: runc runs it when it
/// tears down a container whose prestart failed, too.
fn poststop_problems(stops: &[Hook]) -> Vec<String> {
    stops
        .iter()
        .filter(|h| !h.succeeded())
        .map(|h| format!("poststop {}: {:?} {:?}", h.id, h.status, h.stderr()))
        .collect()
}

/// Each id once.
fn once<'a>(ids: impl IntoIterator<Item = &'a String>) -> BTreeMap<String, usize> {
    ids.into_iter().map(|id| (id.clone(), 1)).collect()
}

/// The audit log has exactly one `event` line for each of `ids`, and none for others.
fn audit_problems(rig: &Rig, event: &str, ids: &BTreeMap<String, usize>) -> Vec<String> {
    let found = audit_count(&rig.state_dir, event);
    if &found == ids {
        return Vec::new();
    }
    vec![format!(
        "audit {event} lines {found:?}, expected one each for {ids:?}"
    )]
}

/// What must hold of the ledger when the holders are exactly `holders`.
fn ledger_problems(
    rig: &Rig,
    status: &serde_json::Value,
    holders: &BTreeSet<String>,
) -> Vec<String> {
    let mut problems = holder_violations(status, rig.max_shared, |i| rig.live_free(i));
    if &holder_ids(status) != holders {
        problems.push(format!(
            "records {:?} are not the successes {holders:?}",
            holder_ids(status)
        ));
    }
    problems.extend(ledger_hygiene(rig));
    problems
}

#[test]
fn hundreds_of_concurrent_prestarts_share_the_gpus_by_the_rules_and_release_all() {
    let test = "concurrent_prestarts";
    if !runnable(test, false) {
        return;
    }
    let _heavy = heavy();
    raise_fd_limit();
    let n = env_count("GPUPIN_ADV_N", 500);
    let mut rng = Rng::from_env(test);
    let rig = Rig::new(test, 3);
    let wave = Wave::new(&rig, &mut rng, 0, n);
    let mut prestarts = wave.hooks(&rig, "prestart");
    run_together(&mut prestarts, "prestarts");

    // Every check runs and every problem is reported: one defect must not hide another.
    let (succeeded, mut problems) = wave.outcomes(&prestarts);
    if succeeded.is_empty() {
        problems.push("no prestart got GPUs".into());
    }
    let status = rig.status();
    problems.extend(ledger_problems(&rig, &status, &succeeded));
    problems.extend(wave.binding_problems(&status));
    problems.extend(audit_problems(&rig, "allocate", &once(&succeeded)));
    problems.extend(wave.container_checks(&rig, &status, &succeeded));

    let mut stops = wave.hooks(&rig, "poststop");
    run_together(&mut stops, "poststops");
    problems.extend(poststop_problems(&stops));
    let status = rig.status();
    problems.extend(ledger_problems(&rig, &status, &BTreeSet::new()));
    if status["free"] != 16 {
        problems.push(format!("not every GPU is free after poststop: {status}"));
    }
    problems.extend(audit_problems(&rig, "release", &once(&succeeded)));
    fail_if(&problems, "concurrent prestarts (seed above)");
}

#[test]
fn prestarts_racing_poststops_take_only_what_was_released() {
    let test = "prestarts_vs_poststops";
    if !runnable(test, false) {
        return;
    }
    let _heavy = heavy();
    raise_fd_limit();
    let n = env_count("GPUPIN_ADV_N", 500) / 2;
    let mut rng = Rng::from_env(test);
    let rig = Rig::new(test, 3);
    let first = Wave::new(&rig, &mut rng, 0, n);
    let mut prestarts = first.hooks(&rig, "prestart");
    run_together(&mut prestarts, "first prestarts");
    let (first_ok, mut problems) = first.outcomes(&prestarts);

    // The first wave stops while the second starts, their hooks released alternately.
    let second = Wave::new(&rig, &mut rng, n, n);
    let stops = first.hooks(&rig, "poststop");
    let starts = second.hooks(&rig, "prestart");
    let mut mixed: Vec<Hook> = stops
        .into_iter()
        .zip(starts)
        .flat_map(|(a, b)| [a, b])
        .collect();
    run_together(&mut mixed, "poststops and prestarts");
    let (mut stops, mut starts) = (Vec::new(), Vec::new());
    for (k, h) in mixed.into_iter().enumerate() {
        if k % 2 == 0 {
            stops.push(h)
        } else {
            starts.push(h)
        }
    }
    problems.extend(poststop_problems(&stops));
    let (second_ok, found) = second.outcomes(&starts);
    problems.extend(found);
    if second_ok.is_empty() {
        problems.push("no prestart of the second wave got GPUs".into());
    }
    let status = rig.status();
    problems.extend(ledger_problems(&rig, &status, &second_ok));
    problems.extend(second.binding_problems(&status));
    problems.extend(second.container_checks(&rig, &status, &second_ok));
    let both = once(first_ok.iter().chain(&second_ok));
    problems.extend(audit_problems(&rig, "allocate", &both));
    problems.extend(audit_problems(&rig, "release", &once(&first_ok)));

    let mut stops = second.hooks(&rig, "poststop");
    run_together(&mut stops, "second poststops");
    problems.extend(poststop_problems(&stops));
    let status = rig.status();
    problems.extend(ledger_problems(&rig, &status, &BTreeSet::new()));
    problems.extend(audit_problems(&rig, "release", &both));
    fail_if(&problems, "prestarts racing poststops (seed above)");
}

/// No temp file anywhere in the state dir, and the lock free.
fn ledger_hygiene(rig: &Rig) -> Vec<String> {
    let mut problems: Vec<String> = temp_files(&rig.state_dir)
        .iter()
        .map(|t| format!("temp file left: {}", t.display()))
        .collect();
    if !lock_is_free(&rig.state_dir) {
        problems.push("the ledger lock is still held".into());
    }
    problems
}

/// A request for the kill rounds: small, some waiting in the queue.
fn kill_round_request(rng: &mut Rng) -> Vec<(String, String)> {
    let mut pairs = vec![("gpupin.count".to_string(), (1 + rng.below(3)).to_string())];
    if rng.chance(30) {
        pairs.push(("gpupin.share".into(), "shared".into()));
        pairs.push(("gpupin.reserve".into(), "8GiB".into()));
    }
    if rng.chance(30) {
        pairs.push(("gpupin.wait".into(), "5s".into()));
    }
    pairs
}

/// After gc, what must hold whatever was killed when: no GPU twice, every record held by
/// a live container of ours, no temp file, no ticket, the lock free.
fn after_gc_problems(rig: &Rig, live_pids: &BTreeSet<i32>) -> Vec<String> {
    let status = rig.status();
    let mut problems = holder_violations(&status, rig.max_shared, |i| rig.live_free(i));
    for h in status["holders"].as_array().unwrap() {
        let pid = h["pid"].as_i64().map(|p| p as i32);
        if h["state"] != "running" || !pid.is_some_and(|p| live_pids.contains(&p)) {
            problems.push(format!("record of a process that is gone: {h}"));
        }
    }
    for t in queue_tickets(&rig.state_dir) {
        problems.push(format!("queue ticket of a hook that is gone: {t}"));
    }
    problems.extend(ledger_hygiene(rig));
    problems
}

#[test]
fn hooks_and_containers_killed_mid_allocation_leave_a_ledger_gc_repairs() {
    let test = "kill_loop";
    if !runnable(test, false) {
        return;
    }
    let _heavy = heavy();
    raise_fd_limit();
    let rounds = env_count("GPUPIN_ADV_ROUNDS", 30);
    let per_round = env_count("GPUPIN_ADV_KILL_HOOKS", 20);
    let budget = Duration::from_secs(60);
    let mut rng = Rng::from_env(test);
    let rig = Rig::new(test, 2);
    let started = Instant::now();
    let mut done = 0;
    // Every round runs and reports: one defect must not hide another.
    let mut problems = Vec::new();
    let mut seen = BTreeSet::new();
    for round in 0..rounds {
        if started.elapsed() > budget {
            eprintln!("{test}: time is up after {round} rounds");
            break;
        }
        // A problem that stays (a temp file nobody removes) is reported once, with the
        // round it first appeared in.
        for p in kill_round(&rig, &mut rng, round * per_round, per_round) {
            if seen.insert(p.clone()) {
                problems.push(format!("round {round}: {p}"));
            }
        }
        done += 1;
    }
    eprintln!("{test}: {done} rounds in {:?}", started.elapsed());
    rig.gc();
    for p in after_gc_problems(&rig, &BTreeSet::new()) {
        if !seen.contains(&p) {
            problems.push(format!("after the last gc: {p}"));
        }
    }
    let all = rig.container();
    let id = format!("{}-all", rig.prefix);
    let bundle = rig.bundle(&id);
    let count = [("gpupin.count".to_string(), "16".to_string())];
    let state = oci_state(&id, all.pid, &bundle, &count);
    let out = rig.run(&["hook", "prestart"], &state);
    if !out.status.success() {
        problems.push(format!(
            "all 16 GPUs once every container is gone: {}",
            text(&out.stderr)
        ));
    }
    let out = rig.run(&["hook", "poststop"], &state);
    if !out.status.success() || rig.status()["free"] != 16 {
        problems.push(format!("poststop of all 16: {}", text(&out.stderr)));
    }
    fail_if(&problems, "kill loop (seed above)");
}

/// One round: `size` containers and their prestarts race with two `gpupin gc`; some
/// hooks and containers are SIGKILLed 0-50 ms in, and one hook waiting in the queue
/// later; then gc. Returns what is wrong afterwards. The surviving containers die at the
/// end without poststop: the next round's allocations must reap them.
fn kill_round(rig: &Rig, rng: &mut Rng, first: usize, size: usize) -> Vec<String> {
    let mut boxes = containers(rig, size);
    let ids: Vec<String> = (first..first + size)
        .map(|i| container_id(rig, i))
        .collect();
    let mut hooks: Vec<Hook> = (0..size)
        .map(|i| {
            let bundle = rig.bundle(&ids[i]);
            let request = kill_round_request(rng);
            let state = oci_state(&ids[i], boxes[i].pid, &bundle, &request);
            Hook::spawn(rig, "prestart", &ids[i], state)
        })
        .collect();
    // What happens when (ms after the release), in order.
    let mut schedule: Vec<(u64, Blow)> = vec![(rng.below(50), Blow::Gc), (rng.below(50), Blow::Gc)];
    for i in 0..size {
        if rng.chance(40) {
            schedule.push((rng.below(50), Blow::KillHook(i)));
        }
        if rng.chance(20) {
            schedule.push((rng.below(50), Blow::KillContainer(i)));
        }
    }
    schedule.sort_by_key(|(at, _)| *at);
    for h in hooks.iter_mut() {
        h.release();
    }
    let t0 = Instant::now();
    let mut gcs = Vec::new();
    for (at, blow) in schedule {
        std::thread::sleep(Duration::from_millis(at).saturating_sub(t0.elapsed()));
        match blow {
            Blow::KillHook(i) => hooks[i].kill(),
            Blow::KillContainer(i) => boxes[i].kill(),
            Blow::Gc => gcs.push(
                rig.command()
                    .arg("gc")
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap(),
            ),
        }
    }
    // Some hooks sit in the queue by now (gpupin.wait): one of them dies there.
    std::thread::sleep(Duration::from_millis(300).saturating_sub(t0.elapsed()));
    let waiting: Vec<usize> = (0..size).filter(|&i| !hooks[i].poll()).collect();
    if !waiting.is_empty() && rng.chance(60) {
        hooks[waiting[rng.below(waiting.len() as u64) as usize]].kill();
    }
    let hung = wait_all(&mut hooks, Duration::from_secs(30));
    assert!(hung.is_empty(), "hooks still running after 30 s: {hung:?}");
    let mut problems: Vec<String> = hooks
        .iter()
        .filter(|h| !h.killed && !h.succeeded())
        .filter_map(|h| h.refusal_problem().map(|p| format!("{}: {p}", h.id)))
        .collect();
    for mut gc in gcs {
        if !gc.wait().unwrap().success() {
            problems.push("a gc racing the hooks failed".into());
        }
    }
    rig.gc();
    let live: BTreeSet<i32> = boxes
        .iter()
        .filter(|b| !b.is_dead())
        .map(|b| b.pid)
        .collect();
    problems.extend(after_gc_problems(rig, &live));
    // No gc, racing or after, takes the GPUs of a container that runs.
    let records = holder_ids(&rig.status());
    for (h, b) in hooks.iter().zip(&boxes) {
        if h.succeeded() && !h.killed && !b.is_dead() && !records.contains(&h.id) {
            problems.push(format!("{} runs, but its GPUs were released", h.id));
        }
    }
    problems
}

/// What a kill round does to the racing hooks.
enum Blow {
    KillHook(usize),
    KillContainer(usize),
    /// Starts a `gpupin gc` amid the hooks.
    Gc,
}

/// Rebinds the record of `id` to `pid` started at `start_time`, as if the holder's
/// process had died and its pid been reused.
fn rebind_record(rig: &Rig, id: &str, pid: i32, start_time: u64) {
    edit_record(rig, id, id, |r| {
        r["pid"] = pid.into();
        r["start_time"] = start_time.into();
    });
}

/// Allocates `count` GPUs for a fresh holder through the prestart hook.
fn allocate(rig: &Rig, name: &str, count: u32, c: &FakeContainer) -> String {
    let id = format!("{}-{name}", rig.prefix);
    let bundle = rig.bundle(&id);
    let state = oci_state(
        &id,
        c.pid,
        &bundle,
        &[("gpupin.count".into(), count.to_string())],
    );
    let out = rig.run(&["hook", "prestart"], &state);
    assert!(out.status.success(), "prestart {id}: {}", text(&out.stderr));
    id
}

#[test]
fn a_record_whose_pid_was_reused_is_reaped_and_a_live_one_is_kept() {
    let test = "pid_reuse";
    if !runnable(test, false) {
        return;
    }
    let rig = Rig::new(test, 2);
    let me = std::process::id() as i32;
    let my_start = gpupin::parts::start_time(me).unwrap();
    let c = rig.container();
    let reused = allocate(&rig, "reused", 4, &c);
    let live = allocate(&rig, "live", 2, &c);
    // The pid now names another process (this test) than the one that started the holder.
    rebind_record(&rig, &reused, me, my_start + 1);
    rebind_record(&rig, &live, me, my_start);
    let status = rig.status();
    let state = |id: &str| {
        status["holders"]
            .as_array()
            .unwrap()
            .iter()
            .find(|h| h["id"] == id)
            .map(|h| h["state"].clone())
    };
    assert_eq!(
        state(&reused),
        Some("gone".into()),
        "status sees through pid reuse"
    );
    assert_eq!(state(&live), Some("running".into()));

    rig.gc();
    assert_eq!(
        holder_ids(&rig.status()),
        BTreeSet::from([live.clone()]),
        "gc reaps the reused pid's record and keeps the live one"
    );
    assert_eq!(audit_count(&rig.state_dir, "reap").get(&reused), Some(&1));

    // Again, reaped by the next allocation this time: 14 GPUs fit only if it is.
    let again = allocate(&rig, "again", 4, &c);
    rebind_record(&rig, &again, me, my_start + 1);
    let big = allocate(&rig, "big", 14, &c);
    assert_eq!(
        holder_ids(&rig.status()),
        BTreeSet::from([live.clone(), big]),
        "allocation reaps the reused pid's record and keeps the live one"
    );
    assert!(lock_is_free(&rig.state_dir));
    assert_eq!(temp_files(&rig.state_dir), Vec::<std::path::PathBuf>::new());
}

/// A system user for the test, removed again when dropped.
struct User {
    name: String,
    uid: u32,
    gid: u32,
}

impl User {
    fn new() -> User {
        // One user per test: tests run in parallel, and one's drop deletes its user.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("gpupin-adv-{}-{n}", std::process::id());
        // A user left by a crashed run of this pid is reused (useradd exits 9), and
        // removed all the same; what useradd said goes into the failure otherwise.
        let out = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
            ])
            .arg(&name)
            .output()
            .unwrap();
        let said = format!("useradd {}: {}", out.status, text(&out.stderr).trim());
        let mut user = User {
            name,
            uid: 0,
            gid: 0,
        };
        let id = |flag: &str| -> u32 {
            let out = Command::new("id")
                .args([flag, &user.name])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "user {} does not exist ({said})",
                user.name
            );
            text(&out.stdout).trim().parse().unwrap()
        };
        (user.uid, user.gid) = (id("-u"), id("-g"));
        assert_ne!(user.uid, 0, "{} must not be root", user.name);
        user
    }

    /// `gpupin ARGS` as this user (no supplementary groups), `input` on stdin.
    fn gpupin(
        &self,
        exe: &Path,
        config: &Path,
        args: &[&str],
        input: &str,
    ) -> std::process::Output {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .arg("--clear-groups")
            .arg(exe)
            .arg("--config")
            .arg(config)
            .args(args);
        adversarial_support::run_with_input(&mut cmd, input)
    }

    /// `sh -c SCRIPT` as this user; whether it succeeded.
    fn sh(&self, script: &str) -> bool {
        Command::new("setpriv")
            .arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--clear-groups", "sh", "-c", script])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
    }
}

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

#[test]
fn an_unprivileged_user_reads_roots_ledger_but_cannot_change_it() {
    use std::os::unix::fs::PermissionsExt;
    let test = "unprivileged_user";
    if !runnable(test, true) {
        return;
    }
    let rig = Rig::new(test, 2);
    // The user must reach the config, the bundles and the binary, as on a real host.
    for dir in [rig.dir.path(), &rig.dir.path().join("bundles")] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let exe = rig.dir.path().join("gpupin");
    std::fs::copy(adversarial_support::GPUPIN, &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = rig.container();
    let held = allocate(&rig, "held", 2, &c);
    // A waiting request creates the queue directory.
    let waited = format!("{}-waited", rig.prefix);
    let waited_bundle = rig.bundle(&waited);
    let annotations = [
        ("gpupin.count".to_string(), "1".to_string()),
        ("gpupin.wait".to_string(), "5s".to_string()),
    ];
    let out = rig.run(
        &["hook", "prestart"],
        &oci_state(&waited, c.pid, &waited_bundle, &annotations),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        rig.state_dir.join("queue").is_dir(),
        "a waiting request made queue/"
    );

    let user = User::new();
    let before = snapshot(&rig.state_dir);
    let out = user.gpupin(&exe, &rig.config, &["status", "--json"], "");
    assert!(
        out.status.success(),
        "status as a user: {}",
        text(&out.stderr)
    );
    assert_eq!(snapshot(&rig.state_dir), before, "status as a user wrote");
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        holder_ids(&status),
        BTreeSet::from([held.clone(), waited.clone()])
    );

    let bundle = rig.bundle(&format!("{}-mine", rig.prefix));
    let mine = oci_state(
        &format!("{}-mine", rig.prefix),
        c.pid,
        &bundle,
        &[("gpupin.count".into(), "1".into())],
    );
    let theirs = oci_state(
        &held,
        c.pid,
        &rig.dir.path().join("bundles").join(&held),
        &[("gpupin.count".into(), "2".into())],
    );
    let attempts: [(&str, Vec<&str>, &str); 5] = [
        ("gc", vec!["gc"], ""),
        ("release", vec!["release", &held], ""),
        ("prestart", vec!["hook", "prestart"], &mine),
        (
            "poststop of root's holder",
            vec!["hook", "poststop"],
            &theirs,
        ),
        ("poststop", vec!["hook", "poststop"], &mine),
    ];
    let mut problems = Vec::new();
    for (what, args, input) in attempts {
        let out = user.gpupin(&exe, &rig.config, &args, input);
        eprintln!("{test}: {what}: {:?}", text(&out.stderr));
        if let Some(p) = output_refusal_problem(&out) {
            problems.push(format!("{what} as a user: {p}"));
        }
        if snapshot(&rig.state_dir) != before {
            problems.push(format!("{what} as a user changed the ledger"));
        }
    }
    // Whoever can open the lock can hold it and stall every container start.
    let lock = rig.state_dir.join("lock");
    if user.sh(&format!("exec 3< '{}'", lock.display())) {
        problems.push("the user can open the ledger lock".into());
    }
    for dir in ["holders", "queue", "."] {
        let target = rig.state_dir.join(dir).join("planted.json");
        let script = format!("echo '{{}}' > '{}'", target.display());
        if user.sh(&script) || target.exists() {
            problems.push(format!("the user created {}", target.display()));
        }
    }
    fail_if(&problems, "a user against root's ledger");
    assert_eq!(
        snapshot(&rig.state_dir),
        before,
        "the ledger is byte-identical"
    );
}

#[test]
fn state_files_stay_unwritable_by_others_under_umask_000() {
    let test = "umask_000";
    if !runnable(test, false) {
        return;
    }
    let rig = Rig::new(test, 2);
    let c = rig.container();
    let gpupin_under_umask = |stage: &str, id: &str, annotations: &[(String, String)]| {
        let bundle = rig.bundle(id);
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("umask 000; exec \"$0\" --config \"$1\" hook \"$2\"")
            .arg(adversarial_support::GPUPIN)
            .arg(&rig.config)
            .arg(stage);
        let out = adversarial_support::run_with_input(
            &mut cmd,
            &oci_state(id, c.pid, &bundle, annotations),
        );
        assert!(out.status.success(), "{stage} {id}: {}", text(&out.stderr));
    };
    let pair = |k: &str, v: &str| (k.to_string(), v.to_string());
    let first = format!("{}-first", rig.prefix);
    let waiting = format!("{}-waiting", rig.prefix);
    gpupin_under_umask("prestart", &first, &[pair("gpupin.count", "2")]);
    gpupin_under_umask(
        "prestart",
        &waiting,
        &[pair("gpupin.count", "1"), pair("gpupin.wait", "5s")],
    );
    gpupin_under_umask("poststop", &first, &[pair("gpupin.count", "2")]);
    assert!(rig.state_dir.join("queue").is_dir());
    assert!(rig.state_dir.join("audit.log").is_file());
    let mut bad = unsafe_modes(&rig.state_dir);
    bad.sort();
    assert_eq!(
        bad,
        Vec::<String>::new(),
        "directories must be 0755 and files not writable by group or others"
    );
}

/// Rewrites the record file of `id` through `edit`, atomically, mode 0644.
fn edit_record(rig: &Rig, id: &str, new_id: &str, edit: impl Fn(&mut serde_json::Value)) {
    use std::os::unix::fs::PermissionsExt;
    let holders = rig.state_dir.join("holders");
    let mut record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(holders.join(format!("{id}.json"))).unwrap())
            .unwrap();
    record["id"] = new_id.into();
    edit(&mut record);
    let tmp = rig.dir.path().join("record.tmp");
    std::fs::write(&tmp, record.to_string()).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::rename(&tmp, holders.join(format!("{new_id}.json"))).unwrap();
}

/// The checks the other tests rely on must be able to fail: a ledger broken by hand
/// trips each of them.
#[test]
fn the_ledger_checks_catch_what_they_look_for() {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let test = "checks";
    if !runnable(test, false) {
        return;
    }
    let rig = Rig::new(test, 2);
    let c = rig.container();
    let first = allocate(&rig, "first", 2, &c);
    let violations =
        |max_shared| holder_violations(&rig.status(), max_shared, |i| rig.live_free(i));
    assert_eq!(violations(2), Vec::<String>::new());
    assert!(lock_is_free(&rig.state_dir) && temp_files(&rig.state_dir).is_empty());

    let twin = format!("{first}-twin");
    edit_record(&rig, &first, &twin, |_| {});
    let found = violations(2);
    assert!(
        found
            .iter()
            .any(|v| v.contains("held exclusively and by others")),
        "{found:?}"
    );

    let shared = |r: &mut serde_json::Value| {
        r["mode"] = "shared".into();
        r["request"]["share"] = "shared".into();
        r["request"]["reserve"] = (20u64 << 30).into();
        r["request"]["memory"] = (31u64 << 30).into();
    };
    edit_record(&rig, &first, &first, shared);
    edit_record(&rig, &twin, &twin, shared);
    let found = violations(1);
    for what in ["limit 1", "bytes reserved", "which asked for"] {
        assert!(found.iter().any(|v| v.contains(what)), "{what}: {found:?}");
    }

    std::fs::write(rig.state_dir.join("holders/.x.json.tmp"), "{").unwrap();
    std::fs::create_dir_all(rig.state_dir.join("queue")).unwrap();
    std::fs::write(
        rig.state_dir.join("queue/00000000000000000001-gone.json"),
        "{}",
    )
    .unwrap();
    assert_eq!(temp_files(&rig.state_dir).len(), 1);
    assert_eq!(queue_tickets(&rig.state_dir).len(), 1);
    let lock = rustix::fs::open(
        rig.state_dir.join("lock"),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    rustix::fs::flock(&lock, FlockOperation::LockExclusive).unwrap();
    assert!(!lock_is_free(&rig.state_dir), "a held lock is seen as held");
    drop(lock);
    assert!(lock_is_free(&rig.state_dir));

    assert_eq!(refusal_problem(Some(1), "gpupin: no GPUs\n"), None);
    for (code, stderr) in [
        (Some(1), "gpupin: a\nb\n"),
        (Some(1), "no prefix\n"),
        (Some(1), ""),
        (Some(101), "gpupin: panicked\n"),
        (None, "gpupin: killed\n"),
    ] {
        assert!(
            refusal_problem(code, stderr).is_some(),
            "{code:?} {stderr:?}"
        );
    }
}

#[test]
fn retried_prestarts_of_one_container_racing_each_other_get_one_allocation() {
    let test = "retried_prestarts";
    if !runnable(test, false) {
        return;
    }
    raise_fd_limit();
    let (containers_n, tries) = (10, 4);
    let rig = Rig::new(test, 2);
    let boxes = containers(&rig, containers_n);
    let ids: Vec<String> = (0..containers_n).map(|i| container_id(&rig, i)).collect();
    let bundles: Vec<PathBuf> = ids.iter().map(|id| rig.bundle(id)).collect();
    let count = [("gpupin.count".to_string(), "1".to_string())];
    // Every try of every container, interleaved, released together.
    let mut hooks: Vec<Hook> = (0..tries)
        .flat_map(|_| 0..containers_n)
        .map(|i| {
            let state = oci_state(&ids[i], boxes[i].pid, &bundles[i], &count);
            Hook::spawn(&rig, "prestart", &ids[i], state)
        })
        .collect();
    run_together(&mut hooks, "retried prestarts");
    let mut problems: Vec<String> = hooks
        .iter()
        .filter(|h| !h.succeeded())
        .map(|h| format!("{}: {:?} {:?}", h.id, h.status, h.stderr()))
        .collect();
    let status = rig.status();
    let all: BTreeSet<String> = ids.iter().cloned().collect();
    problems.extend(ledger_problems(&rig, &status, &all));
    problems.extend(audit_problems(&rig, "allocate", &once(&all)));
    let held = holdings(&status);
    let minors = rig.minors();
    for (i, id) in ids.iter().enumerate() {
        if let Some(gpus) = held.get(id) {
            problems.extend(container_problems(
                id,
                &boxes[i],
                gpus,
                &minors,
                &bundles[i],
            ));
        }
    }
    fail_if(&problems, "retried prestarts");
}

#[test]
fn a_state_dir_a_local_user_got_to_first_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let test = "planted_state_dir";
    if !runnable(test, true) {
        return;
    }
    let rig = Rig::new(test, 2);
    // A world-writable sticky parent, like /tmp: a user can create the state dir first.
    let public = rig.dir.path().join("public");
    std::fs::create_dir(&public).unwrap();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(rig.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let user = User::new();
    let c = rig.container();
    let mut problems = Vec::new();
    let plants = [
        (
            "a symlink to the user's dir",
            "mkdir \"$0-target\" && ln -s \"$0-target\" \"$0\"",
        ),
        ("a dir the user owns", "mkdir -m 755 \"$0\""),
        ("a world-writable dir", "mkdir \"$0\" && chmod 777 \"$0\""),
    ];
    for (n, (how, script)) in plants.into_iter().enumerate() {
        let state_dir = public.join(format!("state-{n}"));
        let planted = format!("{script}; exit $?");
        assert!(
            user.sh(&format!("sh -c '{planted}' '{}'", state_dir.display())),
            "{how}: the user could not plant it"
        );
        let config = rig.config_with_state_dir(&format!("planted-{n}.toml"), &state_dir);
        let id = format!("{}-planted{n}", rig.prefix);
        let bundle = rig.bundle(&id);
        let state = oci_state(&id, c.pid, &bundle, &[("gpupin.count".into(), "1".into())]);
        let before = snapshot(&public);
        for (what, args, input) in [
            ("prestart", vec!["hook", "prestart"], state.as_str()),
            ("gc", vec!["gc"], ""),
            ("release", vec!["release", id.as_str()], ""),
        ] {
            let mut cmd = Command::new(adversarial_support::GPUPIN);
            cmd.arg("--config").arg(&config).args(&args);
            let out = adversarial_support::run_with_input(&mut cmd, input);
            eprintln!("{test}: {how}: {what}: {:?}", text(&out.stderr));
            if let Some(p) = output_refusal_problem(&out) {
                problems.push(format!("{how}: {what}: {p}"));
            }
        }
        if snapshot(&public) != before {
            problems.push(format!("{how}: gpupin wrote into it"));
        }
    }
    if c.dev_entries().iter().any(|e| e.starts_with("nvidia")) {
        problems.push(format!("the container got nodes: {:?}", c.dev_entries()));
    }
    fail_if(&problems, "state dirs a user planted");
}
