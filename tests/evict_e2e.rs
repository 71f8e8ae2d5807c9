//! Ending work early, end to end with throwaway users against a real `gpupin serve`
//! (issue 31 finding 1, issue 32 items 1-3): a forced release never hands a GPU on while
//! a process of its holder still runs; a user ends their own job with `gpupin evict`,
//! never another's; the evicted job's `gpupin exec` says who ended it and why.

#[allow(dead_code)]
mod exec_support;

use exec_support::{
    Daemon, Job, Sleeper, User, alive, audit, gpupin, holder_ids, ok, queued, refused,
    requirements, until_clean,
};
use gpupin_sandbox::harness;

/// Bob's job runs on GPU 0 (every other GPU is held) and alice's job waits for a GPU.
/// Bob's `release --force` of his running job is refused (before: GPU 0 went to alice's
/// job while bob's still ran on it); bob ends it with `gpupin evict`, and alice's job
/// gets GPU 0 only once bob's process is gone. Bob can neither evict nor force alice's
/// job; root evicts it with a reason, and each evicted `gpupin exec` says who and why.
#[test]
fn a_user_ends_their_own_job_and_a_forced_release_never_shares_a_gpu() {
    let test = "a_user_ends_their_own_job_and_a_forced_release_never_shares_a_gpu";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("eva");
    let bob = User::create("evb");
    let _daemon = Daemon::start(&g);
    ok(
        &g,
        None,
        &[
            "hold",
            "rest",
            "--devices",
            "1,2,3,4,5,6,7",
            "--until-release",
        ],
    );
    let mut bobs = Job::start(&g, Some(&bob), "bobs", &["--count", "1"]);
    let bobs_report = bobs.ready();
    assert_eq!(bobs_report.cuda_indices(), [0]);
    let bobs_holder = bobs.holder();
    let wait = ["--count", "1", "--wait", "120s"];
    let mut alices = Job::start(&g, Some(&alice), "alices", &wait);
    exec_support::until("alice's job waits", || (queued(&g) == 1).then_some(()));

    // The door: a user's forced release of a job that still runs.
    let line = refused(&g, Some(&bob), &["release", "--force", &bobs_holder]);
    assert!(
        line.starts_with("gpupin: only root may release a holder that still runs (")
            && line.ends_with(&format!(
                "end it with gpupin evict {bobs_holder}, which releases its GPUs once it is gone"
            )),
        "{line}"
    );
    // The plain refusal points to evict, never to --force.
    let line = refused(&g, Some(&bob), &["release", &bobs_holder]);
    assert!(
        line.contains(&format!("end it with gpupin evict {bobs_holder}"))
            && !line.contains("--force"),
        "{line}"
    );
    assert!(holder_ids(&g.status()).contains(&bobs_holder));
    assert_eq!(queued(&g), 1, "alice's job still waits");
    assert!(!alices.has_started() && !bobs.has_ended());

    // Bob ends his own job: by the time alice's job runs on GPU 0, his is gone.
    let out = ok(
        &g,
        Some(&bob),
        &["evict", &bobs_holder, "--reason", "wrong input file"],
    );
    assert!(out.starts_with(&format!("evicted {bobs_holder}")), "{out}");
    let alices_report = alices.ready();
    assert_eq!(alices_report.cuda_indices(), [0]);
    assert!(!alive(bobs_report.pid), "bob's job still runs on GPU 0");
    let (exit, stderr) = bobs.wait();
    assert_eq!(exit.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "gpupin: {bobs_holder} was ended by {} (gpupin evict): wrong input file\n",
            bob.name
        )),
        "{stderr}"
    );

    // Alice's job is not bob's to end, by evict or by force.
    let alices_holder = alices.holder();
    let line = refused(&g, Some(&bob), &["evict", &alices_holder]);
    assert_eq!(
        line,
        format!(
            "gpupin: {alices_holder} is {}'s: only {} or root may end it",
            alice.name, alice.name
        )
    );
    let refusals: Vec<_> = audit(&g)
        .into_iter()
        .filter(|e| e["event"] == "refuse" && e["holder"] == alices_holder.as_str())
        .collect();
    assert_eq!(refusals.len(), 1, "bob's try is audited: {refusals:?}");
    assert_eq!(refusals[0]["code"], "not_yours");
    assert_eq!(refusals[0]["user"], bob.name.as_str());
    let line = refused(&g, Some(&bob), &["release", "--force", &alices_holder]);
    assert!(
        line.ends_with(&format!("only {} or root may release it", alice.name)),
        "{line}"
    );
    assert!(alive(alices_report.pid) && !alices.has_ended());

    // A reason with a control character is refused before anything is stopped.
    let line = refused(
        &g,
        None,
        &["evict", &alices_holder, "--reason", "a\x1b[2Jb"],
    );
    assert!(line.starts_with("gpupin: --reason "), "{line}");
    assert!(alive(alices_report.pid));

    // Root ends anyone's, and says why.
    ok(
        &g,
        None,
        &["evict", &alices_holder, "--reason", "node maintenance"],
    );
    let (exit, stderr) = alices.wait();
    assert_eq!(exit.code(), Some(143), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "gpupin: {alices_holder} was ended by root (gpupin evict): node maintenance\n"
        )),
        "{stderr}"
    );
    // By holder: two lines in one second, in two users' logs, have no order between them.
    let evicts: Vec<(String, String)> = audit(&g)
        .into_iter()
        .filter(|e| e["event"] == "evict")
        .map(|e| {
            let field = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (field("holder"), field("reason"))
        })
        .collect();
    assert_eq!(evicts.len(), 2, "{evicts:?}");
    let reason_of = |holder: &str| {
        let found: Vec<&String> = evicts
            .iter()
            .filter(|(h, _)| h == holder)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(found.len(), 1, "{holder}: {evicts:?}");
        found[0].clone()
    };
    let bobs_reason = reason_of(&bobs_holder);
    assert!(
        bobs_reason.starts_with(&format!("gpupin evict by {}: ", bob.name))
            && bobs_reason.ends_with("; reason: wrong input file"),
        "{evicts:?}"
    );
    assert!(
        reason_of(&alices_holder).ends_with("; reason: node maintenance"),
        "{evicts:?}"
    );
    ok(&g, None, &["release", "rest"]);
    until_clean(&g);
}

