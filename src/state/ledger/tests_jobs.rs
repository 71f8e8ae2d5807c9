//! Holders that are people's: nesting (`within`), limits, holds, exec'd jobs.

use super::tests::{id, ledger};
use super::*;
use crate::base::message::one_line;
use crate::input::config::PolicyName;
use crate::input::request::{Origin, Selection};
use crate::model::holder::Owner;
use crate::model::limits::{GpuKey, GroupLimit, Limits, UserLimit};
use crate::policy::testing::machine;

pub(super) fn count(n: u32) -> GpuRequest {
    GpuRequest::new(Selection::Count(n), Origin::Cli)
}

fn within(parent: &str, selection: Selection) -> GpuRequest {
    GpuRequest {
        within: Some(parent.into()),
        ..GpuRequest::new(selection, Origin::Annotations)
    }
}

/// `within(parent, selection)` with the parent's key, as its owner hands it out.
fn keyed(l: &Ledger, parent: &str, selection: Selection) -> GpuRequest {
    let (_, key) = l.key(&id(parent)).unwrap().expect("the parent is held");
    GpuRequest {
        within_key: Some(key),
        ..within(parent, selection)
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
pub(super) fn job(user: &str, uid: u32, groups: &[&str]) -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(std::process::id() as i32),
        kind: HolderKind::Exec,
        owner: Some(owner(user, uid, groups)),
        limited: true,
        ..HolderMeta::default()
    }
}

pub(super) fn container() -> HolderMeta {
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

pub(super) fn devices(keys: &[&str]) -> GpuRequest {
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
            &keyed(&l, "slurm-42", Selection::Count(1)),
            &m,
            container(),
        )
        .unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-5"]);
    let b = l
        .allocate(
            &id("c2"),
            &keyed(&l, "slurm-42", Selection::All),
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
            &keyed(&l, "slurm-42", Selection::Count(1)),
            &m,
            container(),
        )
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "cannot allocate 1 GPU for c3: 2 of 8 GPUs held, 6 free; 0 can take within slurm-42; add gpupin.wait=10m to wait until they free up"
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
        "cannot allocate for j1: gpupin.within=res is alice's, not bob's (its owner can give you its key: gpupin key res)"
    );
    l.allocate(
        &id("j2"),
        &within("res", Selection::Count(1)),
        &m,
        job("alice", 1001, &[]),
    )
    .unwrap();
    // Alice hands bob the key: now he may.
    l.allocate(
        &id("j3"),
        &keyed(&l, "res", Selection::Count(1)),
        &m,
        job("bob", 1002, &[]),
    )
    .unwrap();
}

/// The review's first finding: a container whose env says `GPUPIN_WITHIN=bob-train`
/// (an image's `ENV`, a pod's `gpupin.within` annotation) got the GPUs of bob's running
/// job, or of root's maintenance hold. A name is no key.
#[test]
fn a_container_enters_no_holder_by_its_name_alone() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let m = Machine::new(&inv, PolicyName::Pack);
    let bobs = HolderMeta {
        owner: Some(owner("bob", 1002, &[])),
        ..job("bob", 1002, &[])
    };
    l.allocate(&id("bob-train"), &devices(&["5"]), &m, bobs)
        .unwrap();
    l.allocate(&id("maintenance-7"), &devices(&["7"]), &m, hold(true))
        .unwrap();
    for parent in ["bob-train", "maintenance-7"] {
        let err = l
            .allocate(
                &id("evil"),
                &within(parent, Selection::All),
                &m,
                container(),
            )
            .unwrap_err();
        assert_eq!(
            one_line(&err),
            format!(
                "cannot allocate for evil: taking GPUs from {parent} needs its key, not just its name: give gpupin.within={parent}:KEY (GPUPIN_WITHIN for env), with the key `gpupin key {parent}` prints for its owner or root"
            )
        );
        assert_eq!(err.code(), "within");
    }
    // A key that is another holder's, or made up, opens nothing either.
    let (_, bobs_key) = l.key(&id("bob-train")).unwrap().unwrap();
    let forged = GpuRequest {
        within_key: Some(bobs_key),
        ..within("maintenance-7", Selection::All)
    };
    let err = l
        .allocate(&id("evil"), &forged, &m, container())
        .unwrap_err();
    assert!(
        one_line(&err).contains("the key given for maintenance-7 is not its key"),
        "{}",
        one_line(&err)
    );
    let ids: Vec<String> = l.records().unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        ["bob-train", "maintenance-7"],
        "nothing held after a refusal"
    );
    // With its own key, a container may.
    let inside = l
        .allocate(
            &id("ok"),
            &keyed(&l, "bob-train", Selection::All),
            &m,
            container(),
        )
        .unwrap();
    assert_eq!(inside.record.gpus, ["GPU-test-5"]);
}

