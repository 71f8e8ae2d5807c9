use super::*;
use crate::base::message::one_line;
use crate::input::config::{DEFAULT_CLAIM_GRACE, PolicyName};
use crate::input::request::{Origin, Selection};
use crate::policy::testing::machine;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;
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

pub(super) fn ledger() -> (tempfile::TempDir, Ledger) {
    let tmp = tempfile::tempdir().unwrap();
    let ledger = Ledger::open(&LedgerSettings::at(&tmp.path().join("state"))).unwrap();
    (tmp, ledger)
}

pub(super) fn id(s: &str) -> HolderId {
    HolderId::new(s).unwrap()
}

fn count(n: u32) -> GpuRequest {
    request(Selection::Count(n))
}

fn snapshot(l: &Ledger) -> Vec<Record> {
    l.records().unwrap()
}

#[test]
fn a_refusal_names_the_container_as_its_engine_named_it() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let machine = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a"), &count(2), &machine, me()).unwrap();
    let named = |name: &str| HolderMeta {
        container: Some(crate::model::holder::ContainerInfo {
            engine: Some("podman".into()),
            name: Some(name.into()),
            image: None,
        }),
        ..me()
    };
    let err = l
        .allocate(&id("claim-3f0c1d2e"), &count(1), &machine, named("mybox"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot allocate 1 GPU for mybox: 2 of 2"),
        "{err}"
    );
    let exact = request(Selection::Devices(vec!["0".into()]));
    let err = l
        .allocate(&id("claim-3f0c1d2e"), &exact, &machine, named("mybox"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot allocate GPU 0 (GPU-test-0) for mybox: it is held by a"),
        "{err}"
    );
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
        "cannot allocate 2 GPUs for b: 3 of 4 GPUs held, 1 free; add gpupin.wait=10m to wait until they free up"
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
    let reaped = l.gc().unwrap().released;
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
    assert_eq!(l.gc().unwrap().released.len(), 1);
}

/// Refusals name holders as status shows them: a container by its name, an engine's
/// 64-digit id cut to 12 characters (the issue: Docker refusals said `held by
/// fa77a28418dba1ac...` while status said `pinned`).
#[test]
fn refusals_name_holders_as_status_does() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let web = "fa77a28418dba1ac3f2a1b2c3d4e5f60718293a4b5c6d7e8091a2b3c4d5e6f70";
    let meta = HolderMeta {
        kind: HolderKind::Container,
        container: Some(crate::model::holder::ContainerInfo {
            engine: Some("docker".into()),
            name: Some("pinned".into()),
            image: None,
        }),
        ..me()
    };
    l.allocate(
        &id(web),
        &request(Selection::Devices(vec!["2".into()])),
        &m,
        meta,
    )
    .unwrap();
    let other = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    let err = l
        .allocate(
            &id(other),
            &request(Selection::Devices(vec!["2".into()])),
            &m,
            me(),
        )
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot allocate GPU 2 (GPU-test-2) for 0123456789ab: it is held by pinned"
    );
    let err = l
        .allocate(&id(other), &count(4), &m, me())
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("cannot allocate 4 GPUs for 0123456789ab: "),
        "{err}"
    );
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
    let err = Ledger::open(&LedgerSettings::at(&open))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("writable by group or others"), "{err}");
    let link = tmp.path().join("link");
    let real = tmp.path().join("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let err = Ledger::open(&LedgerSettings::at(&link))
        .err()
        .unwrap()
        .to_string();
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
                let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
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
    assert!(!a.record.is_stale(now, DEFAULT_CLAIM_GRACE));
    assert!(a.record.is_stale(
        now + DEFAULT_CLAIM_GRACE + std::time::Duration::from_secs(1),
        DEFAULT_CLAIM_GRACE
    ));
}

fn shared(reserve: Option<u64>) -> GpuRequest {
    let mut r = count(1);
    r.share = crate::input::request::Share::Shared;
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
        err.ends_with(
            "0 free; 0 can take gpupin.model=H100; 3 GPUs are not gpupin.model=H100 (this machine has NVIDIA A100-SXM4-40GB, Test GPU), so no wait helps: ask for something this machine has"
        ),
        "{err}"
    );
}