/// Root's `release --force` of a job that still runs stops it first, as evict does, and
/// frees its GPU only once it is gone; a user's evict of their hold bound to a process
/// stops the process too (before, only the hold went and the process ran on).
#[test]
fn roots_forced_release_stops_the_holder_first() {
    let test = "roots_forced_release_stops_the_holder_first";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let carl = User::create("evc");
    let _daemon = Daemon::start(&g);
    let mut job = Job::start(&g, Some(&carl), "carls", &["--count", "1"]);
    let report = job.ready();
    let holder = job.holder();
    let out = ok(&g, None, &["release", "--force", &holder]);
    assert!(out.starts_with(&format!("evicted {holder} (")), "{out}");
    assert!(!alive(report.pid), "the job still runs after its release");
    assert!(!holder_ids(&g.status()).contains(&holder));
    let (exit, stderr) = job.wait();
    assert_eq!(exit.code(), Some(143), "{stderr}");

    // A hold bound to a process of carl's: evict stops the process, not only the hold.
    let mut sleeper = Sleeper::start(&carl);
    let pid = sleeper.pid().to_string();
    ok(
        &g,
        Some(&carl),
        &["hold", "pair", "--devices", "2", "--pid", &pid],
    );
    let out = ok(&g, Some(&carl), &["evict", "pair", "--grace", "1s"]);
    assert!(out.starts_with("evicted pair"), "{out}");
    assert!(!alive(sleeper.pid()), "the hold's process still runs");
    sleeper.stop();
    assert!(!holder_ids(&g.status()).contains(&"pair".to_string()));
    until_clean(&g);
}

