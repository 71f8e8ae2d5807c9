//! Holders that are people's: nesting (`within`), limits, holds, exec'd jobs.

use super::tests::{id, ledger};
use super::*;
use crate::limits::{GpuKey, GroupLimit, Limits, UserLimit};
use crate::message::one_line;
use crate::policy::PolicyName;
use crate::policy::testing::machine;
use crate::request::{Origin, Selection};

fn count(n: u32) -> GpuRequest {
    GpuRequest::new(Selection::Count(n), Origin::Cli)
}

fn within(parent: &str, selection: Selection) -> GpuRequest {
    GpuRequest {
        within: Some(parent.into()),
        ..GpuRequest::new(selection, Origin::Annotations)
    }
}

fn owner(user: &str, uid: u32, groups: &[&str]) -> Owner {
    Owner {
        uid,
        user: user.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

/// A job of `user`'s running as this test process, limited as a user's request is.
fn job(user: &str, uid: u32, groups: &[&str]) -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        kind: HolderKind::Exec,
        owner: Some(owner(user, uid, groups)),
        limited: true,
        ..HolderMeta::default()
    }
}

fn container() -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        ..HolderMeta::default()
    }
}

fn hold(until_release: bool) -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        kind: HolderKind::Hold,
        until_release,
        ..HolderMeta::default()
    }
}

fn devices(keys: &[&str]) -> GpuRequest {
    GpuRequest::new(
        Selection::Devices(keys.iter().map(|k| k.to_string()).collect()),
        Origin::Cli,
    )
}

#[test]
fn a_nested_request_takes_from_its_holders_gpus_not_the_free_pool() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("slurm-42"), &devices(&["5", "6"]), &m, hold(true))
        .unwrap();
    let a = l
        .allocate(
            &id("c1"),
            &within("slurm-42", Selection::Count(1)),
            &m,
            container(),
        )
        .unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-5"]);
    let b = l
        .allocate(
            &id("c2"),
            &within("slurm-42", Selection::All),
            &m,
            container(),
        )
        .unwrap();
    assert_eq!(
        b.record.gpus,
        ["GPU-test-6"],
        "all that is left inside the hold"
    );
    let err = l
        .allocate(
            &id("c3"),
            &within("slurm-42", Selection::Count(1)),
            &m,
            container(),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate 1 GPU for c3: 2 of 8 GPUs held, 6 free; 0 can take within slurm-42"
    );
    // The free pool is untouched by the nested holders: the hold has 5 and 6 already.
    let free = l.allocate(&id("c4"), &count(6), &m, container()).unwrap();
    assert_eq!(free.record.gpus.len(), 6);
    assert!(!free.record.gpus.contains(&"GPU-test-5".to_string()));
}

#[test]
fn a_nested_request_names_a_holder_that_exists() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let err = l
        .allocate(
            &id("c1"),
            &within("nobody", Selection::Count(1)),
            &m,
            container(),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate for c1: gpupin.within=nobody names no holder in the ledger"
    );
    assert!(l.records().unwrap().is_empty());
}

#[test]
fn a_user_may_only_nest_inside_their_own_holders() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut alices = hold(true);
    alices.owner = Some(owner("alice", 1001, &[]));
    l.allocate(&id("res"), &count(2), &m, alices).unwrap();
    let err = l
        .allocate(
            &id("j1"),
            &within("res", Selection::Count(1)),
            &m,
            job("bob", 1002, &[]),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate for j1: gpupin.within=res is alice's, not bob's"
    );
    l.allocate(
        &id("j2"),
        &within("res", Selection::Count(1)),
        &m,
        job("alice", 1001, &[]),
    )
    .unwrap();
}

fn limited_machine<'a>(inv: &'a crate::inventory::Inventory, limits: &'a Limits) -> Machine<'a> {
    Machine {
        limits: Some(limits),
        ..Machine::new(inv, PolicyName::Pack)
    }
}

#[test]
fn a_user_at_their_limit_is_refused_with_the_limit_named() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let limits = Limits {
        max_gpus_per_user: Some(2),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    l.allocate(&id("a1"), &count(2), &m, job("alice", 1001, &[]))
        .unwrap();
    let before = l.records().unwrap();
    let err = l
        .allocate(&id("a2"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "alice holds 2 GPUs and alice asks for 1 more; their limit is 2 (limits.max_gpus_per_user)"
    );
    assert_eq!(l.records().unwrap(), before, "nothing held after a refusal");
    // Another user, a container and root's own requests are not alice's.
    l.allocate(&id("b1"), &count(2), &m, job("bob", 1002, &[]))
        .unwrap();
    l.allocate(&id("c1"), &count(3), &m, container()).unwrap();
    let mut root = job("root", 0, &[]);
    root.limited = false;
    l.allocate(&id("r1"), &count(1), &m, root).unwrap();
}

#[test]
fn a_users_own_limit_and_a_groups_shared_limit_both_count() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let limits = Limits {
        max_gpus_per_user: Some(1),
        users: [("alice".to_string(), UserLimit { max_gpus: Some(3) })].into(),
        groups: [(
            "vision".to_string(),
            GroupLimit {
                max_gpus: Some(4),
                gpus: None,
            },
        )]
        .into(),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    l.allocate(&id("a1"), &count(3), &m, job("alice", 1001, &["vision"]))
        .unwrap();
    l.allocate(&id("b1"), &count(1), &m, job("bob", 1002, &["vision"]))
        .unwrap();
    let err = l
        .allocate(&id("c1"), &count(1), &m, job("carol", 1003, &["vision"]))
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "group vision holds 4 GPUs and carol asks for 1 more; the group's limit is 4 (limits.groups.vision.max_gpus)"
    );
}

