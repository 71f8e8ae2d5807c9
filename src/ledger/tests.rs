use super::*;
use crate::policy::PolicyName;
use crate::policy::testing::machine;
use crate::request::{Origin, Selection};
use std::collections::HashSet;
use std::time::Duration;

fn request(selection: Selection) -> GpuRequest {
    GpuRequest::new(selection, Origin::Annotations)
}

fn me() -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        ..HolderMeta::default()
    }
}

fn ledger() -> (tempfile::TempDir, Ledger) {
    let tmp = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&tmp.path().join("state")).unwrap();
    (tmp, ledger)
}

fn id(s: &str) -> HolderId {
    HolderId::new(s).unwrap()
}

fn count(n: u32) -> GpuRequest {
    request(Selection::Count(n))
}

fn snapshot(l: &Ledger) -> Vec<Record> {
    l.records().unwrap()
}

#[test]
fn allocates_distinct_gpus_until_none_is_free() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let a = l
        .allocate(
            &id("a"),
            &count(3),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-0", "GPU-test-1", "GPU-test-2"]);
    let before = snapshot(&l);
    let err = l
        .allocate(
            &id("b"),
            &count(2),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot allocate 2 GPUs for b: 3 of 4 GPUs held, 1 free"
    );
    assert_eq!(
        snapshot(&l),
        before,
        "a refused request leaves the ledger untouched"
    );
}

#[test]
fn retried_holder_gets_its_own_gpus_back() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let first = l
        .allocate(
            &id("a"),
            &count(2),
            &Machine::new(&inv, PolicyName::Spread),
            me(),
        )
        .unwrap();
    let again = l
        .allocate(
            &id("a"),
            &count(2),
            &Machine::new(&inv, PolicyName::Spread),
            me(),
        )
        .unwrap();
    assert_eq!(first.record.gpus, again.record.gpus);
    assert_eq!(snapshot(&l).len(), 1);
}

