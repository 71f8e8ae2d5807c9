//! The queue under a hostile user (issue 19): a waiter held back by its own limit is in
//! no one's way, a waiter whose caller went away leaves, and one user's tickets are few.

use super::tests::{id, ledger};
use super::tests_jobs::{container, count, devices, job};
use super::*;
use crate::base::message::one_line;
use crate::input::config::PolicyName;
use crate::model::limits::Limits;
use crate::policy::testing::machine;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// A flag a waiter polls as its caller's connection; clear it to hang up.
fn caller(meta: &mut HolderMeta) -> Arc<AtomicBool> {
    let open = Arc::new(AtomicBool::new(true));
    let seen = Arc::clone(&open);
    meta.still_wanted = Some(StillWanted(Arc::new(move || seen.load(Ordering::SeqCst))));
    open
}

/// Tickets in the queue (not the temp files they are written through).
fn tickets(l: &Ledger) -> usize {
    l.dir().join("queue").read_dir().map_or(0, |d| {
        d.filter_map(Result::ok)
            .filter(|e| !e.file_name().as_encoded_bytes().starts_with(b"."))
            .count()
    })
}

#[track_caller]
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < Duration::from_secs(30), "gave up: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A waiter for `n` GPUs in a thread of its own, on the ledger at `dir`.
fn wait_in_thread(
    dir: &std::path::Path,
    name: &'static str,
    n: u32,
    meta: HolderMeta,
    limits: &Limits,
    wait: Duration,
) -> std::thread::JoinHandle<Result<Allocation, LedgerError>> {
    request_in_thread(dir, name, count(n), meta, limits, wait)
}

/// A waiter for `request` in a thread of its own, on the ledger at `dir`.
fn request_in_thread(
    dir: &std::path::Path,
    name: &'static str,
    request: GpuRequest,
    meta: HolderMeta,
    limits: &Limits,
    wait: Duration,
) -> std::thread::JoinHandle<Result<Allocation, LedgerError>> {
    let dir = dir.to_path_buf();
    let limits = limits.clone();
    std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
        let inv = machine(4);
        let m = Machine {
            limits: Some(&limits),
            ..Machine::new(&inv, PolicyName::Pack)
        };
        l.allocate_waiting(&id(name), &request, &m, meta, wait)
    })
}

/// `n` GPUs from inside holder `parent`, with its key when one is given.
fn within(parent: &str, n: u32, key: Option<WithinKey>) -> GpuRequest {
    GpuRequest {
        within: Some(parent.into()),
        within_key: key,
        ..count(n)
    }
}

/// Whether the ticket of `holder` is parked, read under the lock as a waiter writes it.
fn parked(l: &Ledger, holder: &str) -> bool {
    let _lock = store::lock(l.dir()).unwrap();
    let tickets = queue::live_tickets(l.dir()).unwrap();
    let ticket = tickets.iter().find(|t| t.id == holder);
    ticket
        .unwrap_or_else(|| panic!("{holder} has no ticket"))
        .parked
}

/// Why `holder` waits, as `gpupin queue` shows it (`-` before its first look).
fn why(l: &Ledger, holder: &str) -> String {
    let waiting = l.waiting().unwrap();
    let w = waiting.iter().find(|w| w.holder == holder);
    let w = w.unwrap_or_else(|| panic!("{holder} does not wait: {waiting:?}"));
    w.reason.as_ref().map_or("-".into(), ToString::to_string)
}