/// A key belongs to one holder's life: the holder released and made again under the same
/// name has a new key, and the old one opens nothing.
#[test]
fn a_key_dies_with_its_holder() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("res"), &devices(&["1"]), &m, hold(true))
        .unwrap();
    let old = keyed(&l, "res", Selection::All);
    l.release(&id("res")).unwrap();
    l.allocate(&id("res"), &devices(&["1"]), &m, hold(true))
        .unwrap();
    let err = l.allocate(&id("c1"), &old, &m, container()).unwrap_err();
    assert!(
        one_line(&err).contains("is not its key"),
        "{}",
        one_line(&err)
    );
}

/// Root's own requests (its `gpupin exec`, its holds, the device plugin's) enter any
/// holder without a key: root could read the node's secret anyway.
#[test]
fn roots_own_requests_need_no_key() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut bobs = hold(true);
    bobs.owner = Some(owner("bob", 1002, &[]));
    l.allocate(&id("res"), &devices(&["2"]), &m, bobs).unwrap();
    let roots = HolderMeta {
        kind: HolderKind::Exec,
        owner: Some(owner("root", 0, &[])),
        ..container()
    };
    let a = l
        .allocate(&id("j1"), &within("res", Selection::All), &m, roots)
        .unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-2"]);
}

fn limited_machine<'a>(inv: &'a crate::model::gpu::Inventory, limits: &'a Limits) -> Machine<'a> {
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
        "cannot allocate 1 GPU for s2: 2 of 8 GPUs held, 6 free; 0 can take the GPUs sue's groups may use; add --wait 10m to wait until they free up"
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
    let l = Ledger::open(&LedgerSettings {
        claim_grace: Duration::ZERO,
        ..LedgerSettings::at(l.dir())
    })
    .unwrap();
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

/// A pidfd of process `pid`.
fn pidfd_of(pid: u32) -> std::os::fd::OwnedFd {
    let pid = rustix::process::Pid::from_raw(pid as i32).unwrap();
    rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap()
}

fn sleeper() -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap()
}

