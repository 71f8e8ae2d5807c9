//! MIG instances through the ledger, on the simulated machines with MIG: a GPU in MIG
//! mode is never given whole, each instance is an exclusive unit, requests by profile,
//! `any`, devices and the `mig` key, pack and spread.

use super::tests::{id, ledger};
use super::*;
use crate::host::inventory::sim;
use crate::input::config::MigUnits;
use crate::input::config::PolicyName;
use crate::input::request::{MigWant, Origin, Selection, from_pairs};
use crate::model::gpu::Inventory;
use std::collections::HashSet;

pub(super) fn me() -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        ..HolderMeta::default()
    }
}

pub(super) fn ask(pairs: &[(&str, &str)]) -> GpuRequest {
    from_pairs(pairs, Origin::Annotations).unwrap().unwrap()
}

fn a100() -> Inventory {
    sim::machine("dgxa100mig").unwrap()
}

fn h100() -> Inventory {
    sim::machine("nvswitch8mig").unwrap()
}

fn take(l: &Ledger, m: &Machine, holder: &str, pairs: &[(&str, &str)]) -> Result<Record, String> {
    l.allocate(&id(holder), &ask(pairs), m, me())
        .map(|a| a.record)
        .map_err(|e| crate::base::message::one_line(&e))
}

/// `0:2` for each MIG UUID, the index for a GPU's.
fn shown(inv: &Inventory, record: &Record) -> Vec<String> {
    record
        .gpus
        .iter()
        .map(|u| match inv.find_mig(u) {
            Some(m) => m.address(),
            None => inv.gpus[inv.position_of(u).unwrap()].index.to_string(),
        })
        .collect()
}

#[test]
fn a_profile_gets_instances_of_it_and_never_the_gpu_whole() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let a = take(&l, &m, "a", &[("gpupin.mig", "1g.10gb")]).unwrap();
    assert_eq!(shown(&inv, &a), ["0:2"]);
    // The record names the instance's UUID and, as its index, the GPU it is on.
    assert_eq!(a.gpus, [inv.find_mig("0:2").unwrap().uuid.clone()]);
    assert_eq!(a.indices, [0]);
    let b = take(&l, &m, "b", &[("gpupin.mig", "1g.10gb")]).unwrap();
    assert_eq!(shown(&inv, &b), ["0:3"]);
    let err = take(&l, &m, "c", &[("gpupin.mig", "1g.10gb")]).unwrap_err();
    assert_eq!(
        err,
        "cannot allocate 1 MIG instance of 1g.10gb for c: 0 of the 2 instances of 1g.10gb can take it"
    );
    // A plain count gets whole GPUs only: 1 to 6 (0 and 7 are in MIG mode).
    let whole = take(&l, &m, "w", &[("gpupin.count", "6")]).unwrap();
    assert_eq!(shown(&inv, &whole), ["1", "2", "3", "4", "5", "6"]);
    let err = take(&l, &m, "x", &[("gpupin.count", "1")]).unwrap_err();
    assert!(
        err.starts_with("cannot allocate 1 GPU for x: 6 of 6 GPUs held, 0 free; add gpupin.wait"),
        "{err}"
    );
    // Named whole, a GPU in MIG mode is refused, saying what to ask for instead.
    let err = take(&l, &m, "y", &[("gpupin.devices", "0")]).unwrap_err();
    assert!(
        err.contains("cannot allocate GPU 0")
            && err.contains("in MIG mode and handed out as its instances (0:0, 0:1, 0:2, 0:3)"),
        "{err}"
    );
    l.release(&id("w")).unwrap();
    let err = take(&l, &m, "z", &[("gpupin.devices", "7")]).unwrap_err();
    assert!(err.contains("in MIG mode with no instances"), "{err}");
}

#[test]
fn any_takes_the_smallest_instance_that_fits_the_memory() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let small = take(&l, &m, "a", &[("gpupin.mig", "any")]).unwrap();
    assert_eq!(shown(&inv, &small), ["0:2"]);
    let mid = take(
        &l,
        &m,
        "b",
        &[("gpupin.mig", "any"), ("gpupin.memory", "15GiB")],
    )
    .unwrap();
    assert_eq!(shown(&inv, &mid), ["0:1"]);
    let big = take(
        &l,
        &m,
        "c",
        &[("gpupin.mig", "any"), ("gpupin.memory", "30GiB")],
    )
    .unwrap();
    assert_eq!(shown(&inv, &big), ["0:0"]);
    let err = take(
        &l,
        &m,
        "d",
        &[("gpupin.mig", "any"), ("gpupin.memory", "30GiB")],
    )
    .unwrap_err();
    assert!(
        err.contains("0 of the 4 instances of any profile can take it; memory >= 30GiB"),
        "{err}"
    );
    let err = take(&l, &m, "e", &[("gpupin.mig", "4g.40gb")]).unwrap_err();
    assert!(
        err.ends_with(
            "0 of the 0 instances of 4g.40gb can take it; this machine's profiles: 1g.10gb, 2g.20gb, 3g.40gb"
        ),
        "{err}"
    );
}