#[test]
fn a_waiter_held_back_by_its_own_limit_blocks_no_one() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(1),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("a1"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    // Alice at her limit queues for one more, for long: her ticket is parked.
    let alice = wait_in_thread(
        l.dir(),
        "a2",
        1,
        job("alice", 1001, &[]),
        &limits,
        Duration::from_secs(60),
    );
    until("alice is queued", || tickets(&l) == 1);
    // Issue 32, item 7: she reads why, not "1 ahead in the queue" with GPUs free.
    until("her wait says why", || why(&l, "a2") == "own limit");
    // A container's hook, which does not wait, is not refused "waiting ahead" with 3
    // GPUs free.
    let got = l.allocate(&id("hook"), &count(1), &m, container());
    assert!(got.is_ok(), "{}", one_line(&got.unwrap_err()));
    // A waiter behind her is served at once, not after her wait.
    let bob = wait_in_thread(
        l.dir(),
        "b1",
        1,
        job("bob", 1002, &[]),
        &limits,
        Duration::from_secs(5),
    );
    let served = bob.join().unwrap();
    assert!(served.is_ok(), "{}", one_line(&served.unwrap_err()));
    // Once her own job ends, she is served in turn.
    l.release(&id("a1")).unwrap();
    let got = alice.join().unwrap().unwrap();
    assert_eq!(got.record.id, "a2");
    assert_eq!(tickets(&l), 0);
}

#[test]
fn a_waiter_whose_caller_hung_up_leaves_the_queue() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("all"), &count(4), &m, container()).unwrap();
    let mut meta = job("alice", 1001, &[]);
    let open = caller(&mut meta);
    let waiter = wait_in_thread(
        l.dir(),
        "w",
        1,
        meta,
        &Limits::default(),
        Duration::from_secs(60),
    );
    until("the waiter is queued", || tickets(&l) == 1);
    // The daemon that waits for her is alive; only her connection closed.
    open.store(false, Ordering::SeqCst);
    let err = waiter.join().unwrap().unwrap_err();
    assert_eq!(
        one_line(&err),
        "stopped waiting for GPUs for w: the caller closed its connection"
    );
    assert_eq!(tickets(&l), 0);
    // Nothing else waits: a request that does not wait is not refused.
    l.release(&id("all")).unwrap();
    l.allocate(&id("next"), &count(1), &m, container()).unwrap();
}

#[test]
fn one_user_has_at_most_max_waiting_per_user_tickets() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_waiting_per_user: Some(2),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("all"), &count(4), &m, container()).unwrap();
    let mut hang_ups = Vec::new();
    let mut waiters = Vec::new();
    let mut queue = |name: &'static str, meta: HolderMeta, n: usize| {
        let mut meta = meta;
        hang_ups.push(caller(&mut meta));
        waiters.push(wait_in_thread(
            l.dir(),
            name,
            1,
            meta,
            &limits,
            Duration::from_secs(60),
        ));
        until(name, || tickets(&l) == n);
    };
    queue("a1", job("alice", 1001, &[]), 1);
    queue("a2", job("alice", 1001, &[]), 2);
    let err = l
        .allocate_waiting(
            &id("a3"),
            &count(1),
            &m,
            job("alice", 1001, &[]),
            Duration::from_secs(60),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot queue a3: alice has 2 requests waiting already; the limit is 2 (limits.max_waiting_per_user)"
    );
    assert_eq!(tickets(&l), 2, "nothing queued after a refusal");
    // Another user, and containers (no user), are not alice's.
    queue("b1", job("bob", 1002, &[]), 3);
    queue("c1", container(), 4);
    for open in &hang_ups {
        open.store(false, Ordering::SeqCst);
    }
    for w in waiters {
        assert!(w.join().unwrap().is_err());
    }
    assert_eq!(tickets(&l), 0);
}