/// Issue 32 item 2: a queued request is cancelled by the name `gpupin queue` shows, by
/// its owner (`release`) or root (`evict`), never by another user; `gpupin queue` shows
/// the pid that asked, and the waiting `gpupin exec` ends with one line saying who.
#[test]
fn a_queued_request_is_cancelled_by_its_owner_or_root_by_the_queues_name() {
    let test = "a_queued_request_is_cancelled_by_its_owner_or_root_by_the_queues_name";
    if !requirements(test) {
        return;
    }
    let g = gpupin("");
    let alice = User::create("evqa");
    let bob = User::create("evqb");
    let _daemon = Daemon::start(&g);
    ok(
        &g,
        None,
        &[
            "hold",
            "all",
            "--devices",
            "0,1,2,3,4,5,6,7",
            "--until-release",
        ],
    );
    let wait = |name: &'static str| ["--count", "1", "--wait", "120s", "--name", name];
    let mut bobs = Job::start(&g, Some(&bob), "bobq", &wait("bob-q"));
    exec_support::until("bob's request waits", || (queued(&g) == 1).then_some(()));
    let shown = ok(&g, Some(&alice), &["queue"]);
    harness::say(&format!("gpupin queue:\n{shown}"));
    let row = shown
        .lines()
        .find(|l| l.contains("bob-q"))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(
        row.split_whitespace()
            .any(|w| w == bobs.gpupin_pid().to_string()),
        "the pid of bob's gpupin exec: {shown}"
    );

    let line = refused(&g, Some(&alice), &["release", "bob-q"]);
    assert_eq!(
        line,
        format!(
            "gpupin: bob-q is {}'s request: only {} or root may cancel it",
            bob.name, bob.name
        )
    );
    let line = refused(&g, Some(&alice), &["evict", "bob-q"]);
    assert!(line.contains("only "), "{line}");
    assert_eq!(queued(&g), 1, "bob's request still waits");

    let out = ok(&g, Some(&bob), &["release", "bob-q"]);
    assert_eq!(
        out.trim_end(),
        "cancelled bob-q: it no longer waits for GPUs"
    );
    let (exit, stderr) = bobs.wait();
    assert_eq!(exit.code(), Some(1), "{stderr}");
    // Its log may say it waits first (a line once its first look said why, whenever
    // the cancel comes after its progress reader's next look); the last line is why it
    // ended.
    let (last, before) = stderr
        .trim_end()
        .lines()
        .collect::<Vec<_>>()
        .split_last()
        .map(|(l, b)| (l.to_string(), b.to_vec()))
        .unwrap();
    assert_eq!(
        last,
        format!(
            "gpupin: bob-q was cancelled by {} (gpupin release) while it waited for GPUs",
            bob.name
        )
    );
    assert!(
        before
            .iter()
            .all(|l| l.starts_with("gpupin: waiting for count=1 (")),
        "{stderr}"
    );
    assert_eq!(queued(&g), 0);

    let mut alices = Job::start(&g, Some(&alice), "aliceq", &wait("alice-q"));
    exec_support::until("alice's request waits", || (queued(&g) == 1).then_some(()));
    let out = ok(&g, None, &["evict", "alice-q"]);
    assert_eq!(
        out.trim_end(),
        "cancelled alice-q: it no longer waits for GPUs"
    );
    let (exit, stderr) = alices.wait();
    assert_eq!(exit.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("alice-q was cancelled by root (gpupin evict) while it waited"),
        "{stderr}"
    );
    let cancels: Vec<String> = audit(&g)
        .into_iter()
        .filter(|e| e["event"] == "release" && e["holder"] != "all")
        .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        cancels,
        [
            format!("gpupin release by {}: cancelled while it waited", bob.name),
            "gpupin evict by root: cancelled while it waited".to_string()
        ]
    );
    ok(&g, None, &["release", "all"]);
    until_clean(&g);
}
