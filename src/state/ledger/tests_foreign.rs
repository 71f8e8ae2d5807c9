//! Processes on GPUs that no holder owns (`foreign = "avoid"`): which GPUs they keep from
//! an exclusive request, and how a refusal names them.

use super::tests::{id, ledger};
use super::*;
use crate::base::message::one_line;
use crate::host::whose::{Process, Seen};
use crate::input::config::PolicyName;
use crate::input::request::{Origin, Selection};
use crate::policy::testing::machine;
use std::process::{Child, Command, Stdio};

fn count(n: u32) -> GpuRequest {
    GpuRequest::new(Selection::Count(n), Origin::Annotations)
}

fn devices(keys: &[&str]) -> GpuRequest {
    GpuRequest::new(
        Selection::Devices(keys.iter().map(|k| k.to_string()).collect()),
        Origin::Annotations,
    )
}

fn me() -> i32 {
    std::process::id() as i32
}

/// A holder whose process is this test's.
fn meta() -> HolderMeta {
    HolderMeta {
        source: "test".into(),
        pid: Some(me()),
        ..HolderMeta::default()
    }
}

/// A real process to stand on a GPU (the foreign check skips processes that have
/// ended); killed when dropped.
struct Sleeper(Child);

impl Sleeper {
    fn start() -> Sleeper {
        let child = Command::new("sleep")
            .arg("1000")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Sleeper(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }

    /// It on a GPU, run by bob, with `ancestors` and `cgroup` as /proc would tell.
    fn seen(&self, ancestors: &[i32], cgroup: &str) -> Seen {
        let pid = self.pid();
        Seen {
            pid,
            used_memory: Some(1 << 30),
            process: Some(Process {
                pid,
                start_time: crate::base::procinfo::start_time(pid).unwrap(),
                uid: Some(1000),
                user: Some("bob".into()),
                command: "python train.py".into(),
                ancestors: ancestors.to_vec(),
                cgroup: cgroup.into(),
            }),
        }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `seen` on the GPUs at `positions` of a machine of `n`.
fn on(n: usize, placed: &[(usize, Seen)]) -> Vec<Vec<Seen>> {
    let mut gpus = vec![Vec::new(); n];
    for (p, seen) in placed {
        gpus[*p].push(seen.clone());
    }
    gpus
}

#[test]
fn an_exclusive_request_skips_a_gpu_with_a_process_of_no_holder() {
    let (_t, l) = ledger();
    let inv = machine(3);
    let bob = Sleeper::start();
    let processes = on(3, &[(0, bob.seen(&[1], "0::/user.slice\n"))]);
    let m = Machine {
        processes: Some(&processes),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let a = l.allocate(&id("a"), &count(1), &m, meta()).unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-1"], "pack would take 0");
    let err = l.allocate(&id("b"), &count(2), &m, meta()).unwrap_err();
    assert_eq!(
        one_line(&err),
        format!(
            "cannot allocate 2 GPUs for b: 1 of 3 GPUs held, 1 free; GPU 0 runs pid {} (bob: python train.py), not started through gpupin; add gpupin.wait=10m to wait until they free up",
            bob.pid()
        )
    );
    let err = l
        .allocate(&id("c"), &devices(&["0"]), &m, meta())
        .unwrap_err();
    assert_eq!(
        one_line(&err),
        format!(
            "cannot allocate GPU 0 (GPU-test-0) for c: it runs pid {} (bob: python train.py), not started through gpupin",
            bob.pid()
        )
    );
}

#[test]
fn without_processes_or_sharing_nothing_is_avoided() {
    let (_t, l) = ledger();
    let inv = machine(1);
    let bob = Sleeper::start();
    let processes = on(1, &[(0, bob.seen(&[1], ""))]);
    let ignoring = Machine::new(&inv, PolicyName::Pack);
    assert_eq!(ignoring.processes, None);
    let preview = l.preview(&count(1), &ignoring).unwrap();
    assert_eq!(preview, ["GPU-test-0"]);
    let avoiding = Machine {
        processes: Some(&processes),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let mut shared = count(1);
    shared.share = crate::input::request::Share::Shared;
    let s = l.allocate(&id("s"), &shared, &avoiding, meta()).unwrap();
    assert_eq!(
        s.record.gpus,
        ["GPU-test-0"],
        "a shared request shares anyway"
    );
}

#[test]
fn a_process_that_ended_since_it_was_seen_is_in_no_ones_way() {
    let (_t, l) = ledger();
    let inv = machine(1);
    let mut bob = Sleeper::start();
    let processes = on(1, &[(0, bob.seen(&[1], ""))]);
    let m = Machine {
        processes: Some(&processes),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    assert!(l.preview(&count(1), &m).is_err());
    bob.0.kill().unwrap();
    bob.0.wait().unwrap();
    let a = l.allocate(&id("a"), &count(1), &m, meta()).unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-0"]);
}

#[test]
fn a_holders_process_on_a_gpu_it_does_not_hold_is_named_as_its() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let plain = Machine::new(&inv, PolicyName::Pack);
    l.allocate(&id("trainer"), &devices(&["0"]), &plain, meta())
        .unwrap();
    // A child of the holder's process (this test), on GPU 1.
    let child = Sleeper::start();
    let processes = on(2, &[(1, child.seen(&[me(), 1], ""))]);
    let m = Machine {
        processes: Some(&processes),
        ..plain
    };
    let err = l.allocate(&id("b"), &count(1), &m, meta()).unwrap_err();
    assert_eq!(
        one_line(&err),
        format!(
            "cannot allocate 1 GPU for b: 1 of 2 GPUs held, 0 free; GPU 1 runs pid {} (bob: python train.py) of holder trainer, which does not hold it; add gpupin.wait=10m to wait until they free up",
            child.pid()
        )
    );
}

#[test]
fn a_nested_request_shares_its_gpus_with_its_enclosing_holders_processes() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let plain = Machine::new(&inv, PolicyName::Pack);
    let job = HolderMeta {
        kind: HolderKind::Hold,
        ..meta()
    };
    l.allocate(&id("slurm-7"), &devices(&["1"]), &plain, job)
        .unwrap();
    let step = Sleeper::start();
    let processes = on(2, &[(1, step.seen(&[me(), 1], ""))]);
    let m = Machine {
        processes: Some(&processes),
        ..plain
    };
    let (_, key) = l.key(&id("slurm-7")).unwrap().unwrap();
    let nested = GpuRequest {
        within: Some("slurm-7".into()),
        within_key: Some(key),
        ..count(1)
    };
    let a = l.allocate(&id("step"), &nested, &m, meta()).unwrap();
    assert_eq!(a.record.gpus, ["GPU-test-1"]);
}

#[test]
fn many_foreign_gpus_are_counted_past_the_first_two() {
    let (_t, l) = ledger();
    let inv = machine(4);
    let bob = Sleeper::start();
    let seen = bob.seen(&[1], "");
    let processes = on(
        4,
        &[
            (0, seen.clone()),
            (1, seen.clone()),
            (2, seen.clone()),
            (3, seen),
        ],
    );
    let m = Machine {
        processes: Some(&processes),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    let err = one_line(&l.allocate(&id("a"), &count(1), &m, meta()).unwrap_err());
    assert!(err.contains("; GPU 0 runs pid"), "{err}");
    assert!(err.contains("; GPU 1 runs pid"), "{err}");
    assert!(!err.contains("GPU 2 runs"), "{err}");
    assert!(
        err.ends_with("; 2 more GPUs run processes of no holder of theirs; add gpupin.wait=10m to wait until they free up"),
        "{err}"
    );
}

/// Issue 32, item 10: a request that waited was decided on the machine as it was when it
/// was queued, so a GPU a process of no holder took during the wait was handed out. Now
/// the figures are read again before each look (`HolderMeta::figures_now`): GPU 0, freed
/// while bob's process runs on it, is passed over, and the waiter gets GPU 1.
#[test]
fn a_wait_is_decided_on_the_processes_running_when_it_is_served() {
    let (_t, l) = ledger();
    let inv = machine(2);
    let none: Vec<Vec<Seen>> = vec![Vec::new(), Vec::new()];
    let m = Machine {
        processes: Some(&none),
        ..Machine::new(&inv, PolicyName::Pack)
    };
    l.allocate(&id("a"), &count(1), &m, meta()).unwrap();
    l.allocate(&id("b"), &count(1), &m, meta()).unwrap();
    let bob = std::sync::Arc::new(Sleeper::start());
    let appeared = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (seen_by, bobs) = (
        std::sync::Arc::clone(&appeared),
        std::sync::Arc::clone(&bob),
    );
    let waiting = HolderMeta {
        figures_now: Some(FiguresNow(std::sync::Arc::new(move || {
            let on_0 = match seen_by.load(std::sync::atomic::Ordering::SeqCst) {
                true => vec![bobs.seen(&[1], "0::/user.slice\n")],
                false => Vec::new(),
            };
            Figures {
                live: None,
                processes: Some(vec![on_0, Vec::new()]),
            }
        }))),
        ..meta()
    };
    let dir = l.dir().to_path_buf();
    let inv2 = inv.clone();
    let waiter = std::thread::spawn(move || {
        let l = Ledger::open(&LedgerSettings::at(&dir)).unwrap();
        let none: Vec<Vec<Seen>> = vec![Vec::new(), Vec::new()];
        let m = Machine {
            processes: Some(&none),
            ..Machine::new(&inv2, PolicyName::Pack)
        };
        l.allocate_waiting(
            &id("w"),
            &count(1),
            &m,
            waiting,
            std::time::Duration::from_secs(60),
        )
    });
    while l.waiting().unwrap().is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Bob's process starts on GPU 0, then its holder goes.
    appeared.store(true, std::sync::atomic::Ordering::SeqCst);
    l.release(&id("a")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(600));
    assert_eq!(
        l.waiting().unwrap().len(),
        1,
        "GPU 0 runs bob's process: still waiting"
    );
    l.release(&id("b")).unwrap();
    let got = waiter
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("{}", one_line(&e)));
    assert_eq!(got.record.gpus, ["GPU-test-1"]);
}