#[test]
fn a_later_waiter_does_not_overtake_one_blocked_by_gpus() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("three"), &count(3), &m, container())
        .unwrap();
    // Two GPUs wanted, one free: it waits, and is not parked (no limit holds it back).
    let limits = Limits::default();
    let mut meta = container();
    let open = caller(&mut meta);
    let big = wait_in_thread(l.dir(), "big", 2, meta, &limits, Duration::from_secs(60));
    until("the big request waits", || tickets(&l) == 1);
    until("it says why", || why(&l, "big") == "too few GPUs free");
    // A later waiter for one GPU reads that one waiter is ahead of it.
    let mut later = container();
    let later_open = caller(&mut later);
    let behind = wait_in_thread(
        l.dir(),
        "behind",
        1,
        later,
        &limits,
        Duration::from_secs(60),
    );
    until("the later waiter says why", || {
        l.waiting().unwrap().iter().any(|w| w.holder == "behind")
            && why(&l, "behind") == "1 ahead of it"
    });
    later_open.store(false, Ordering::SeqCst);
    assert!(behind.join().unwrap().is_err());
    // One GPU would fit the later request, but the earlier one comes first.
    let err = l
        .allocate_waiting(
            &id("small"),
            &count(1),
            &m,
            container(),
            Duration::from_millis(600),
        )
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::WaitExpired { .. }),
        "{}",
        one_line(&err)
    );
    assert_eq!(l.records().unwrap().len(), 1, "nothing held after the wait");
    open.store(false, Ordering::SeqCst);
    assert!(big.join().unwrap().is_err());
}

#[test]
fn the_ticket_of_a_dead_waiter_blocks_no_one() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("all"), &count(4), &m, container()).unwrap();
    let next = wait_in_thread(
        l.dir(),
        "next",
        1,
        container(),
        &Limits::default(),
        Duration::from_secs(30),
    );
    until("the request waits", || tickets(&l) == 1);
    // A waiter killed while it waited left its ticket, ahead of this one.
    let mut gone = std::process::Command::new("true").spawn().unwrap();
    let dead = gone.id() as i32;
    gone.wait().unwrap();
    let ticket = queue::Ticket {
        seq: 0,
        id: "killed".into(),
        pid: dead,
        start_time: Some(1),
        queued_at: 0,
        uid: None,
        parked: false,
        wants: None,
        turn: 0,
        name: None,
        user: None,
        request: String::new(),
        caller_pid: None,
        reason: None,
    };
    let path = l.dir().join("queue").join(format!("{:020}-killed.json", 0));
    std::fs::write(&path, serde_json::to_vec(&ticket).unwrap()).unwrap();
    l.release(&id("all")).unwrap();
    let got = next.join().unwrap().unwrap();
    assert_eq!(got.record.id, "next");
    assert_eq!(tickets(&l), 0, "the dead waiter's ticket is gone");
}

#[test]
fn each_ticket_sorts_after_every_earlier_one() {
    let (_t, l) = ledger();
    let me = std::process::id() as i32;
    let _lock = store::lock(l.dir()).unwrap();
    // Ids in reverse name order: only the seq can put "b" first.
    let first = queue::enqueue(l.dir(), &id("b"), &count(1), me, &container(), 4, None).unwrap();
    let second = queue::enqueue(l.dir(), &id("a"), &count(1), me, &container(), 4, None).unwrap();
    assert!(second.seq > first.seq, "{} then {}", first.seq, second.seq);
    let order: Vec<String> = queue::live_tickets(l.dir())
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(order, ["b", "a"]);
}

#[test]
fn a_waiter_over_its_limit_is_parked_also_when_no_gpu_is_free() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(1),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("a1"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    l.allocate(&id("rest"), &count(3), &m, container()).unwrap();
    let mut meta = job("alice", 1001, &[]);
    let open = caller(&mut meta);
    let alice = wait_in_thread(l.dir(), "a2", 1, meta, &limits, Duration::from_secs(60));
    until("alice is queued", || tickets(&l) == 1);
    // No GPU is free, but her own limit would refuse her anyway: she is in no one's way,
    // and a request without a wait hears why it cannot have a GPU, not "waiting ahead".
    let err = l
        .allocate(&id("hook"), &count(1), &m, container())
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Decide(DecideError::NotEnoughFree { .. })),
        "{}",
        one_line(&err)
    );
    open.store(false, Ordering::SeqCst);
    assert!(alice.join().unwrap().is_err());
}