#[test]
fn devices_name_instances_by_address_or_uuid() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let uuid = inv.find_mig("0:1").unwrap().uuid.clone();
    let a = take(&l, &m, "a", &[("gpupin.devices", &uuid.to_lowercase())]).unwrap();
    assert_eq!(a.gpus, std::slice::from_ref(&uuid));
    let err = take(&l, &m, "b", &[("gpupin.devices", "0:1")]).unwrap_err();
    assert_eq!(
        err,
        format!("cannot allocate MIG instance 0:1 ({uuid}) for b: it is held by a")
    );
    // Instances and whole GPUs in one list.
    let mixed = take(&l, &m, "c", &[("gpupin.devices", "0:0,3")]).unwrap();
    assert_eq!(shown(&inv, &mixed), ["3", "0:0"]);
    // An instance that is gone (the geometry changed) is unknown.
    let err = take(&l, &m, "d", &[("gpupin.devices", "0:9")]).unwrap_err();
    assert!(err.starts_with("unknown GPU \"0:9\""), "{err}");
}

#[test]
fn a_gpu_held_whole_from_before_its_geometry_changed_frees_no_instance() {
    let (_t, l) = ledger();
    let mut before = a100();
    before.gpus[0].mig = None;
    let m = Machine::new(&before, PolicyName::Pack);
    let old = take(&l, &m, "old", &[("gpupin.devices", "0")]).unwrap();
    assert_eq!(old.gpus, [before.gpus[0].uuid.clone()]);
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let err = take(&l, &m, "new", &[("gpupin.devices", "0:0")]).unwrap_err();
    assert!(err.ends_with("it is held by old"), "{err}");
}

#[test]
fn pack_fills_one_gpu_first_and_spread_takes_turns() {
    let inv = h100();
    let (_t, l) = ledger();
    let m = Machine::new(&inv, PolicyName::Pack);
    let packed = take(
        &l,
        &m,
        "p",
        &[("gpupin.mig", "1g.10gb"), ("gpupin.count", "3")],
    )
    .unwrap();
    assert_eq!(shown(&inv, &packed), ["0:0", "0:1", "0:2"]);
    // GPU 0 is the fuller now: pack goes on there.
    let more = take(
        &l,
        &m,
        "q",
        &[("gpupin.mig", "1g.10gb"), ("gpupin.count", "4")],
    )
    .unwrap();
    assert_eq!(shown(&inv, &more), ["0:3", "0:4", "0:5", "0:6"]);
    let (_t2, l2) = ledger();
    let spread = [
        ("gpupin.mig", "1g.10gb"),
        ("gpupin.count", "4"),
        ("gpupin.policy", "spread"),
    ];
    let got = take(&l2, &m, "s", &spread).unwrap();
    let parents: Vec<u32> = got
        .gpus
        .iter()
        .map(|u| inv.find_mig(u).unwrap().parent_index)
        .collect();
    assert_eq!(
        parents.iter().filter(|&&p| p == 0).count(),
        2,
        "{:?}",
        shown(&inv, &got)
    );
}

#[test]
fn a_plain_count_takes_instances_only_under_instances_too() {
    let (_t, l) = ledger();
    let inv = a100();
    let whole_only = Machine::new(&inv, PolicyName::Pack);
    take(&l, &whole_only, "w", &[("gpupin.count", "6")]).unwrap();
    let err = take(&l, &whole_only, "a", &[("gpupin.count", "1")]).unwrap_err();
    assert!(err.starts_with("cannot allocate 1 GPU for a"), "{err}");
    let too = Machine {
        mig_units: MigUnits::InstancesToo,
        ..Machine::new(&inv, PolicyName::Pack)
    };
    // The largest first: it asked for a GPU.
    let a = take(&l, &too, "a", &[("gpupin.count", "2")]).unwrap();
    assert_eq!(shown(&inv, &a), ["0:0", "0:1"]);
}

#[test]
fn a_wait_for_more_instances_than_the_machine_has_is_refused_at_once() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let pairs = [
        ("gpupin.mig", "1g.10gb"),
        ("gpupin.count", "3"),
        ("gpupin.wait", "1h"),
    ];
    let err = take(&l, &m, "w", &pairs).unwrap_err();
    assert!(
        err.starts_with("cannot allocate 3 MIG instances of 1g.10gb for w: 2 of the 2"),
        "{err}"
    );
    assert!(l.waiting().unwrap().is_empty());
}