#[test]
fn release_frees_and_is_idempotent() {
    let (_t, l) = ledger();
    let inv = machine(2);
    l.allocate(
        &id("a"),
        &count(2),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    assert!(l.release(&id("a")).unwrap().is_some());
    assert!(l.release(&id("a")).unwrap().is_none());
    assert!(
        l.allocate(
            &id("b"),
            &count(2),
            &Machine::new(&inv, PolicyName::Pack),
            me()
        )
        .is_ok()
    );
}

#[test]
fn dead_holders_are_reaped_at_allocation_and_by_gc() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    let dead = HolderMeta {
        pid: Some(pid),
        ..me()
    };
    // Record while the child may still run; then make sure it is gone.
    l.allocate(
        &id("dead"),
        &count(2),
        &Machine::new(&inv, PolicyName::Pack),
        dead,
    )
    .unwrap();
    child.wait().unwrap();
    let got = l
        .allocate(
            &id("b"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap();
    assert_eq!(got.record.gpus.len(), 1);
    assert_eq!(
        snapshot(&l)
            .iter()
            .map(|r| r.id.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );

    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = HolderMeta {
        pid: Some(child.id() as i32),
        ..me()
    };
    l.allocate(
        &id("dead2"),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        dead,
    )
    .unwrap();
    child.wait().unwrap();
    let reaped = l.gc().unwrap();
    assert_eq!(
        reaped.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["dead2"]
    );
    assert_eq!(snapshot(&l).len(), 1);
}

#[test]
fn pid_reuse_is_detected_by_start_time() {
    let (_t, l) = ledger();
    let inv = machine(1);
    l.allocate(
        &id("a"),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    let path = l.dir().join("holders/a.json");
    let mut rec: Record = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    rec.start_time = rec.start_time.map(|t| t + 1);
    std::fs::write(&path, serde_json::to_string(&rec).unwrap()).unwrap();
    assert_eq!(l.gc().unwrap().len(), 1);
}

#[test]
fn explicit_devices_are_checked_against_holders() {
    let (_t, l) = ledger();
    let inv = machine(4);
    l.allocate(
        &id("a"),
        &request(Selection::Devices(vec!["2".into()])),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    let err = l
        .allocate(
            &id("b"),
            &request(Selection::Devices(vec!["GPU-test-2".into()])),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GPU 2 (GPU-test-2)") && err.contains("is held by a"),
        "{err}"
    );
    let ok = l
        .allocate(
            &id("b"),
            &request(Selection::Devices(vec!["3".into()])),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap();
    assert_eq!(ok.record.gpus, ["GPU-test-3"]);
    let err = l
        .allocate(
            &id("c"),
            &request(Selection::Devices(vec!["7".into()])),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown GPU \"7\"") && err.contains("0,1,2,3"),
        "{err}"
    );
}

#[test]
fn count_beyond_machine_and_all_on_busy_machine_are_refused() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let err = l
        .allocate(
            &id("a"),
            &count(99),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "count 99 is more than the 8 GPUs of this machine"
    );
    l.allocate(
        &id("b"),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    let err = l
        .allocate(
            &id("c"),
            &request(Selection::All),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("1 of 8 GPUs held"), "{err}");
}

#[test]
fn spread_rotates_across_allocations() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let mut seen = Vec::new();
    for name in ["a", "b", "c"] {
        let a = l
            .allocate(
                &id(name),
                &count(1),
                &Machine::new(&inv, PolicyName::Spread),
                me(),
            )
            .unwrap();
        seen.push(a.record.gpus[0].clone());
        l.release(&id(name)).unwrap();
    }
    assert_eq!(seen, ["GPU-test-0", "GPU-test-1", "GPU-test-2"]);
}

#[test]
fn corrupt_record_fails_closed_and_can_be_released() {
    let (_t, l) = ledger();
    let inv = machine(2);
    std::fs::create_dir_all(l.dir().join("holders")).unwrap();
    std::fs::write(l.dir().join("holders/x.json"), "{not json").unwrap();
    let err = l
        .allocate(
            &id("a"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err();
    assert!(err.to_string().contains("corrupt ledger record"), "{err}");
    l.release(&id("x")).unwrap();
    assert!(
        l.allocate(
            &id("a"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            me()
        )
        .is_ok()
    );
}

#[test]
fn unsafe_state_dirs_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = Ledger::open(&open).err().unwrap().to_string();
    assert!(err.contains("writable by group or others"), "{err}");
    let link = tmp.path().join("link");
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = Ledger::open(&link).err().unwrap().to_string();
    assert!(err.contains("symlink"), "{err}");
}

#[test]
fn concurrent_allocations_never_share_a_gpu() {
    let (_t, l) = ledger();
    let dir = l.dir().to_path_buf();
    let handles: Vec<_> = (0..16)
        .map(|i| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let l = Ledger::open(&dir).unwrap();
                l.allocate(
                    &id(&format!("c{i}")),
                    &count(1),
                    &Machine::new(&machine(8), PolicyName::Pack),
                    me(),
                )
                .ok()
                .map(|a| a.record.gpus[0].clone())
            })
        })
        .collect();
    let got: Vec<String> = handles
        .into_iter()
        .filter_map(|h| h.join().unwrap())
        .collect();
    assert_eq!(got.len(), 8);
    assert_eq!(got.iter().collect::<HashSet<_>>().len(), 8);
}

#[test]
fn unbound_holder_is_stale_after_the_grace_period() {
    let (_t, l) = ledger();
    let inv = machine(1);
    let unbound = HolderMeta { pid: None, ..me() };
    let a = l
        .allocate(
            &id("a"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            unbound,
        )
        .unwrap();
    let now = SystemTime::now();
    assert!(!a.record.is_stale(now, UNBOUND_GRACE));
    assert!(a.record.is_stale(
        now + UNBOUND_GRACE + std::time::Duration::from_secs(1),
        UNBOUND_GRACE
    ));
}

fn shared(reserve: Option<u64>) -> GpuRequest {
    let mut r = count(1);
    r.share = crate::request::Share::Shared;
    r.reserve = reserve;
    r
}

#[test]
fn shared_holders_coexist_up_to_the_limit_and_exclusive_ones_skip_them() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let m = Machine {
        max_shared: 2,
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let a = l.allocate(&id("s1"), &shared(None), &m, me()).unwrap();
    let b = l.allocate(&id("s2"), &shared(None), &m, me()).unwrap();
    assert_eq!(
        a.record.gpus, b.record.gpus,
        "shared holders pack onto one GPU"
    );
    assert_eq!(a.record.mode, Mode::Shared);
    let c = l.allocate(&id("s3"), &shared(None), &m, me()).unwrap();
    assert_ne!(
        c.record.gpus, a.record.gpus,
        "the limit of 2 per GPU moves the third on"
    );
    let err = l
        .allocate(&id("x"), &count(1), &m, me())
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 of 2 GPUs held"), "{err}");
}

#[test]
fn reservations_never_exceed_a_gpus_memory() {
    let (_t, l) = ledger();
    let inv = machine(1); // 80GiB
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a"), &shared(Some(50 << 30)), &m, me())
        .unwrap();
    l.allocate(&id("b"), &shared(Some(30 << 30)), &m, me())
        .unwrap();
    let before = snapshot(&l);
    let err = l
        .allocate(&id("c"), &shared(Some(1 << 30)), &m, me())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("0 can take shared (at most 4 per GPU, reserving 1GiB)"),
        "{err}"
    );
    assert_eq!(snapshot(&l), before);
}

#[test]
fn shared_request_skips_exclusively_held_gpus() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("ex"), &count(1), &m, me()).unwrap();
    let s = l.allocate(&id("sh"), &shared(None), &m, me()).unwrap();
    assert_eq!(s.record.gpus, ["GPU-test-1"]);
}

#[test]
fn model_and_memory_filters_narrow_the_choice() {
    let (_t, l) = ledger();
    let mut inv = machine(3);
    inv.gpus[1].name = "NVIDIA A100-SXM4-40GB".into();
    inv.gpus[1].memory_bytes = 40 << 30;
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut r = count(1);
    r.model = Some("a100".into());
    assert_eq!(
        l.allocate(&id("a"), &r, &m, me()).unwrap().record.gpus,
        ["GPU-test-1"]
    );
    let mut r = count(2);
    r.memory = Some(60 << 30);
    assert_eq!(
        l.allocate(&id("b"), &r, &m, me()).unwrap().record.gpus,
        ["GPU-test-0", "GPU-test-2"]
    );
    let mut r = count(1);
    r.model = Some("H100".into());
    let err = l.allocate(&id("c"), &r, &m, me()).unwrap_err().to_string();
    assert!(
        err.ends_with("0 free; 0 can take gpupin.model=H100"),
        "{err}"
    );
}

#[test]
fn memory_filter_uses_free_memory_when_live_figures_are_on() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let live = [
        crate::inventory::Live {
            utilization: 0,
            memory_free: 10 << 30,
        },
        crate::inventory::Live {
            utilization: 0,
            memory_free: 70 << 30,
        },
    ];
    let m = Machine {
        live: Some(&live),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let mut r = count(1);
    r.memory = Some(40 << 30);
    assert_eq!(
        l.allocate(&id("a"), &r, &m, me()).unwrap().record.gpus,
        ["GPU-test-1"]
    );
}

#[test]
fn a_waiting_request_gets_the_gpu_when_it_is_released() {
    let (_t, l) = ledger();
    let dir = l.dir().to_path_buf();
    let inv = machine(1);
    l.allocate(
        &id("first"),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    let waiter = std::thread::spawn(move || {
        let l = Ledger::open(&dir).unwrap();
        let inv = machine(1);
        let m = Machine::new(&inv, PolicyName::Pack);
        l.allocate_waiting(&id("second"), &count(1), &m, me(), Duration::from_secs(20))
    });
    // The waiter is queued: a request that does not wait may not overtake it.
    while !l
        .dir()
        .join("queue")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some())
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = l
        .allocate(
            &id("third"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            me(),
        )
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::QueueAhead { waiting: 1, .. }),
        "{err}"
    );
    l.release(&id("first")).unwrap();
    let got = waiter.join().unwrap().unwrap();
    assert_eq!(got.record.gpus, ["GPU-test-0"]);
    assert_eq!(l.dir().join("queue").read_dir().unwrap().count(), 0);
}