/// A request inside the user's own holder takes GPUs they hold already: it cannot take
/// them past their limit, so it is not parked, and a later waiter does not overtake it.
#[test]
fn a_waiter_within_its_users_own_holder_is_not_parked_at_their_limit() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(2),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    // Alice holds 2 GPUs, her limit; one of them is in use by a job of hers inside.
    let alices_hold = HolderMeta {
        kind: HolderKind::Hold,
        until_release: true,
        pid: None,
        ..job("alice", 1001, &[])
    };
    let res = l.allocate(&id("res"), &count(2), &m, alices_hold).unwrap();
    l.allocate(
        &id("j1"),
        &within("res", 1, None),
        &m,
        job("alice", 1001, &[]),
    )
    .unwrap();
    // Another job of hers wants both of the hold's GPUs and waits for j1 to end.
    let mut meta = job("alice", 1001, &[]);
    let alice_open = caller(&mut meta);
    let j2 = request_in_thread(
        l.dir(),
        "j2",
        within("res", 2, None),
        meta,
        &limits,
        Duration::from_secs(60),
    );
    until("j2 is queued", || tickets(&l) == 1);
    assert!(
        !parked(&l, "j2"),
        "j2 is parked, yet it adds nothing to alice's count"
    );
    // A container given the hold's key comes later, for the GPU that is free inside.
    let (_, key) = l.key(&id("res")).unwrap().unwrap();
    let mut meta = container();
    let later_open = caller(&mut meta);
    let later = request_in_thread(
        l.dir(),
        "later",
        within("res", 1, Some(key)),
        meta,
        &limits,
        Duration::from_secs(60),
    );
    until("the later request is queued", || tickets(&l) == 2);
    // j1 ends: j2, first in line, gets both GPUs of the hold.
    l.release(&id("j1")).unwrap();
    let served = j2.join().unwrap();
    alice_open.store(false, Ordering::SeqCst);
    let served = served.unwrap_or_else(|e| panic!("{}", one_line(&e)));
    assert_eq!(served.record.gpus, res.record.gpus);
    later_open.store(false, Ordering::SeqCst);
    let err = later.join().unwrap().unwrap_err();
    assert!(
        matches!(err, LedgerError::CallerGone { .. }),
        "{}",
        one_line(&err)
    );
    let mut held: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
    held.sort();
    assert_eq!(held, ["j2", "res"]);
    assert_eq!(tickets(&l), 0);
}

/// What `gpupin status` and `gpupin metrics` show of the queue: who waits, oldest first.
#[test]
fn the_waiting_requests_are_listed_oldest_first() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("all"), &count(4), &m, container()).unwrap();
    assert_eq!(l.waiting().unwrap(), []);
    let before = record::unix_now();
    let mut hang_ups = Vec::new();
    let mut waiters = Vec::new();
    for (n, name) in ["first", "second"].into_iter().enumerate() {
        let mut meta = container();
        meta.container = Some(crate::model::holder::ContainerInfo {
            engine: Some("docker".into()),
            name: Some(format!("web-{name}")),
            image: None,
        });
        hang_ups.push(caller(&mut meta));
        let limits = Limits::default();
        waiters.push(wait_in_thread(
            l.dir(),
            name,
            1,
            meta,
            &limits,
            Duration::from_secs(60),
        ));
        until(name, || tickets(&l) == n + 1);
    }
    let waiting = l.waiting().unwrap();
    let holders: Vec<&str> = waiting.iter().map(|w| w.holder.as_str()).collect();
    assert_eq!(holders, ["first", "second"]);
    let names: Vec<Option<&str>> = waiting.iter().map(|w| w.name.as_deref()).collect();
    assert_eq!(names, [Some("web-first"), Some("web-second")]);
    assert!(
        waiting.iter().all(|w| w.request == "count=1" && !w.parked),
        "{waiting:?}"
    );
    assert!(waiting.iter().all(|w| w.queued_at >= before), "{waiting:?}");
    for open in &hang_ups {
        open.store(false, Ordering::SeqCst);
    }
    for w in waiters {
        assert!(w.join().unwrap().is_err());
    }
    assert_eq!(l.waiting().unwrap(), []);
}