#[test]
fn mig_requests_are_checked_in_one_line() {
    let err = |pairs: &[(&str, &str)]| {
        from_pairs(pairs, Origin::Annotations)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        err(&[("gpupin.mig", "1g")]),
        "invalid gpupin.mig=\"1g\": expected a MIG profile such as 1g.10gb (gpupin inventory lists them) or any"
    );
    assert_eq!(
        err(&[("gpupin.mig", "1g.10gb"), ("gpupin.share", "shared")]),
        "gpupin.mig asks for MIG instances, which are never shared: leave out gpupin.share=shared"
    );
    assert_eq!(
        err(&[("gpupin.mig", "1g.10gb"), ("gpupin.devices", "0")]),
        "gpupin.mig takes a number of instances: give gpupin.count=N (default 1), not gpupin.devices"
    );
    let env = crate::input::request::from_env(&["GPUPIN_MIG=2g.20gb", "GPUPIN_COUNT=2"])
        .unwrap()
        .unwrap();
    assert_eq!(env.mig, Some(MigWant::Profile("2g.20gb".into())));
    assert_eq!(env.selection, Selection::Count(2));
    assert_eq!(env.summary(), "count=2 mig=2g.20gb");
    let cli = from_pairs(&[("gpupin.mig", "any")], Origin::Cli)
        .unwrap()
        .unwrap();
    assert_eq!(
        (cli.mig, cli.selection),
        (Some(MigWant::Any), Selection::Count(1))
    );
}

/// 500 requests at once, by profile, `any`, named instance and plain count, on threads
/// that each open the ledger: no instance is given twice, no GPU in MIG mode is given
/// whole, and no unit is held by two records.
#[test]
fn five_hundred_concurrent_requests_never_give_an_instance_twice() {
    let (_t, l) = ledger();
    let dir = l.dir().to_path_buf();
    let inv = std::sync::Arc::new(h100());
    let asks: [&[(&str, &str)]; 5] = [
        &[("gpupin.mig", "1g.10gb")],
        &[("gpupin.mig", "any"), ("gpupin.count", "2")],
        &[("gpupin.devices", "1:3")],
        &[("gpupin.count", "1")],
        &[("gpupin.mig", "1g.10gb"), ("gpupin.policy", "spread")],
    ];
    let handles: Vec<_> = (0..500)
        .map(|i| {
            let (dir, inv) = (dir.clone(), inv.clone());
            let request = ask(asks[i % asks.len()]);
            std::thread::spawn(move || {
                let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
                let m = Machine {
                    mig_units: match i % 2 {
                        0 => MigUnits::WholeOnly,
                        _ => MigUnits::InstancesToo,
                    },
                    ..Machine::new(&inv, PolicyName::Pack)
                };
                l.allocate(&id(&format!("c{i}")), &request, &m, me()).ok()
            })
        })
        .collect();
    let granted: Vec<Allocation> = handles
        .into_iter()
        .filter_map(|h| h.join().unwrap())
        .collect();
    let units: Vec<&String> = granted.iter().flat_map(|a| &a.record.gpus).collect();
    let distinct: HashSet<&&String> = units.iter().collect();
    assert_eq!(distinct.len(), units.len(), "a unit given twice: {units:?}");
    let mig_parents: HashSet<&str> = inv
        .gpus
        .iter()
        .filter(|g| g.in_mig_mode())
        .map(|g| g.uuid.as_str())
        .collect();
    assert!(units.iter().all(|u| !mig_parents.contains(u.as_str())));
    // Every unit is taken: 14 instances and 6 whole GPUs.
    assert_eq!(units.len(), 14 + 6, "{units:?}");
    let records = l.records().unwrap();
    let held: Vec<&String> = records.iter().flat_map(|r| &r.gpus).collect();
    assert_eq!(held.len(), held.iter().collect::<HashSet<_>>().len());
}

