//! decide/ as pure functions: a machine, records and a request in, a plan or a refusal
//! out, with no ledger directory anywhere.

use super::occupancy::{Held, Occupancy, UnitUse};
use super::plan::{Plan, gpus_of_units, plan, resolve_devices};
use super::scope::{Scope, check, scope};
use super::{DecideError, Machine};
use crate::base::message::one_line;
use crate::input::config::PolicyName;
use crate::input::request::{GpuRequest, Origin, Selection};
use crate::model::holder::{ContainerInfo, HolderId, HolderKind, Owner, WithinKey};
use crate::model::limits::Limits;
use crate::policy::testing::machine;
use crate::state::ledger::record::{HolderMeta, Record};
use crate::state::ledger::testing::record;

fn id(s: &str) -> HolderId {
    HolderId::new(s).unwrap()
}

fn request(selection: Selection) -> GpuRequest {
    GpuRequest::new(selection, Origin::Annotations)
}

fn alice() -> Owner {
    Owner {
        uid: 1001,
        user: "alice".into(),
        groups: Vec::new(),
    }
}

fn alices(id: &str, gpus: &[&str]) -> Record {
    Record {
        owner: Some(alice()),
        kind: HolderKind::Exec,
        ..record(id, gpus)
    }
}

/// Alice's own request, as `gpupin serve` makes it for her: limited.
fn alice_asks() -> HolderMeta {
    HolderMeta {
        kind: HolderKind::Exec,
        owner: Some(alice()),
        limited: true,
        ..HolderMeta::default()
    }
}

/// `plan` on `live` as the ledger's slow path gives it: the records and their counts.
fn planned(
    holder: &HolderId,
    request: &GpuRequest,
    m: &Machine,
    live: &[Record],
    cursor: usize,
    scope: &Scope,
) -> Result<Plan, DecideError> {
    let occupancy = Occupancy::of(live);
    let held = Held {
        records: live,
        occupancy: &occupancy,
    };
    plan(holder, request, m, held, cursor, scope)
}

#[test]
fn a_count_takes_gpus_nobody_holds() {
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let live = [record("a", &["GPU-test-0"])];
    let plan = planned(
        &id("b"),
        &request(Selection::Count(2)),
        &m,
        &live,
        0,
        &Scope::default(),
    )
    .unwrap();
    assert_eq!(plan.uuids.len(), 2);
    assert!(!plan.uuids.contains(&"GPU-test-0".to_string()));
    assert_eq!(plan.free, [false, true, true, true]);
}

#[test]
fn a_count_past_the_machine_or_an_empty_machine_is_refused() {
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let err = planned(
        &id("b"),
        &request(Selection::Count(5)),
        &m,
        &[],
        0,
        &Scope::default(),
    )
    .unwrap_err();
    assert_eq!(
        one_line(&err),
        "count 5 is more than the 4 GPUs of this machine"
    );
    assert_eq!(err.code(), "count_too_large");
    let none = machine(0);
    let m = Machine::new(&none, PolicyName::Pack);
    let err = planned(
        &id("b"),
        &request(Selection::Count(1)),
        &m,
        &[],
        0,
        &Scope::default(),
    )
    .unwrap_err();
    assert!(matches!(err, DecideError::NoGpus), "{err}");
    assert_eq!(err.code(), "no_gpus");
}

#[test]
fn a_held_gpu_named_is_refused_under_the_containers_own_name() {
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let live = [record("a", &["GPU-test-0"])];
    let err = planned(
        &id("claim-3f0c1d2e"),
        &request(Selection::Devices(vec!["0".into()])),
        &m,
        &live,
        0,
        &Scope::default(),
    )
    .unwrap_err();
    assert_eq!(err.code(), "device_unavailable");
    let named = HolderMeta {
        container: Some(ContainerInfo {
            engine: Some("podman".into()),
            name: Some("mybox".into()),
            image: None,
        }),
        ..HolderMeta::default()
    };
    let err = one_line(&err.naming(&named));
    assert!(
        err.starts_with("cannot allocate GPU 0 (GPU-test-0) for mybox: "),
        "{err}"
    );
}

#[test]
fn an_unknown_gpu_is_refused_naming_the_known_ones() {
    let inv = machine(2);
    assert_eq!(resolve_devices(&["1".into()], &inv).unwrap(), [1]);
    let err = resolve_devices(&["9".into()], &inv).unwrap_err();
    assert!(
        one_line(&err).starts_with("unknown GPU \"9\": this machine has GPUs "),
        "{err}"
    );
    assert_eq!(err.code(), "unknown_gpu");
}

#[test]
fn whole_gpus_are_their_own_units() {
    let inv = machine(2);
    let units = ["GPU-test-1".to_string()];
    assert_eq!(gpus_of_units(&units, &inv), units);
}