/// A request over its user's limit by itself never fits, however long it waits: it is
/// refused at once, not after its wait, and leaves no ticket.
#[test]
fn a_request_over_the_limit_by_itself_is_refused_without_waiting() {
    let (_t, l) = ledger();
    let limits = Limits {
        max_gpus_per_user: Some(1),
        ..Limits::default()
    };
    let mut meta = job("alice", 1001, &[]);
    let open = caller(&mut meta);
    let alice = wait_in_thread(l.dir(), "a1", 2, meta, &limits, Duration::from_secs(60));
    let err = alice.join().unwrap().unwrap_err();
    open.store(false, Ordering::SeqCst);
    assert_eq!(
        one_line(&err),
        "alice holds 0 GPUs and alice asks for 2 more; their limit is 1 (limits.max_gpus_per_user)"
    );
    assert_eq!(tickets(&l), 0);
    assert!(l.records().unwrap().is_empty());
}

/// A waiter counts every GPU it asks for against its limit: two more than one free of
/// alice's two is past it, so she is parked though no GPU is free either.
#[test]
fn a_waiter_for_several_gpus_is_parked_when_all_of_them_would_pass_its_limit() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(2),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("a1"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    l.allocate(&id("rest"), &count(3), &m, container()).unwrap();
    let mut meta = job("alice", 1001, &[]);
    let open = caller(&mut meta);
    let alice = wait_in_thread(l.dir(), "a2", 2, meta, &limits, Duration::from_secs(60));
    until("alice is queued", || tickets(&l) == 1);
    assert!(parked(&l, "a2"), "1 held and 2 more is past her limit of 2");
    let err = l
        .allocate(&id("hook"), &count(1), &m, container())
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Decide(DecideError::NotEnoughFree { .. })),
        "{}",
        one_line(&err)
    );
    open.store(false, Ordering::SeqCst);
    assert!(alice.join().unwrap().is_err());
}

/// A holder whose process ended changes no directory: a waiter still looks under the lock
/// now and then, reaps it and takes its GPUs, long before its own wait is over.
#[test]
fn a_waiter_takes_the_gpus_of_a_holder_whose_process_ended() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut process = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let meta = HolderMeta {
        pid: Some(process.id() as i32),
        ..container()
    };
    l.allocate(&id("all"), &count(4), &m, meta).unwrap();
    let mut meta = container();
    let open = caller(&mut meta);
    let next = wait_in_thread(
        l.dir(),
        "next",
        1,
        meta,
        &Limits::default(),
        Duration::from_secs(60),
    );
    until("the request waits", || tickets(&l) == 1);
    // Past the time a fresh change keeps the waiter looking: only its look now and then
    // can see the holder go.
    std::thread::sleep(Duration::from_secs(1));
    process.kill().unwrap();
    process.wait().unwrap();
    let served = next.join().unwrap();
    open.store(false, Ordering::SeqCst);
    let got = served.unwrap_or_else(|e| panic!("{}", one_line(&e)));
    assert_eq!(got.record.id, "next");
    let held: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(held, ["next"]);
}

/// A waiter inside a holder that is released meanwhile can never be served: it hears why
/// at once, not when its wait is over.
#[test]
fn a_waiter_within_a_holder_that_goes_away_is_told_at_once() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let roots_hold = HolderMeta {
        source: "test".into(),
        kind: HolderKind::Hold,
        until_release: true,
        ..HolderMeta::default()
    };
    l.allocate(&id("res"), &count(1), &m, roots_hold).unwrap();
    let roots_job = || HolderMeta {
        kind: HolderKind::Exec,
        ..container()
    };
    l.allocate(&id("j1"), &within("res", 1, None), &m, roots_job())
        .unwrap();
    let mut meta = roots_job();
    let open = caller(&mut meta);
    let j2 = request_in_thread(
        l.dir(),
        "j2",
        within("res", 1, None),
        meta,
        &Limits::default(),
        Duration::from_secs(60),
    );
    until("j2 waits", || tickets(&l) == 1);
    l.release(&id("res")).unwrap();
    let err = j2.join().unwrap().unwrap_err();
    open.store(false, Ordering::SeqCst);
    assert_eq!(
        one_line(&err),
        "cannot allocate for j2: gpupin.within=res names no holder in the ledger"
    );
    assert_eq!(tickets(&l), 0);
}