#[test]
fn memory_filter_uses_free_memory_when_live_figures_are_on() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let live = [
        crate::model::live::Live {
            utilization: Some(0),
            memory_free: 10 << 30,
            ..Default::default()
        },
        crate::model::live::Live {
            utilization: Some(0),
            memory_free: 70 << 30,
            ..Default::default()
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
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
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
    // No GPU is free: it is told so, and to wait (a free one would be the waiter's).
    assert!(
        matches!(
            err,
            LedgerError::Decide(DecideError::NotEnoughFree { held: 1, .. })
        ),
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
            let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
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

// The state dir under attack (issue 8): whoever can plant an entry there must not steer
// root's writes, stall the lock, or block allocation beyond what gc or release clears.

fn alloc(l: &Ledger, name: &str) -> Result<Allocation, LedgerError> {
    let inv = machine(4);
    l.allocate(
        &id(name),
        &count(1),
        &Machine::new(&inv, PolicyName::Pack),
        me(),
    )
}

pub(super) fn mkfifo(path: &Path) {
    use rustix::fs::{FileType, Mode};
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        FileType::Fifo,
        Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

fn a_dead_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

#[test]
fn a_queue_symlink_is_refused_and_its_target_left_alone() {
    let (t, l) = ledger();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("precious"), "keep me").unwrap();
    std::os::unix::fs::symlink(&elsewhere, l.dir().join("queue")).unwrap();
    let err = alloc(&l, "a").unwrap_err().to_string();
    assert!(err.contains("queue") && err.contains("symlink"), "{err}");
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let err = l
        .allocate_waiting(&id("w"), &count(1), &m, me(), Duration::from_secs(1))
        .unwrap_err()
        .to_string();
    assert!(err.contains("queue") && err.contains("symlink"), "{err}");
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("precious")).unwrap(),
        "keep me"
    );
    assert!(snapshot(&l).is_empty(), "nothing is held after a refusal");
}

#[test]
fn subdirectories_are_held_to_the_state_dirs_rules() {
    use std::os::unix::fs::PermissionsExt;
    for sub in ["holders", "queue"] {
        let (_t, l) = ledger();
        let path = l.dir().join(sub);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = alloc(&l, "a").unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "refusing state dir {}: it is writable by group or others",
                path.display()
            )
        );
        if rustix::process::geteuid().is_root() {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::chown(&path, Some(4242), None).unwrap();
            let err = alloc(&l, "a").unwrap_err().to_string();
            assert!(err.ends_with("it is owned by another user"), "{err}");
        }
    }
}

/// The umask is the process's: this test runs itself again in a child with umask 000.
#[test]
fn every_file_and_directory_gets_its_mode_whatever_the_umask() {
    const CHILD: &str = "GPUPIN_TEST_UMASK_000";
    if std::env::var_os(CHILD).is_none() {
        let name = concat!(
            module_path!(),
            "::every_file_and_directory_gets_its_mode_whatever_the_umask"
        );
        let name = name.split_once("::").unwrap().1;
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("1 passed"), "the child ran no test: {text}");
        return;
    }
    rustix::process::umask(rustix::fs::Mode::empty());
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap();
    let ticket = queue::enqueue(
        l.dir(),
        &id("w"),
        &count(1),
        std::process::id() as i32,
        &me(),
        4,
        None,
    )
    .unwrap();
    let d = l.dir();
    for (path, mode) in [
        (d.to_path_buf(), 0o755),
        (d.join("holders"), 0o755),
        (d.join("queue"), 0o755),
        (d.join("holders/a.json"), 0o644),
        (d.join("cursor"), 0o644),
        (d.join("queue-seq"), 0o644),
        (
            d.join("queue").join(format!("{:020}-w.json", ticket.seq)),
            0o644,
        ),
        (d.join("audit.log"), 0o644),
        (d.join("lock"), 0o600),
    ] {
        assert_eq!(mode_of(&path), mode, "{}", path.display());
    }
}

#[test]
fn a_failed_cursor_write_fails_nothing_and_holds_nothing_half() {
    let (_t, l) = ledger();
    // The cursor cannot be written (as on a full disk): a directory stands in its place.
    std::fs::create_dir_all(l.dir().join("cursor/full")).unwrap();
    let got = alloc(&l, "a").unwrap();
    assert_eq!(snapshot(&l), [got.record]);
    let audit = std::fs::read_to_string(l.dir().join("audit.log")).unwrap();
    let line: serde_json::Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    assert_eq!(line["event"], "allocate", "{audit}");
    assert_eq!(line["holder"], "a", "{audit}");
    assert_eq!(line["gpus"][0]["uuid"], "GPU-test-0", "{audit}");
    assert_eq!(line["gpus"][0]["index"], 0, "{audit}");
}