#[test]
fn adopt_moves_a_record_only_from_the_process_it_names() {
    use std::os::fd::AsFd;
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut child = sleeper();
    let fd = pidfd_of(child.id());
    let me = std::process::id() as i32;
    l.allocate(&id("j"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let err = l
        .adopt(&id("j"), me + 1, child.id() as i32, fd.as_fd())
        .unwrap_err();
    assert!(
        one_line(&err).contains("its record names another process"),
        "{err}"
    );
    let r = l
        .adopt(&id("j"), me, child.id() as i32, fd.as_fd())
        .unwrap();
    assert_eq!(r.pid, Some(child.id() as i32));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        l.is_stale(&l.records().unwrap()[0]),
        "the job's end ends the hold"
    );
}

/// Issue 19, finding 12: the job was checked through a pidfd, then its pid is used bare.
/// A pid that names another process by then (here: the pidfd's process has ended, the
/// pid is a live stranger's) gets no record.
#[test]
fn adopt_refuses_a_pid_whose_pinned_process_has_ended() {
    use std::os::fd::AsFd;
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let me = std::process::id() as i32;
    let mut checked = sleeper();
    let fd = pidfd_of(checked.id());
    checked.kill().unwrap();
    checked.wait().unwrap();
    let mut stranger = sleeper();
    l.allocate(&id("j"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let before = l.records().unwrap();
    let err = l
        .adopt(&id("j"), me, stranger.id() as i32, fd.as_fd())
        .unwrap_err();
    assert!(one_line(&err).contains("the job is gone"), "{err}");
    assert_eq!(l.records().unwrap(), before, "the stranger got no record");
    stranger.kill().unwrap();
    stranger.wait().unwrap();
}

/// A fake cgroup2 job cgroup (`gpupin-<name>` in a temp dir) whose cgroup.events says
/// `populated`.
fn fake_cgroup(tmp: &std::path::Path, name: &str, populated: bool) -> std::path::PathBuf {
    let dir = tmp.join(format!("gpupin-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    set_populated(&dir, populated);
    dir
}

fn set_populated(dir: &std::path::Path, populated: bool) {
    let events = format!("populated {}\nfrozen 0\n", u8::from(populated));
    std::fs::write(dir.join("cgroup.events"), events).unwrap();
}

/// Issue 19, finding 7: a job whose main process ended while a process it left runs on in
/// its cgroup keeps its GPUs and counts toward its user's limit; the next allocation does
/// not reap it. Once the cgroup is empty it is stale, and the reap removes the cgroup.
#[test]
fn a_job_whose_cgroup_still_has_processes_is_not_reaped() {
    use std::os::fd::AsFd;
    let (t, l) = ledger();
    let inv = machine(4);
    let limits = Limits {
        max_gpus_per_user: Some(1),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    let me = std::process::id() as i32;
    let mut main = sleeper();
    let fd = pidfd_of(main.id());
    let held = l
        .allocate(&id("j"), &devices(&["2"]), &m, job("alice", 1001, &[]))
        .unwrap()
        .record;
    l.adopt(&id("j"), me, main.id() as i32, fd.as_fd()).unwrap();
    let cgroups = t.path().join("cgroups");
    let dir = fake_cgroup(&cgroups, "j", true);
    l.record_cgroups(&id("j"), main.id() as i32, std::slice::from_ref(&dir))
        .unwrap();
    assert_eq!(l.records().unwrap()[0].cgroups, std::slice::from_ref(&dir));
    main.kill().unwrap();
    main.wait().unwrap();

    assert!(!l.is_stale(&l.records().unwrap()[0]), "leftovers run");
    let exclusive = |holder: &str, user: &str, uid: u32| {
        l.allocate(&id(holder), &devices(&["2"]), &m, job(user, uid, &[]))
    };
    let err = exclusive("b", "bob", 1002).unwrap_err();
    assert!(one_line(&err).contains("GPU 2"), "{err}");
    let err = l
        .allocate(&id("a2"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap_err();
    assert!(
        one_line(&err).starts_with("alice holds 1 GPU and alice asks for 1 more"),
        "{err}"
    );
    assert_eq!(l.records().unwrap().len(), 1, "not reaped");
    assert_eq!(l.records().unwrap()[0].gpus, held.gpus);

    set_populated(&dir, false);
    assert!(l.is_stale(&l.records().unwrap()[0]));
    std::fs::remove_file(dir.join("cgroup.events")).unwrap();
    // A real cgroup's files go with it; a fake one must be empty to be removed.
    exclusive("b", "bob", 1002).unwrap();
    assert!(!dir.exists(), "the reap removed the job's cgroup");
}

#[test]
fn a_jobs_cgroups_are_recorded_only_for_the_process_its_record_names() {
    let (t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("j"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let before = l.records().unwrap();
    let dir = fake_cgroup(t.path(), "j", true);
    let err = l.record_cgroups(&id("j"), 1, &[dir]).unwrap_err();
    assert!(one_line(&err).contains("names another process"), "{err}");
    assert_eq!(l.records().unwrap(), before);
}

/// Records written before the field existed read with no cgroups.
#[test]
fn an_older_record_without_cgroups_reads() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let r = l
        .allocate(&id("old"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap()
        .record;
    let text = serde_json::to_string(&r).unwrap();
    assert!(!text.contains("cgroups"), "{text}");
    let back: Record = serde_json::from_str(&text).unwrap();
    assert!(back.cgroups.is_empty());
}

#[test]
fn a_user_releases_only_their_own_holders() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a1"), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    let err = l.release_for(&id("a1"), 1002).unwrap_err();
    // The requester by name where /etc/passwd has one, else by uid.
    let err = one_line(&err);
    assert!(
        err.starts_with("holder a1 is alice's, not ")
            && err.ends_with("'s: only alice or root may release it"),
        "{err}"
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
    // Alice's holders are in her own log (audit.users/1001.log).
    let text = std::fs::read_to_string(l.dir().join("audit.users/1001.log")).unwrap();
    let events: Vec<crate::state::audit::Event> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{text}");
    assert_eq!(events[0].event, crate::state::audit::EventKind::Allocate);
    assert_eq!(events[0].user.as_deref(), Some("alice"));
    assert_eq!(events[0].uid, Some(1001));
    assert_eq!(
        events[0].gpus.iter().map(|g| g.index).collect::<Vec<_>>(),
        [Some(0), Some(1)]
    );
    assert_eq!(events[1].event, crate::state::audit::EventKind::Release);
    assert_eq!(events[1].held_s, Some(0));
}

/// The review's sixth finding: alice took `slurm-105` before root's prolog did, which
/// then failed (a drained node) or handed her job the squatted GPU. Users may not choose
/// the ids gpupin's integrations make.
#[test]
fn a_user_cannot_take_an_id_gpupin_makes_itself() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let mut alices = hold(false);
    alices.owner = Some(owner("alice", 1001, &[]));
    alices.limited = true;
    alices.pid = Some(std::process::id() as i32);
    let pid = std::process::id();
    let not_hers = [
        format!("exec-{pid}-"),
        format!("exec-{pid}-x"),
        format!("exec-{pid}0"),
        format!("exec-{}-2", pid + 1),
    ];
    let names = ["slurm-105", "k8s-0123456789abcdef", "claim-00", "exec-1"]
        .map(String::from)
        .into_iter()
        .chain(not_hers);
    for name in names {
        let name = name.as_str();
        let err = l
            .allocate(&id(name), &devices(&["0"]), &m, alices.clone())
            .unwrap_err();
        assert_eq!(
            one_line(&err),
            format!(
                "holder name \"{name}\" starts with {}-, which gpupin keeps for the holders it names itself (Slurm jobs, pods, claims, unnamed jobs): choose another name",
                name.split('-').next().unwrap()
            )
        );
    }
    assert!(l.records().unwrap().is_empty());
    // Her own unnamed job is exec-<the pid that asks>, as gpupin serve names it.
    let own = format!("exec-{}", std::process::id());
    l.allocate(&id(&own), &count(1), &m, job("alice", 1001, &[]))
        .unwrap();
    // And exec-<pid>-<n>, the name gpupin gives it beside a leftover job of the first.
    l.allocate(
        &id(&format!("{own}-2")),
        &count(1),
        &m,
        job("alice", 1001, &[]),
    )
    .unwrap();
    // Root's prolog may.
    l.allocate(&id("slurm-105"), &devices(&["3"]), &m, hold(true))
        .unwrap();
}

/// A hold asked again (a retried prolog) gets the GPUs it names, or an error: never
/// other GPUs a record of that name happens to hold.
#[test]
fn a_hold_asked_again_for_other_gpus_is_refused() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    let first = l
        .allocate(&id("slurm-105"), &devices(&["0"]), &m, hold(true))
        .unwrap();
    let again = l
        .allocate(&id("slurm-105"), &devices(&["0"]), &m, hold(true))
        .unwrap();
    assert_eq!(again.record, first.record);
    let err = l
        .allocate(&id("slurm-105"), &devices(&["3"]), &m, hold(true))
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        "holder slurm-105 holds GPUs 0 already, not the GPUs 3 asked for: release it first (gpupin release slurm-105)"
    );
    assert_eq!(l.records().unwrap(), [first.record]);
}

/// Two levels deep: the grandparent's holding of the GPU its grandchild takes stands in no
/// one's way, as the parent's does not.
#[test]
fn a_request_two_levels_deep_takes_from_its_parents_gpus() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("a-outer"), &devices(&["5", "6"]), &m, hold(true))
        .unwrap();
    let middle = GpuRequest {
        selection: Selection::Devices(vec!["5".into()]),
        ..within("a-outer", Selection::All)
    };
    l.allocate(&id("b-middle"), &middle, &m, hold(true))
        .unwrap();
    let inner = l
        .allocate(
            &id("c-inner"),
            &within("b-middle", Selection::Count(1)),
            &m,
            hold(true),
        )
        .unwrap();
    assert_eq!(inner.record.gpus, ["GPU-test-5"]);
}

/// Enclosing holders that name each other (a parent released and its name taken again
/// inside its own child) end the walk up the chain; the request is still served.
#[test]
fn a_loop_of_enclosing_holders_ends_the_walk() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let m = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("x"), &devices(&["1", "2"]), &m, hold(true))
        .unwrap();
    let y = GpuRequest {
        selection: Selection::Devices(vec!["1".into(), "2".into()]),
        ..within("x", Selection::All)
    };
    l.allocate(&id("y"), &y, &m, hold(true)).unwrap();
    l.release(&id("x")).unwrap();
    let x_again = GpuRequest {
        selection: Selection::Devices(vec!["1".into(), "2".into()]),
        ..within("y", Selection::All)
    };
    l.allocate(&id("x"), &x_again, &m, hold(true)).unwrap();
    let inner = l
        .allocate(&id("z"), &within("x", Selection::Count(1)), &m, hold(true))
        .unwrap();
    assert_eq!(inner.record.gpus, ["GPU-test-1"]);
}

/// Within a holder, a user whose groups may use only some GPUs gets only GPUs that are
/// both the holder's and the group's: the scopes intersect.
#[test]
fn a_nested_request_of_a_restricted_group_gets_what_both_allow() {
    let (_t, l) = ledger();
    let inv = machine(8);
    let limits = Limits {
        groups: [(
            "students".to_string(),
            GroupLimit {
                max_gpus: None,
                gpus: Some(vec![GpuKey::Index(0), GpuKey::Index(1), GpuKey::Index(2)]),
            },
        )]
        .into(),
        ..Limits::default()
    };
    let m = limited_machine(&inv, &limits);
    let mut sams = hold(true);
    sams.owner = Some(owner("sam", 1005, &["students"]));
    l.allocate(&id("res"), &devices(&["2", "3"]), &m, sams)
        .unwrap();
    let err = l
        .allocate(
            &id("j1"),
            &within("res", Selection::Count(2)),
            &m,
            job("sam", 1005, &["students"]),
        )
        .unwrap_err();
    assert!(
        one_line(&err).starts_with("cannot allocate 2 GPUs for j1"),
        "{}",
        one_line(&err)
    );
    let one = l
        .allocate(
            &id("j2"),
            &within("res", Selection::Count(1)),
            &m,
            job("sam", 1005, &["students"]),
        )
        .unwrap();
    assert_eq!(one.record.gpus, ["GPU-test-2"]);
}