/// A waiter for one GPU in a thread of its own, on a ledger that serves in `order`.
fn ordered_in_thread(
    dir: &std::path::Path,
    name: &'static str,
    meta: HolderMeta,
    order: QueueOrder,
) -> std::thread::JoinHandle<Result<Allocation, LedgerError>> {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings {
            queue: order,
            ..LedgerSettings::at(&dir)
        })
        .unwrap();
        let inv = machine(4);
        let limits = Limits::default();
        let m = Machine {
            limits: Some(&limits),
            ..Machine::new(&inv, PolicyName::Pack)
        };
        l.allocate_waiting(&id(name), &count(1), &m, meta, Duration::from_secs(60))
    })
}

/// Alice queues three requests, then bob one, then a container (no user): what `waiting`
/// lists (what `gpupin queue` numbers) and who gets each GPU given back, one at a time.
/// Returns (listed, served).
fn alice_three_bob_one(order: QueueOrder) -> (Vec<String>, Vec<String>) {
    let (_t, l) = ledger();
    let l = Ledger::open(&LedgerSettings {
        queue: order,
        ..LedgerSettings::at(l.dir())
    })
    .unwrap();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let holds = ["h0", "h1", "h2", "h3"];
    for h in holds {
        l.allocate(&id(h), &count(1), &m, container()).unwrap();
    }
    let alice = || job("alice", 1001, &[]);
    let bob = || job("bob", 1002, &[]);
    let mut hang_ups = Vec::new();
    let mut waiters = Vec::new();
    let queued: [(&'static str, HolderMeta); 5] = [
        ("a1", alice()),
        ("a2", alice()),
        ("a3", alice()),
        ("b1", bob()),
        ("c1", container()),
    ];
    for (n, (name, meta)) in queued.into_iter().enumerate() {
        let mut meta = meta;
        hang_ups.push(caller(&mut meta));
        waiters.push(ordered_in_thread(l.dir(), name, meta, order));
        until(name, || tickets(&l) == n + 1);
    }
    let listed: Vec<String> = l.waiting().unwrap().into_iter().map(|w| w.holder).collect();
    // A request that does not wait never overtakes them, in either order: not even one of
    // a user with nothing queued, who would be first among the waiters' turns.
    let err = l
        .allocate(&id("carol"), &count(1), &m, job("carol", 1003, &[]))
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::Decide(DecideError::NotEnoughFree { .. })),
        "{err}"
    );
    let mut served = Vec::new();
    for (n, h) in holds.into_iter().enumerate() {
        let holders = |l: &Ledger| -> Vec<String> {
            let mut ids: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
            ids.retain(|i| !holds.contains(&i.as_str()));
            ids
        };
        let before = holders(&l);
        l.release(&id(h)).unwrap();
        until("a waiter is served", || tickets(&l) == 4 - n);
        let after = holders(&l);
        let new: Vec<String> = after.into_iter().filter(|i| !before.contains(i)).collect();
        assert_eq!(
            new.len(),
            1,
            "one GPU given back, one waiter served: {new:?}"
        );
        served.extend(new);
    }
    for open in &hang_ups {
        open.store(false, Ordering::SeqCst);
    }
    for w in waiters {
        let _ = w.join().unwrap();
    }
    (listed, served)
}

#[test]
fn fair_serves_each_users_first_request_before_anyones_second() {
    let (listed, served) = alice_three_bob_one(QueueOrder::Fair);
    assert_eq!(listed, ["a1", "b1", "c1", "a2", "a3"]);
    // Bob's one request is served second, ahead of alice's two that came before it.
    assert_eq!(served, ["a1", "b1", "c1", "a2"]);
}