#[test]
fn a_job_inside_its_own_hold_adds_nothing_to_the_count() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let limits = Limits {
        max_gpus_per_user: Some(2),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    l.allocate(&id("mine"), &count(2), &m, job("alice", 1001, &[]))
        .unwrap();
    l.allocate(
        &id("inner"),
        &within("mine", Selection::Count(1)),
        &m,
        job("alice", 1001, &[]),
    )
    .unwrap();
}

#[test]
fn a_groups_gpus_are_the_only_ones_its_members_get() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let limits = Limits {
        groups: [(
            "students".to_string(),
            GroupLimit {
                max_gpus: None,
                gpus: Some(vec![GpuKey::Index(6), GpuKey::Name("GPU-test-7".into())]),
            },
        )]
        .into(),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    let a = l
        .allocate(&id("s1"), &count(2), &m, job("sam", 1005, &["students"]))
        .unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-6", "GPU-test-7"]);
    let err = l
        .allocate(&id("s2"), &count(1), &m, job("sue", 1006, &["students"]))
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate 1 GPU for s2: 2 of 8 GPUs held, 6 free; 0 can take the GPUs sue's groups may use"
    );
    let err = l
        .allocate(
            &id("s3"),
            &devices(&["0"]),
            &m,
            job("sue", 1006, &["students"]),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate GPU 0 (GPU-test-0) for s3: it is not among the GPUs this request may take (the GPUs sue's groups may use)"
    );
}

#[test]
fn an_exec_name_in_use_is_refused_and_a_hold_made_again_is_the_same_hold() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("train"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let err = l
        .allocate(&id("train"), &count(1), &m, job("bob", 1002, &[]))
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "holder train exists already (exec of alice): choose another name"
    );
    let first = l
        .allocate(&id("h"), &devices(&["3"]), &m, hold(true))
        .unwrap();
    let again = l
        .allocate(&id("h"), &devices(&["3"]), &m, hold(true))
        .unwrap();
    assert_eq!(first.record, again.record);
}

#[test]
fn a_hold_until_release_outlives_the_grace_and_goes_with_release() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let l = l.with_unbound_grace(Duration::ZERO);
    let h = l
        .allocate(&id("maint"), &devices(&["2"]), &m, hold(true))
        .unwrap();
    assert_eq!(h.record.indices, [2]);
    std::thread::sleep(Duration::from_millis(1100));
    l.gc().unwrap();
    assert_eq!(l.records().unwrap().len(), 1, "still held");
    let unbound = l
        .allocate(&id("brief"), &devices(&["1"]), &m, hold(false))
        .unwrap();
    assert!(l.is_stale(&unbound.record) || unbound.record.pid.is_none());
    assert!(l.release(&id("maint")).unwrap().is_some());
}

#[test]
fn adopt_moves_a_record_only_from_the_process_it_names() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let me = std::process::id() as i32;
    l.allocate(&id("j"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let err = l.adopt(&id("j"), me + 1, child.id() as i32).unwrap_err();
    assert!(
        one_line(&err).contains("its record names another process"),
        "{err}"
    );
    let r = l.adopt(&id("j"), me, child.id() as i32).unwrap();
    assert_eq!(r.pid, Some(child.id() as i32));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        l.is_stale(&l.records().unwrap()[0]),
        "the job's end ends the hold"
    );
}

#[test]
fn a_user_releases_only_their_own_holders() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a1"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let err = l.release_for(&id("a1"), 1002).unwrap_err();
    assert_eq!(
        one_line(&err),
        "holder a1 is not held by uid 1002: only its owner or root may release it"
    );
    assert_eq!(l.records().unwrap().len(), 1);
    assert!(l.release_for(&id("a1"), 1001).unwrap().is_some());
}

#[test]
fn audit_lines_tell_who_held_what_and_for_how_long() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a1"), &count(2), &m, job("alice", 1001, &[]))
        .unwrap();
    l.release(&id("a1")).unwrap();
    let text = std::fs::read_to_string(l.dir().join("audit.log")).unwrap();
    let events: Vec<crate::audit::Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[0].event, crate::audit::EventKind::Allocate);
    assert_eq!(events[0].user.as_deref(), Some("alice"));
    assert_eq!(events[0].uid, Some(1001));
    assert_eq!(
        events[0].gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        [Some(0), Some(1)]
    );
    assert_eq!(events[1].event, crate::audit::EventKind::Release);
    assert_eq!(events[1].held_s, Some(0));
}