#[test]
fn an_audit_log_symlink_is_not_followed() {
    let (t, l) = ledger();
    let elsewhere = t.path().join("passwd");
    std::fs::write(&elsewhere, "root:x:0:0\n").unwrap();
    std::os::unix::fs::symlink(&elsewhere, l.dir().join("audit.log")).unwrap();
    // audit_failure = "refuse": no allocation without its audit line.
    let mut refuse = crate::input::config::AuditLog::at(l.dir().join("audit.log"));
    refuse.on_failure = crate::input::config::AuditFailure::Refuse;
    let l = Ledger::open(&LedgerSettings {
        audit: refuse,
        ..LedgerSettings::at(l.dir())
    })
    .unwrap();
    let err = one_line(&alloc(&l, "a").unwrap_err());
    assert!(err.contains("audit_failure"), "{err}");
    assert!(
        err.contains(&l.dir().join("audit.log").display().to_string()),
        "{err}"
    );
    assert!(l.records().unwrap().is_empty());
    // "warn", the default: the allocation goes on.
    let log = l.dir().join("audit.log");
    let l = Ledger::open(&LedgerSettings {
        audit: crate::input::config::AuditLog::at(log),
        ..LedgerSettings::at(l.dir())
    })
    .unwrap();
    alloc(&l, "a").unwrap();
    l.release(&id("a")).unwrap();
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "root:x:0:0\n");
    let failures = super::audit_write_failures(l.dir());
    assert_eq!(
        failures, 3,
        "the refused allocation, the allocation, the release"
    );
}

#[test]
fn a_fifo_anywhere_in_the_state_dir_never_blocks() {
    // Where the FIFO is, and whether a plain allocation then works.
    let cases = [
        ("cursor", true),
        // audit_failure = "warn" (the default): the allocation goes on, not blocked on
        // the FIFO (its line goes to gpupin's own log).
        ("audit.log", true),
        ("queue/00000000000000000001-x.json", true),
        ("queue-seq", true),
        // The index is read nowhere but through the no-follow, non-blocking open: the
        // records decide, and the index is written anew over the FIFO.
        ("holders.index", true),
        ("holders/x.json", false),
        ("lock", false),
    ];
    // All at once, each in its own state dir, so that every case that blocks is named.
    let running: Vec<_> = cases
        .into_iter()
        .map(|(name, works)| {
            let (t, l) = ledger();
            std::fs::create_dir_all(l.dir().join("queue")).unwrap();
            std::fs::create_dir_all(l.dir().join("holders")).unwrap();
            mkfifo(&l.dir().join(name));
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let inv = machine(4);
                let m = Machine::new(&inv, PolicyName::Pack);
                let plain = alloc(&l, "a").map_err(|e| one_line(&e));
                let waiting = l
                    .allocate_waiting(&id("w"), &count(1), &m, me(), Duration::from_millis(50))
                    .map_err(|e| one_line(&e));
                let _ = tx.send((plain, waiting));
            });
            (name, works, rx, t)
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut failures = Vec::new();
    for (name, works, rx, _t) in running {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Ok((plain, waiting)) = rx.recv_timeout(left) else {
            failures.push(format!("{name}: blocked"));
            continue;
        };
        for got in [&plain, &waiting] {
            if got.is_ok() != works {
                failures.push(format!("{name}: {got:?}"));
            }
            if let Err(err) = got
                && !(err.contains("FIFO") || err.contains("special file"))
            {
                failures.push(format!("{name}: {err}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_state_file_replaced_by_a_symlink_is_replaced_not_followed() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let (t, l) = ledger();
    let elsewhere = t.path().join("elsewhere");
    std::fs::write(&elsewhere, "7\n").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o666)).unwrap();
    let root = rustix::process::geteuid().is_root();
    if root {
        std::os::unix::fs::chown(&elsewhere, Some(4242), Some(4242)).unwrap();
    }
    std::os::unix::fs::symlink(&elsewhere, l.dir().join("cursor")).unwrap();
    let inv = machine(4);
    let got = l
        .allocate(
            &id("a"),
            &count(1),
            &Machine::new(&inv, PolicyName::Spread),
            me(),
        )
        .unwrap();
    assert_eq!(
        got.record.gpus,
        ["GPU-test-0"],
        "the link is not read either"
    );
    let cursor = std::fs::symlink_metadata(l.dir().join("cursor")).unwrap();
    assert!(cursor.is_file());
    assert_eq!(cursor.mode() & 0o7777, 0o644);
    assert_eq!(cursor.uid(), rustix::process::geteuid().as_raw());
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "7\n");
    assert_eq!(mode_of(&elsewhere), 0o666);
}

#[test]
fn entries_that_are_no_record_block_allocation_until_gc_clears_them() {
    let (_t, l) = ledger();
    alloc(&l, "live").unwrap();
    let holders = l.dir().join("holders");
    let mut bad: Record = snapshot(&l)[0].clone();
    bad.id = "bad id".into();
    std::fs::write(
        holders.join("bad id.json"),
        serde_json::to_string(&bad).unwrap(),
    )
    .unwrap();
    std::fs::create_dir(holders.join("x.json")).unwrap();
    std::fs::write(holders.join("x.json/inside"), "").unwrap();
    let err = alloc(&l, "b").unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "stray entry {:?} in the ledger: its name is not that of a holder id \
             (remove it with `gpupin gc` or `gpupin release $'bad id.json'`)",
            holders.join("bad id.json")
        )
    );
    let report = l.gc().unwrap();
    assert_eq!(
        cleared_here(&l, &report),
        [holders.join("bad id.json"), holders.join("x.json")]
    );
    assert!(report.released.is_empty() && report.left.is_empty());
    assert_eq!(snapshot(&l).len(), 1, "the live holder stays");
    alloc(&l, "b").unwrap();
}