/// Issue 32, item 5: `exec --count 7` on sim:dgxa100mig (6 GPUs handed out whole) was
/// told "0 of 8 GPUs held, 8 free; add --wait 10m", a wait that can never succeed. The
/// counts are of what is handed out whole, the refusal says what would have to change in
/// the requester's words, and such a request with a wait is refused at once, not queued.
#[test]
fn a_count_no_wait_can_meet_is_told_what_would_have_to_change() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let cli = |pairs: &[(&str, &str)]| from_pairs(pairs, Origin::Cli).unwrap().unwrap();
    let err = l
        .allocate(&id("x"), &cli(&[("gpupin.count", "7")]), &m, me())
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        crate::base::message::one_line(&err),
        "cannot allocate 7 GPUs for x: 0 of 6 GPUs held, 6 free; 2 GPUs are in MIG mode (handed out as instances), so no wait helps: ask for at most 6"
    );
    let err = l
        .allocate(
            &id("y"),
            &cli(&[("gpupin.count", "1"), ("gpupin.model", "H100")]),
            &m,
            me(),
        )
        .map(|_| ())
        .unwrap_err();
    assert_eq!(
        crate::base::message::one_line(&err),
        "cannot allocate 1 GPU for y: 0 of 6 GPUs held, 6 free; 0 can take --model H100; 2 GPUs are in MIG mode (handed out as instances), 6 GPUs are not --model H100 (this machine has NVIDIA A100-SXM4-80GB), so no wait helps: ask for something this machine has"
    );
    // Asked to wait an hour, it is refused at once and leaves no ticket.
    let request = cli(&[("gpupin.count", "7"), ("gpupin.wait", "1h")]);
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = l.dir().to_path_buf();
    std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
        let inv = a100();
        let m = Machine::new(&inv, PolicyName::Pack);
        let outcome = l.allocate_waiting(
            &id("w"),
            &request,
            &m,
            me(),
            std::time::Duration::from_secs(3600),
        );
        let _ = tx.send(
            outcome
                .map(|_| ())
                .map_err(|e| crate::base::message::one_line(&e)),
        );
    });
    let outcome = rx
        .recv_timeout(std::time::Duration::from_secs(120))
        .expect("refused, not queued for its hour");
    assert!(
        outcome
            .unwrap_err()
            .ends_with("so no wait helps: ask for at most 6")
    );
    assert!(l.waiting().unwrap().is_empty());
}

/// A request inside a holder of MIG instances takes only the instances that holder has,
/// never another instance of the same GPU (`Scope::within_has`: cargo mutants found no
/// test of it).
#[test]
fn a_nested_request_takes_only_its_holders_instances_of_a_gpu() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    let res = take(&l, &m, "res", &[("gpupin.devices", "0:2")]).unwrap();
    assert_eq!(shown(&inv, &res), ["0:2"]);
    let (_, key) = l.key(&id("res")).unwrap().unwrap();
    let nested = |holder: &str| {
        let request = GpuRequest {
            within_key: Some(key.clone()),
            ..ask(&[("gpupin.mig", "any"), ("gpupin.within", "res")])
        };
        l.allocate(&id(holder), &request, &m, me())
            .map(|a| a.record)
            .map_err(|e| crate::base::message::one_line(&e))
    };
    let inner = nested("inner").unwrap();
    assert_eq!(shown(&inv, &inner), ["0:2"]);
    // The hold's one instance is taken: 0:3, free beside it on GPU 0, is not the hold's.
    let err = nested("more").unwrap_err();
    assert!(err.starts_with("cannot allocate 1 MIG instance"), "{err}");
    assert!(!l.records().unwrap().iter().any(|r| r.id == "more"));
}

/// Issue 31, finding 3, for a MIG profile: a waiter for 1g.10gb instances while both are
/// held holds back no request for a whole GPU.
#[test]
fn a_waiter_for_a_busy_mig_profile_blocks_no_request_for_whole_gpus() {
    let (_t, l) = ledger();
    let inv = a100();
    let m = Machine::new(&inv, PolicyName::Pack);
    for holder in ["i1", "i2"] {
        take(&l, &m, holder, &[("gpupin.mig", "1g.10gb")]).unwrap();
    }
    let dir = l.dir().to_path_buf();
    let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let still = std::sync::Arc::clone(&open);
    let waiter = std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
        let inv = a100();
        let m = Machine::new(&inv, PolicyName::Pack);
        let meta = HolderMeta {
            still_wanted: Some(StillWanted(std::sync::Arc::new(move || {
                still.load(std::sync::atomic::Ordering::SeqCst)
            }))),
            ..me()
        };
        let request = ask(&[("gpupin.mig", "1g.10gb"), ("gpupin.wait", "1m")]);
        l.allocate_waiting(
            &id("w"),
            &request,
            &m,
            meta,
            std::time::Duration::from_secs(60),
        )
    });
    while l.waiting().unwrap().is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let whole = take(&l, &m, "whole", &[("gpupin.count", "1")]);
    assert!(whole.is_ok(), "{}", whole.unwrap_err());
    open.store(false, std::sync::atomic::Ordering::SeqCst);
    assert!(waiter.join().unwrap().is_err());
}