#[test]
fn an_expired_wait_fails_clearly_and_leaves_nothing_behind() {
    let (_t, l) = ledger();
    let inv = machine(1);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("holder"), &count(1), &m, me()).unwrap();
    let before = snapshot(&l);
    let err = l
        .allocate_waiting(&id("late"), &count(1), &m, me(), Duration::from_millis(300))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("gave up waiting for GPUs for late after 300ms: cannot allocate"),
        "{err}"
    );
    assert_eq!(snapshot(&l), before);
    assert_eq!(l.dir().join("queue").read_dir().unwrap().count(), 0);
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let (_t, l) = ledger();
    let dir = l.dir().to_path_buf();
    let inv = machine(1);
    l.allocate(
        &id("holder"),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
    .unwrap();
    let spawn_waiter = |name: &'static str| {
        let dir = dir.clone();
        std::thread::spawn(move || {
            let l = Ledger::open(&dir).unwrap();
            let inv = machine(1);
            let m = Machine::new(&inv, PolicyName::Pack);
            let a = l.allocate_waiting(&id(name), &count(1), &m, me(), Duration::from_secs(20));
            let order = std::time::Instant::now();
            std::thread::sleep(Duration::from_millis(300));
            l.release(&id(name)).unwrap();
            (a.is_ok(), order)
        })
    };
    let queued = |n: usize| dir.join("queue").read_dir().is_ok_and(|d| d.count() == n);
    let early = spawn_waiter("early");
    while !queued(1) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let late = spawn_waiter("late");
    while !queued(2) {
        std::thread::sleep(Duration::from_millis(20));
    }
    l.release(&id("holder")).unwrap();
    let (early_ok, early_at) = early.join().unwrap();
    let (late_ok, late_at) = late.join().unwrap();
    assert!(early_ok && late_ok);
    assert!(early_at < late_at, "the earlier waiter was served first");
}