#[test]
fn fifo_serves_in_arrival_order() {
    let (listed, served) = alice_three_bob_one(QueueOrder::Fifo);
    assert_eq!(listed, ["a1", "a2", "a3", "b1", "c1"]);
    assert_eq!(served, ["a1", "a2", "a3", "b1"]);
}

/// Turns as `enqueue` gives them and a served ticket moves the round on: each user's
/// first waiting request comes before anyone's second, and a user who queues again the
/// moment one request is served never goes ahead of another's older second.
#[test]
fn fair_turns_go_round_the_users_and_starve_no_one() {
    let ticket = |seq: u64, uid: Option<u32>, turn: u64| queue::Ticket {
        seq,
        id: format!("t{seq}"),
        pid: 1,
        start_time: None,
        queued_at: 0,
        uid,
        parked: false,
        wants: None,
        turn,
        name: None,
        user: None,
        request: String::new(),
        caller_pid: None,
        reason: None,
    };
    let (alice, bob, carol) = (Some(1001), Some(1002), Some(1003));
    let mut waiting: Vec<queue::Ticket> = Vec::new();
    let mut round = 0;
    let mut seq = 0;
    let mut queue_for = |waiting: &mut Vec<queue::Ticket>, round: u64, uid: Option<u32>| {
        seq += 1;
        let turn = queue::next_turn(round, waiting, uid);
        waiting.push(ticket(seq, uid, turn));
        seq
    };
    let order = |waiting: &[queue::Ticket]| -> Vec<u64> {
        queue::served_order(waiting.to_vec(), QueueOrder::Fair)
            .into_iter()
            .map(|t| t.seq)
            .collect()
    };
    // Alice's 1, 2, 3; bob's 4; two containers (5, 6: one party, no user); carol's 7.
    for uid in [alice, alice, alice, bob, None, None, carol] {
        queue_for(&mut waiting, round, uid);
    }
    assert_eq!(order(&waiting), [1, 4, 5, 7, 2, 6, 3]);
    assert_eq!(
        queue::served_order(waiting.clone(), QueueOrder::Fifo)
            .iter()
            .map(|t| t.seq)
            .collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6, 7]
    );
    // Serve the head each time; bob queues again each time one of his is served, and
    // still alice's second (2) and third (3) are served in their rounds.
    let mut served = Vec::new();
    for _ in 0..9 {
        let head = queue::served_order(waiting.clone(), QueueOrder::Fair).remove(0);
        waiting.retain(|t| t.seq != head.seq);
        round = round.max(head.turn);
        served.push(head.seq);
        if head.uid == bob {
            queue_for(&mut waiting, round, bob);
        }
    }
    // 8 is bob's second (queued when 4 was served: the second round, after the
    // containers' 6 that came first), 9 his third, in the third round after alice's 3.
    assert_eq!(served, [1, 4, 5, 7, 2, 6, 8, 3, 9]);
}

/// A waiter for `request` on `inv` in a thread of its own; its caller hangs up when the
/// returned flag is cleared.
fn waiter_on(
    l: &Ledger,
    inv: &crate::model::gpu::Inventory,
    name: &'static str,
    request: GpuRequest,
    meta: HolderMeta,
) -> (
    Arc<AtomicBool>,
    std::thread::JoinHandle<Result<Allocation, LedgerError>>,
) {
    let mut meta = meta;
    let open = caller(&mut meta);
    let dir = l.dir().to_path_buf();
    let inv = inv.clone();
    let waiter = std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate_waiting(&id(name), &request, &m, meta, Duration::from_secs(60))
    });
    (open, waiter)
}