#[test]
fn a_nested_request_needs_a_holder_and_its_key() {
    let inv = machine(2);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut nested = request(Selection::Count(1));
    nested.within = Some("slurm-42".into());
    let opened = std::cell::Cell::new(false);
    let mut opens = |_: &Record, _: &WithinKey| -> Result<bool, DecideError> {
        opened.set(true);
        Ok(true)
    };
    let err = scope(
        &id("b"),
        &nested,
        &m,
        &HolderMeta::default(),
        &[],
        &mut opens,
    )
    .unwrap_err();
    assert!(matches!(err, DecideError::NoSuchWithin { .. }), "{err}");
    let live = [alices("slurm-42", &["GPU-test-1"])];
    // A container names no key: refused, and no secret is looked at.
    let err = scope(
        &id("b"),
        &nested,
        &m,
        &HolderMeta::default(),
        &live,
        &mut opens,
    )
    .unwrap_err();
    assert!(matches!(err, DecideError::WithinNeedsKey { .. }), "{err}");
    assert_eq!(err.code(), "within");
    assert!(!opened.get());
    // Alice inside her own holder: its GPU only.
    let inside = scope(&id("b"), &nested, &m, &alice_asks(), &live, &mut opens).unwrap();
    assert!(!inside.allows(0) && inside.allows(1));
    assert_eq!(inside.enclosing, ["slurm-42"]);
    // Bob inside Alice's, without her key.
    let bob = HolderMeta {
        owner: Some(Owner {
            uid: 1002,
            user: "bob".into(),
            groups: Vec::new(),
        }),
        ..alice_asks()
    };
    let err = scope(&id("b"), &nested, &m, &bob, &live, &mut opens).unwrap_err();
    assert!(
        one_line(&err).contains("gpupin.within=slurm-42 is alice's, not bob's"),
        "{err}"
    );
}

#[test]
fn a_plan_past_the_users_limit_is_refused_and_held_gpus_count_once() {
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(1),
        ..Limits::default()
    };
    let m = Machine {
        limits: Some(&limits),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let live = [alices("a", &["GPU-test-0"])];
    let err = check(
        &alice_asks(),
        &m,
        &Occupancy::of(&live),
        &["GPU-test-1".into()],
    )
    .unwrap_err();
    let DecideError::LimitReached(reached) = &err else {
        panic!("{err}");
    };
    assert_eq!((reached.held, reached.wanted, reached.limit), (1, 1, 1));
    assert_eq!(err.code(), "limit");
    check(
        &alice_asks(),
        &m,
        &Occupancy::of(&live),
        &["GPU-test-0".into()],
    )
    .unwrap();
    // Root's own requests are not limited.
    let root = HolderMeta {
        limited: false,
        ..alice_asks()
    };
    check(&root, &m, &Occupancy::of(&live), &["GPU-test-1".into()]).unwrap();
}

#[test]
fn the_counts_hold_each_unit_once_per_record_and_removing_undoes_adding() {
    let inv = machine(3);
    let (g0, g2) = (inv.gpus[0].uuid.clone(), inv.gpus[2].uuid.clone());
    let shared = |id: &str, gpus: &[&str], reserve: u64| {
        let mut r = alices(id, gpus);
        r.request.share = crate::input::request::Share::Shared;
        r.request.reserve = Some(reserve);
        r.owner.as_mut().unwrap().groups = vec!["lab".into(), "lab".into()];
        r
    };
    let records = [
        record("a", &[&g0]),
        shared("b", &[&g2, &g2], 5),
        shared("c", &[&g2], 7),
        record("d", &["MIG-an-instance"]),
    ];
    let all = Occupancy::of(&records);
    let unit = |e, s, r| UnitUse {
        exclusive: e,
        shared: s,
        reserved: r,
    };
    assert_eq!(all.unit(&g0), unit(1, 0, 0));
    assert_eq!(all.unit(&g2), unit(0, 2, 12));
    assert_eq!(all.unit(&inv.gpus[1].uuid), unit(0, 0, 0));
    assert!(all.is_held("MIG-an-instance") && !all.is_held(&inv.gpus[1].uuid));
    assert_eq!(all.held_by_uid(1001).collect::<Vec<_>>(), [g2.as_str()]);
    assert_eq!(all.held_by_group("lab").collect::<Vec<_>>(), [g2.as_str()]);
    assert_eq!(all.held_by_uid(0).count(), 0);
    // Taking a record away leaves what the others alone would count, in any order.
    let mut less = all.clone();
    less.remove(&records[1]);
    assert_eq!(less, Occupancy::of([&records[3], &records[0], &records[2]]));
    assert_eq!(less.unit(&g2), unit(0, 1, 7));
    less.remove(&records[2]);
    less.remove(&records[0]);
    less.remove(&records[3]);
    assert_eq!(less, Occupancy::default());
}