#[test]
fn release_removes_any_single_entry_and_nothing_beyond() {
    let (t, l) = ledger();
    let holders = l.dir().join("holders");
    std::fs::create_dir(&holders).unwrap();
    std::fs::write(holders.join("bad id.json"), "{}").unwrap();
    std::fs::create_dir(holders.join("x.json")).unwrap();
    mkfifo(&holders.join("f.json"));
    std::os::unix::fs::symlink(t.path(), holders.join("l.json")).unwrap();
    for name in ["bad id.json", "x", "f.json", "l"] {
        match l.release_entry(OsStr::new(name)).unwrap() {
            Released::Entry(path) => assert!(path.starts_with(&holders), "{path:?}"),
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(holders.read_dir().unwrap().count(), 0);
    assert!(t.path().join("state").is_dir(), "the link's target stays");
    for name in ["", ".", "..", "../state", "a/b"] {
        let err = l.release_entry(OsStr::new(name)).unwrap_err().to_string();
        assert!(err.starts_with("invalid ledger entry"), "{err}");
    }
    assert!(matches!(
        l.release_entry(OsStr::new("gone")).unwrap(),
        Released::Nothing
    ));
}

#[test]
fn gc_leaves_a_corrupt_record_for_release_and_says_how() {
    let (_t, l) = ledger();
    let holders = l.dir().join("holders");
    std::fs::create_dir(&holders).unwrap();
    std::fs::write(holders.join("c1.json"), "{not json").unwrap();
    let err = alloc(&l, "a").unwrap_err().to_string();
    assert!(
        err.starts_with("corrupt ledger record")
            && err.ends_with("remove it with `gpupin release c1`)"),
        "{err}"
    );
    let report = l.gc().unwrap();
    assert_eq!(report.left.len(), 1);
    assert!(holders.join("c1.json").exists());
    assert!(matches!(
        l.release_entry(OsStr::new("c1")).unwrap(),
        Released::Entry(_)
    ));
    alloc(&l, "a").unwrap();
}

#[test]
fn a_record_others_could_have_written_is_refused_like_a_corrupt_one() {
    use std::os::unix::fs::PermissionsExt;
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap();
    let record = l.dir().join("holders/a.json");
    // A chmod or chown in place needs root and leaves `holders/` as it was, so the index
    // would still match and the allocation read no record; any other change of
    // `holders/` (a record planted, another gpupin's) makes the records be read, as here.
    let index = l.dir().join(store::index::INDEX_FILE);
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::remove_file(&index).unwrap();
    let err = alloc(&l, "b").unwrap_err().to_string();
    assert!(
        err.starts_with("corrupt ledger record") && err.contains("mode 666 lets others write it"),
        "{err}"
    );
    std::fs::set_permissions(&record, std::fs::Permissions::from_mode(0o644)).unwrap();
    if rustix::process::geteuid().is_root() {
        std::os::unix::fs::chown(&record, Some(4242), None).unwrap();
        let err = alloc(&l, "b").unwrap_err().to_string();
        assert!(err.contains("owned by uid 4242, not root"), "{err}");
        std::os::unix::fs::chown(&record, Some(0), None).unwrap();
    }
    alloc(&l, "b").unwrap();
}

#[test]
fn gc_drops_the_queue_ticket_of_a_waiter_that_was_killed() {
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap();
    let queue = l.dir().join("queue");
    std::fs::create_dir(&queue).unwrap();
    let ticket = queue.join("00000000000000000001-w.json");
    let text = format!(
        r#"{{"seq":1,"id":"w","pid":{},"start_time":1}}"#,
        a_dead_pid()
    );
    std::fs::write(&ticket, text).unwrap();
    let report = l.gc().unwrap();
    assert!(!ticket.exists());
    assert!(report.cleared.contains(&ticket), "{:?}", report.cleared);
}

#[test]
fn gc_removes_the_temp_files_of_dead_writers_only() {
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap();
    let d = l.dir();
    std::fs::create_dir_all(d.join("queue")).unwrap();
    let dead = a_dead_pid();
    let mine = std::process::id();
    let dead_ones = [
        d.join(format!(".a.json.gpupin-{dead}-0.tmp")),
        d.join(format!("holders/.a.json.gpupin-{dead}-3.tmp")),
        d.join(format!("queue/.1-w.json.gpupin-{dead}-1.tmp")),
    ];
    let live_one = d.join(format!("holders/.b.json.gpupin-{mine}-9.tmp"));
    for path in dead_ones.iter().chain([&live_one]) {
        std::fs::write(path, "{").unwrap();
    }
    let mut cleared = cleared_here(&l, &l.gc().unwrap());
    cleared.sort();
    let mut expected = dead_ones.to_vec();
    expected.sort();
    assert_eq!(cleared, expected);
    assert!(dead_ones.iter().all(|p| !p.exists()));
    assert!(live_one.exists(), "a live writer's temp file stays");
    assert_eq!(snapshot(&l).len(), 1);
}

#[test]
fn an_unbound_record_from_the_future_is_stale_after_the_grace() {
    let (_t, l) = ledger();
    let unbound = HolderMeta { pid: None, ..me() };
    let inv = machine(1);
    let a = l
        .allocate(
            &id("a"),
            &count(1),
            &Machine::new(&inv, PolicyName::Pack),
            unbound,
        )
        .unwrap();
    let now = SystemTime::now();
    let grace = DEFAULT_CLAIM_GRACE;
    let mut soon = a.record.clone();
    soon.created_at += 10; // a clock stepped back by seconds: still within the grace
    assert!(!soon.is_stale(now, grace));
    let mut far = a.record.clone();
    far.created_at += 2 * grace.as_secs(); // stepped back by more than the grace
    assert!(far.is_stale(now, grace));
    let path = l.dir().join("holders/a.json");
    std::fs::write(&path, serde_json::to_string(&far).unwrap()).unwrap();
    assert_eq!(l.gc().unwrap().released, [far]);
}

/// Seconds since the epoch at which this boot began, minus `before`.
/// What `gc` cleared in `l`'s own directory. gc also removes the host's empty, orphaned
/// `gpupin-*` job cgroups, which earlier runs on the machine may have left.
fn cleared_here(l: &Ledger, report: &GcReport) -> Vec<PathBuf> {
    let mut here = report.cleared.clone();
    here.retain(|p| p.starts_with(l.dir()));
    here
}

fn before_boot(before: u64) -> u64 {
    crate::base::procinfo::boot_time().unwrap() - before
}

#[test]
fn a_record_from_an_earlier_boot_is_stale_whatever_its_pid_says() {
    let (_t, l) = ledger();
    alloc(&l, "old").unwrap();
    let path = l.dir().join("holders/old.json");
    let mut record: Record = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    // Our own pid and start time: alive by every other rule.
    record.created_at = before_boot(60);
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    for n in 0..4 {
        alloc(&l, &format!("new{n}")).unwrap();
    }
    assert!(!path.exists());
}

#[test]
fn a_half_written_record_from_an_earlier_boot_blocks_nothing_and_gc_clears_it() {
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap();
    let torn = l.dir().join("holders/torn.json");
    std::fs::write(&torn, "").unwrap();
    let then = rustix::fs::Timespec {
        tv_sec: before_boot(60) as i64,
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: then,
        last_modification: then,
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        &torn,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .unwrap();
    alloc(&l, "b").unwrap();
    let report = l.gc().unwrap();
    assert_eq!(cleared_here(&l, &report), std::slice::from_ref(&torn));
    assert!(!torn.exists());
    // Written in this boot, the same file is a corrupt record and stops allocation.
    std::fs::write(&torn, "").unwrap();
    assert!(
        alloc(&l, "c")
            .unwrap_err()
            .to_string()
            .starts_with("corrupt ledger record")
    );
}

#[test]
fn a_pid_recorded_without_its_start_time_is_stale_even_if_the_pid_runs_now() {
    let mut record = alloc_record_for_staleness();
    record.pid = Some(std::process::id() as i32);
    record.start_time = None;
    assert!(record.is_stale(SystemTime::now(), DEFAULT_CLAIM_GRACE));
    record.start_time = crate::base::procinfo::start_time(std::process::id() as i32);
    assert!(!record.is_stale(SystemTime::now(), DEFAULT_CLAIM_GRACE));
}

fn alloc_record_for_staleness() -> Record {
    let (_t, l) = ledger();
    alloc(&l, "a").unwrap().record
}

/// Issue 31, finding 9: a holding's end was written in the other order (the record
/// removed, then its line appended), so that `gpupin usage` (the records, then the log)
/// could find it in neither. One inotify instance reports the two steps in the order
/// they happened: the log's change first, then the record's removal, for a release and
/// for a reap.
#[test]
fn a_holdings_end_is_in_the_log_before_its_record_goes() {
    use rustix::fs::inotify;
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("web"), &count(1), &m, me()).unwrap();
    let mut gone = testing::record("old", &["GPU-test-3"]);
    gone.start_time = None;
    store::write_record(l.dir(), "old.json", &gone).unwrap();

    let watch = inotify::init(inotify::CreateFlags::NONBLOCK).unwrap();
    let holders =
        inotify::add_watch(&watch, l.dir().join("holders"), inotify::WatchFlags::DELETE).unwrap();
    let log = inotify::add_watch(
        &watch,
        l.dir().join("audit.log"),
        inotify::WatchFlags::MODIFY,
    )
    .unwrap();
    let steps = |what: &str| -> Vec<&'static str> {
        let mut buf = [std::mem::MaybeUninit::uninit(); 4096];
        let mut reader = inotify::Reader::new(&watch, &mut buf);
        let mut steps = Vec::new();
        while let Ok(event) = reader.next() {
            match event.wd() {
                wd if wd == log => steps.push("line"),
                wd if wd == holders => steps.push("removed"),
                _ => {}
            }
        }
        assert!(!steps.is_empty(), "{what}: no step seen");
        steps
    };
    l.release(&id("web")).unwrap();
    assert_eq!(steps("release"), ["line", "removed"]);
    l.gc().unwrap();
    assert_eq!(steps("reap"), ["line", "removed"]);
    assert!(l.records().unwrap().is_empty());
}

#[test]
fn stale_ids_names_the_holders_whose_process_is_gone_and_no_other() {
    let (_t, l) = ledger();
    let alive = testing::record("alive", &["GPU-test-0"]);
    let also_alive = testing::record("also-alive", &["GPU-test-1"]);
    let gone = Record {
        start_time: alive.start_time.map(|t| t + 1),
        ..testing::record("gone", &["GPU-test-2"])
    };
    let records = [alive, gone, also_alive];
    let stale = l.stale_ids(&records);
    assert_eq!(stale.into_iter().collect::<Vec<_>>(), ["gone"]);
}