/// Issue 31, finding 3: a waiter held back by a busy GPU stayed at the head of the
/// queue, and every other request on the node was refused ("N requests are waiting
/// ahead of it") with GPUs free: alice waiting for a GPU she holds herself, an image's
/// `GPUPIN_DEVICES=3 GPUPIN_WAIT=1h` while GPU 3 is held. A waiter now holds back only a
/// request that would take a GPU it could ever use: for each reason (a named busy
/// device, her own GPU, a model, memory), requests for the other GPUs are served at once,
/// waiting or not; and each waiter still gets its GPU in turn once it is free.
#[test]
fn a_waiter_for_gpus_that_are_not_free_blocks_no_request_for_other_gpus() {
    let (_t, l) = ledger();
    let mut inv = machine(6);
    inv.gpus[3].name = "NVIDIA A100-SXM4-80GB".into();
    inv.gpus[3].memory_bytes = 80 << 30;
    for g in inv.gpus.iter_mut().filter(|g| g.index != 3) {
        g.memory_bytes = 40 << 30;
    }
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("maint"), &devices(&["3"]), &m, container())
        .unwrap();
    l.allocate(&id("alices"), &devices(&["2"]), &m, job("alice", 1001, &[]))
        .unwrap();
    let model = GpuRequest {
        model: Some("A100".into()),
        ..count(1)
    };
    let memory = GpuRequest {
        memory: Some(60 << 30),
        ..count(1)
    };
    let waiters = [
        ("image", devices(&["3"]), container()),
        ("own", devices(&["2"]), job("alice", 1001, &[])),
        ("model", model, job("carol", 1003, &[])),
        ("memory", memory, job("dave", 1004, &[])),
    ];
    let mut queued = Vec::new();
    for (n, (name, request, meta)) in waiters.into_iter().enumerate() {
        queued.push((name, waiter_on(&l, &inv, name, request, meta)));
        until(name, || tickets(&l) == n + 1);
    }
    // Issue 32, item 7: each says that no GPU of its kind is free, not its place.
    for name in ["image", "own", "model", "memory"] {
        until(name, || why(&l, name) == "no free GPU of its kind");
    }
    // GPUs 0, 1, 4 and 5 are free and none of them is one a waiter could use.
    let hook = l.allocate(&id("hook"), &count(1), &m, container());
    assert!(hook.is_ok(), "{}", one_line(&hook.unwrap_err()));
    let bob = l.allocate_waiting(
        &id("bob"),
        &count(2),
        &m,
        job("bob", 1002, &[]),
        Duration::from_secs(60),
    );
    let bob = bob.unwrap_or_else(|e| panic!("{}", one_line(&e)));
    assert_eq!(bob.record.indices.len(), 2);
    assert_eq!(tickets(&l), 4, "the four still wait");
    // A request for a GPU a waiter could use waits behind it: GPU 3, once free, is the
    // image's, first in line, not a later request's.
    l.release(&id("maint")).unwrap();
    let (open, image) = queued.remove(0).1;
    let got = image
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{}", one_line(&e)));
    open.store(false, Ordering::SeqCst);
    assert_eq!(got.record.indices, [3]);
    for (_, (open, waiter)) in queued {
        open.store(false, Ordering::SeqCst);
        let _ = waiter.join().unwrap();
    }
    assert_eq!(tickets(&l), 0);
}

/// Issue 32, item 7: a waiter held back by its group's limit says which group, is parked
/// (in no one's way), and a request of another user is served at once.
#[test]
fn a_waiter_held_back_by_its_groups_limit_says_which_group() {
    use crate::model::limits::GroupLimit;
    let (_t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        groups: [(
            "ml".to_string(),
            GroupLimit {
                max_gpus: Some(1),
                gpus: None,
            },
        )]
        .into(),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("b1"), &count(1), &m, job("bob", 1002, &["ml"]))
        .unwrap();
    let mut meta = job("alice", 1001, &["ml"]);
    let open = caller(&mut meta);
    let alice = wait_in_thread(l.dir(), "a1", 1, meta, &limits, Duration::from_secs(60));
    until("alice is queued", || tickets(&l) == 1);
    until("her wait says why", || why(&l, "a1") == "group limit (ml)");
    assert!(parked(&l, "a1"));
    let carol = l.allocate(&id("c1"), &count(1), &m, job("carol", 1003, &[]));
    assert!(carol.is_ok(), "{}", one_line(&carol.unwrap_err()));
    open.store(false, Ordering::SeqCst);
    assert!(alice.join().unwrap().is_err());
}
