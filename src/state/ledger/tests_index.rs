//! The ledger's index (`store::index`): after any sequence of allocations, rebinds,
//! releases, reaps and writers killed between a record and the index, an index that
//! matches is the records' own counts; and no index that is not (torn, zeroed, stale, a
//! link, someone else's, one an older gpupin's change left behind) hands a GPU out twice.

use super::store::index::{self, INDEX_FILE, Index};
use super::tests::{id, ledger};
use super::*;
use crate::input::config::PolicyName;
use crate::input::request::{Origin, Selection};
use crate::policy::testing::machine;
use proptest::prelude::*;
use std::os::unix::fs::PermissionsExt;

fn shared(n: u32) -> GpuRequest {
    let mut request = GpuRequest::new(Selection::Count(n), Origin::Annotations);
    request.share = Share::Shared;
    request
}

fn exclusive(n: u32) -> GpuRequest {
    GpuRequest::new(Selection::Count(n), Origin::Annotations)
}

/// This test process: a holder naming it is alive.
fn running() -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        ..HolderMeta::default()
    }
}

/// A process that has ended: a holder naming it is stale.
fn ended_pid() -> i32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    pid
}

/// The counts of the records as they are on disk, and of the index that matches (if any).
fn index_and_truth(l: &Ledger) -> (Option<Index>, Index) {
    let truth = Index::of(&l.records().unwrap()).unwrap().unstamped();
    (index::load(l.dir()).map(Index::unstamped), truth)
}

/// Each GPU held whole by one holder, or shared by holders that all share it.
fn no_gpu_twice(l: &Ledger) -> Result<(), String> {
    let records = l.records().unwrap();
    let mut per_gpu: std::collections::BTreeMap<&str, Vec<&Record>> = Default::default();
    for r in &records {
        for g in &r.gpus {
            per_gpu.entry(g).or_default().push(r);
        }
    }
    for (gpu, holders) in per_gpu {
        if holders.len() > 1 && holders.iter().any(|r| r.request.share == Share::Exclusive) {
            let ids: Vec<&str> = holders.iter().map(|r| r.id.as_str()).collect();
            return Err(format!("{gpu} handed out twice: {ids:?}"));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum Op {
    /// A new holder of `n` GPUs, whole or shared, of the given kind of life.
    Allocate {
        name: u8,
        n: u32,
        shared: bool,
        life: Life,
    },
    /// A container's create retried with its pid now known (the record rewritten).
    Retry { name: u8 },
    /// A holder released.
    Release { name: u8 },
    /// A record removed by something that does not keep the index: a writer killed
    /// between the record and the index, an older gpupin mid-upgrade.
    Unindexed { name: u8 },
}

#[derive(Debug, Clone, Copy)]
enum Life {
    /// Bound to this (running) process.
    Running,
    /// A claim waiting for its process, within its grace.
    Claim,
    /// A hold until it is released.
    Hold,
    /// A hold whose time is up already.
    Expired,
    /// Bound to a process that has ended.
    Ended,
}

fn op() -> impl Strategy<Value = Op> {
    let life = prop_oneof![
        4 => Just(Life::Running),
        1 => Just(Life::Claim),
        1 => Just(Life::Hold),
        1 => Just(Life::Expired),
        1 => Just(Life::Ended),
    ];
    prop_oneof![
        5 => (0u8..8, 1u32..=2, any::<bool>(), life).prop_map(|(name, n, shared, life)| Op::Allocate { name, n, shared, life }),
        1 => (0u8..8).prop_map(|name| Op::Retry { name }),
        3 => (0u8..8).prop_map(|name| Op::Release { name }),
        1 => (0u8..8).prop_map(|name| Op::Unindexed { name }),
    ]
}

fn run(l: &Ledger, m: &Machine, op: &Op) {
    let name = |n: &u8| id(&format!("h{n}"));
    match op {
        Op::Allocate {
            name: n,
            n: count,
            shared: s,
            life,
        } => {
            let request = if *s {
                shared(*count)
            } else {
                exclusive(*count)
            };
            let now = record::unix_now();
            let meta = match life {
                Life::Running => running(),
                Life::Claim => HolderMeta {
                    pid: None,
                    ..running()
                },
                Life::Hold | Life::Expired => HolderMeta {
                    pid: None,
                    kind: HolderKind::Hold,
                    until_release: true,
                    expires_at: matches!(life, Life::Expired).then_some(now - 1),
                    ..running()
                },
                Life::Ended => HolderMeta {
                    pid: Some(ended_pid()),
                    ..running()
                },
            };
            let _ = l.allocate(&name(n), &request, m, meta);
        }
        Op::Retry { name: n } => {
            let _ = l.allocate(&name(n), &exclusive(1), m, running());
        }
        Op::Release { name: n } => {
            let _ = l.release(&name(n));
        }
        Op::Unindexed { name: n } => {
            let path = store::holders_dir(l.dir()).join(name(n).file_name());
            let _ = std::fs::remove_file(path);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn an_index_that_matches_is_the_records_own_counts(ops in proptest::collection::vec(op(), 1..24)) {
        let (_t, l) = ledger();
        let inv = machine(4);
        let m = Machine::new(&inv, PolicyName::Spread);
        for op in &ops {
            run(&l, &m, op);
            let (index, truth) = index_and_truth(&l);
            if let Some(index) = index {
                prop_assert_eq!(index, truth, "after {:?}", op);
            }
            prop_assert!(no_gpu_twice(&l).is_ok(), "{:?} after {:?}", no_gpu_twice(&l), op);
        }
        // Whatever came before, the next allocation leaves an index that matches.
        let _ = l.allocate(&id("last"), &shared(1), &m, running());
        let (index, truth) = index_and_truth(&l);
        prop_assert_eq!(index, Some(truth));
    }
}

/// GPU 0 held by `a` (this process, exclusive) through the ledger, which leaves an index.
fn held_by_a() -> (tempfile::TempDir, Ledger, crate::model::gpu::Inventory) {
    let (t, l) = ledger();
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let a = l.allocate(&id("a"), &exclusive(1), &m, running()).unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-0"]);
    assert!(
        index::load(l.dir()).is_some(),
        "an allocation leaves an index"
    );
    (t, l, inv)
}

/// What the next whole-GPU request gets: never `a`'s GPU 0.
fn next_gets(l: &Ledger, inv: &crate::model::gpu::Inventory) -> Vec<String> {
    let m = Machine::new(inv, PolicyName::Pack);
    let b = l.allocate(&id("b"), &exclusive(1), &m, running()).unwrap();
    b.record.gpus
}

#[test]
fn an_allocation_on_a_matching_index_reads_no_record() {
    let (_t, l, inv) = held_by_a();
    // A record opened would be refused now (writable by others); chmod leaves the
    // directory's mtime, so the index still matches, and the allocation never opens it.
    let a = l.dir().join("holders/a.json");
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(next_gets(&l, &inv), ["GPU-test-1"]);
    // The records, read, refuse: the next allocation that needs them says so.
    std::fs::set_permissions(&a, std::fs::Permissions::from_mode(0o644)).unwrap();
}

#[test]
fn an_index_left_behind_by_a_change_it_missed_is_not_trusted() {
    let (_t, l, inv) = held_by_a();
    let empty = std::fs::read(l.dir().join(INDEX_FILE)).unwrap();
    l.release(&id("a")).unwrap();
    // GPU 0 taken again, then the index of the empty ledger put back: the stamp it
    // carries is not the directory's any more.
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a"), &exclusive(1), &m, running()).unwrap();
    let stale = l.dir().join(INDEX_FILE);
    std::fs::write(&stale, &empty).unwrap();
    assert!(index::load(l.dir()).is_none());
    assert_eq!(next_gets(&l, &inv), ["GPU-test-1"]);
}

#[test]
fn a_record_an_older_gpupin_wrote_beside_the_index_is_seen() {
    let (_t, l, inv) = held_by_a();
    // An older binary (no index) takes GPU 1 for `old`: the record only.
    let mut r = crate::state::ledger::testing::record("old", &["GPU-test-1"]);
    r.created_at = record::unix_now();
    let holders = store::holders_dir(l.dir());
    store::write_atomic(
        &holders,
        "old.json",
        serde_json::to_string(&r).unwrap().as_bytes(),
    )
    .unwrap();
    let m = Machine::new(&inv, PolicyName::Pack);
    assert!(index::load(l.dir()).is_none());
    let err = l
        .allocate(&id("b"), &exclusive(1), &m, running())
        .unwrap_err();
    assert_eq!(err.code(), "not_enough_free", "{err}");
    // The next grant, decided on the records, writes an index that matches them.
    l.release(&id("old")).unwrap();
    assert_eq!(next_gets(&l, &inv), ["GPU-test-1"]);
    let (index, truth) = index_and_truth(&l);
    assert_eq!(index, Some(truth));
}

/// An index that would hand out GPU 0 again if it were read: the empty ledger's counts,
/// stamped with the directory's mtime as it is now.
fn forged(l: &Ledger) -> Vec<u8> {
    let mut index = serde_json::to_value(Index::of(&[]).unwrap()).unwrap();
    let meta = rustix::fs::lstat(store::holders_dir(l.dir())).unwrap();
    index["stamp"] = serde_json::json!([meta.st_mtime, meta.st_mtime_nsec]);
    serde_json::to_vec(&index).unwrap()
}

#[test]
fn a_forged_index_matching_the_stamp_is_refused_unless_root_or_gpupin_wrote_it() {
    /// How the forgery is put in the index's place.
    type Plant = fn(&Path, &[u8]);
    let cases: [(&str, Plant); 3] = [
        ("writable by others", |path, forged| {
            std::fs::write(path, forged).unwrap();
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
        }),
        ("a symlink to it", |path, forged| {
            let elsewhere = path.with_file_name("elsewhere");
            std::fs::write(&elsewhere, forged).unwrap();
            std::os::unix::fs::symlink(&elsewhere, path).unwrap();
        }),
        ("owned by nobody", |path, forged| {
            std::fs::write(path, forged).unwrap();
            if rustix::process::geteuid().is_root() {
                std::os::unix::fs::chown(path, Some(65534), None).unwrap();
            } else {
                // Not root: no chown; the mode case above stands in.
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o646)).unwrap();
            }
        }),
    ];
    for (what, plant) in cases {
        let (_t, l, inv) = held_by_a();
        let path = l.dir().join(INDEX_FILE);
        std::fs::remove_file(&path).unwrap();
        let forged = forged(&l);
        // The forgery itself, as root or gpupin would write it, would be believed: what
        // keeps it out is who wrote it and how it is reached.
        plant(&path, &forged);
        assert!(index::load(l.dir()).is_none(), "{what}");
        assert_eq!(next_gets(&l, &inv), ["GPU-test-1"], "{what}");
    }
}

#[test]
fn a_torn_zeroed_or_garbage_index_is_rebuilt_from_the_records() {
    let torn = |bytes: &[u8]| bytes[..bytes.len() / 2].to_vec();
    let zeroed = |bytes: &[u8]| vec![0; bytes.len()];
    let garbage = |_: &[u8]| b"{\"version\": 1, \"stamp\": [0, 0]}".to_vec();
    let empty = |_: &[u8]| Vec::new();
    let other_version = |bytes: &[u8]| {
        let mut v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        v["version"] = 99.into();
        v["occupancy"] =
            serde_json::to_value(Index::of(&[]).unwrap()).unwrap()["occupancy"].clone();
        serde_json::to_vec(&v).unwrap()
    };
    /// How the index's own bytes are spoilt.
    type Spoil<'f> = &'f dyn Fn(&[u8]) -> Vec<u8>;
    let cases: [(&str, Spoil); 5] = [
        ("torn", &torn),
        ("zeroed", &zeroed),
        ("garbage", &garbage),
        ("empty", &empty),
        ("another version", &other_version),
    ];
    for (what, spoil) in cases {
        let (_t, l, inv) = held_by_a();
        let path = l.dir().join(INDEX_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, spoil(&bytes)).unwrap();
        assert!(index::load(l.dir()).is_none(), "{what}");
        assert_eq!(next_gets(&l, &inv), ["GPU-test-1"], "{what}");
        let (index, truth) = index_and_truth(&l);
        assert_eq!(index, Some(truth), "{what}: rebuilt");
    }
}

/// A holder of GPU 0 made by `meta`, stale by the time the next request comes, is reaped
/// by it though the index matches: the next request gets GPU 0 (packed), where counting
/// the stale holder as live would give it GPU 1.
fn reaped_by_the_next(l: &Ledger, meta: HolderMeta) {
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let old = l.allocate(&id("old"), &exclusive(1), &m, meta).unwrap();
    assert_eq!(old.record.gpus, ["GPU-test-0"]);
    assert!(index::load(l.dir()).is_some(), "the index matches");
    assert_eq!(next_gets(l, &inv), ["GPU-test-0"]);
    assert!(!l.holds(&id("old")), "reaped");
}

#[test]
fn a_holder_whose_process_ended_is_reaped_though_the_index_matches() {
    let (_t, l) = ledger();
    // Recorded with no start time (its process had ended): stale at any look.
    let gone = HolderMeta {
        pid: Some(ended_pid()),
        ..running()
    };
    reaped_by_the_next(&l, gone);
}

#[test]
fn a_claim_past_its_grace_and_a_hold_past_its_end_are_reaped_though_the_index_matches() {
    let t = tempfile::tempdir().unwrap();
    let settings = LedgerSettings {
        claim_grace: Duration::ZERO,
        ..LedgerSettings::at(&t.path().join("state"))
    };
    let l = Ledger::open(&settings).unwrap();
    let claim = HolderMeta {
        pid: None,
        ..running()
    };
    reaped_by_the_next(&l, claim);
    let (_t, l) = ledger();
    let ended = HolderMeta {
        pid: None,
        kind: HolderKind::Hold,
        until_release: true,
        expires_at: Some(record::unix_now()),
        ..running()
    };
    reaped_by_the_next(&l, ended);
}

#[test]
fn a_survey_tells_an_index_that_counts_what_the_records_do_from_one_that_does_not() {
    let (_t, l, inv) = held_by_a();
    assert_eq!(l.survey().unwrap().index, survey::IndexState::Agrees);
    // A record rewritten in place (an editor, by hand): `holders/` keeps its stamp, so the
    // index still matches, but it no longer counts what the records say.
    let path = l.dir().join("holders/a.json");
    let mut record: Record = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    record.gpus = vec![inv.gpus[1].uuid.clone()];
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::io::Write::write_all(
        &mut file,
        serde_json::to_string(&record).unwrap().as_bytes(),
    )
    .unwrap();
    drop(file);
    assert!(index::load(l.dir()).is_some());
    assert_eq!(l.survey().unwrap().index, survey::IndexState::Disagrees);
    // `gpupin gc` writes it anew from the records.
    l.gc().unwrap();
    assert_eq!(l.survey().unwrap().index, survey::IndexState::Agrees);
    // Without an index that matches: unmatched, and nothing is wrong.
    std::fs::remove_file(l.dir().join(INDEX_FILE)).unwrap();
    assert_eq!(l.survey().unwrap().index, survey::IndexState::Unmatched);
}
