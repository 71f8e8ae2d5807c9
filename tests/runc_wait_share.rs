//! Waiting and sharing through real runc containers: `gpupin.wait` queues a container's
//! start until its GPUs are free, in arrival order; shared holders sit together on a GPU
//! up to the limit and within its memory, and exclusive ones never join them.

use gpupin_sandbox::harness::{self, Sandbox};
use gpupin_sandbox::{Container, SandboxError};
use std::path::Path;
use std::time::Duration;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// A two-GPU machine (an inventory file), so that the third request has to wait.
fn two_gpus() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/two-gpus.json")
        .display()
        .to_string()
}

fn queued(sb: &Sandbox) -> usize {
    std::fs::read_dir(sb.gpupin.state_dir.join("queue")).map_or(0, |d| d.count())
}

/// Polls until `n` requests wait in the queue; the waiting hooks are real processes that
/// take a moment to start.
fn wait_until_queued(sb: &Sandbox, n: usize) {
    for _ in 0..300 {
        if queued(sb) == n {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("expected {n} waiting requests, found {}", queued(sb));
}

fn start_count(
    sb: &Sandbox,
    name: &str,
    extra: &[(&str, &str)],
) -> Result<Container, SandboxError> {
    let id = sb.id(name);
    let mut spec = sb.spec().annotation("gpupin.count", "1");
    for (k, v) in extra {
        spec = spec.annotation(k, v);
    }
    sb.start(&id, &spec)
}

#[test]
fn waiting_containers_start_in_arrival_order_as_gpus_free_up() {
    let Some(sb) = Sandbox::with_machine(GPUPIN, "waiting_containers_start_in_order", &two_gpus())
    else {
        return;
    };
    let first = start_count(&sb, "first", &[]).unwrap();
    let second = start_count(&sb, "second", &[]).unwrap();
    let first_minors = sb.gpupin.held_minors(first.id());
    std::thread::scope(|s| {
        let third = s.spawn(|| start_count(&sb, "third", &[("gpupin.wait", "25s")]));
        wait_until_queued(&sb, 1);
        let fourth = s.spawn(|| start_count(&sb, "fourth", &[("gpupin.wait", "25s")]));
        wait_until_queued(&sb, 2);
        assert!(
            !third.is_finished() && !fourth.is_finished(),
            "both wait while 2 of 2 GPUs are held"
        );
        // The queue, as an admin sees it: in `gpupin queue` and in `gpupin status`.
        let queue = gpupin_sandbox::harness::stdout(&sb.gpupin.run(&["queue"], ""));
        let rows: Vec<Vec<&str>> = queue
            .lines()
            .skip(1)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows.len(), 2, "{queue}");
        for (row, (position, name)) in rows.iter().zip([("1", "-third"), ("2", "-fourth")]) {
            assert!(
                row[0] == position
                    && row[1].ends_with(name)
                    && row[2] == "-"
                    && row[3].parse::<i32>().is_ok()
                    && row[4] == "count=1",
                "{queue}"
            );
        }
        let status = sb.gpupin.status();
        let waiting: Vec<&str> = status["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["holder"].as_str().unwrap())
            .collect();
        assert!(
            waiting.len() == 2 && waiting[0].ends_with("-third") && waiting[1].ends_with("-fourth"),
            "{waiting:?}"
        );
        let table = gpupin_sandbox::harness::stdout(&sb.gpupin.run(&["status"], ""));
        assert!(
            table.contains("0 of 2 GPUs free, 2 holders, 2 waiting"),
            "{table}"
        );
        assert!(table.contains("WAITING"), "{table}");

        first.stop().unwrap();
        let third = third
            .join()
            .unwrap()
            .expect("the earlier waiter starts first");
        assert_eq!(
            sb.gpupin.held_minors(third.id()),
            first_minors,
            "it gets the freed GPU"
        );
        assert_eq!(queued(&sb), 1, "the later waiter still waits");
        assert!(!fourth.is_finished());

        second.stop().unwrap();
        let fourth = fourth
            .join()
            .unwrap()
            .expect("the later waiter starts next");
        assert_eq!(
            sb.gpupin.holder(fourth.id()).unwrap()["gpus"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert_eq!(queued(&sb), 0);
    });
}

#[test]
fn an_expired_wait_fails_the_start_and_leaves_nothing_behind() {
    let Some(sb) = Sandbox::with_machine(GPUPIN, "an_expired_wait_fails", &two_gpus()) else {
        return;
    };
    let _a = start_count(&sb, "a", &[]).unwrap();
    let _b = start_count(&sb, "b", &[]).unwrap();
    let before = sb.gpupin.ledger_snapshot();
    let err = start_count(&sb, "late", &[("gpupin.wait", "1s")])
        .unwrap_err()
        .to_string();
    let msg = gpupin_sandbox::hook_message(&err).unwrap_or(err.clone());
    assert!(
        msg.contains("gave up waiting for GPUs for") && msg.contains("after 1s"),
        "{msg}"
    );
    assert!(msg.contains("2 of 2 GPUs held"), "{msg}");
    assert_eq!(
        sb.gpupin.ledger_snapshot(),
        before,
        "no record for the late container"
    );
    assert_eq!(queued(&sb), 0, "no ticket left in the queue");
}

#[test]
fn shared_holders_coexist_within_limit_and_memory_and_exclusive_ones_skip_them() {
    let Some(sb) = Sandbox::with_config(
        GPUPIN,
        "shared_holders_coexist",
        &two_gpus(),
        "max_shared = 2",
    ) else {
        return;
    };
    let shared = [("gpupin.share", "shared"), ("gpupin.reserve", "30GiB")];
    let s1 = start_count(&sb, "s1", &shared).unwrap();
    let s2 = start_count(&sb, "s2", &shared).unwrap();
    assert_eq!(sb.gpupin.held_minors(s1.id()), [0]);
    assert_eq!(
        sb.gpupin.held_minors(s2.id()),
        [0],
        "two shared holders on one GPU"
    );
    assert_eq!(harness::nvidia_gpu_nodes(&s2), ["nvidia0"]);

    let ex = start_count(&sb, "ex", &[]).unwrap();
    assert_eq!(
        sb.gpupin.held_minors(ex.id()),
        [1],
        "the exclusive request skips GPU 0"
    );

    let err = start_count(&sb, "s3", &shared).unwrap_err().to_string();
    let msg = gpupin_sandbox::hook_message(&err).unwrap_or(err.clone());
    assert!(
        msg.contains("0 can take shared (at most 2 per GPU, reserving 30GiB)"),
        "{msg}"
    );

    let table = sb.gpupin.run(&["status", "--long"], "");
    let table = harness::stdout(&table);
    assert!(
        table.contains(&format!("{} (shared, 30GiB)", s1.id())),
        "{table}"
    );
    assert!(
        table.contains(&format!("{} (shared, 30GiB)", s2.id())),
        "{table}"
    );
    drop((s1, s2, ex));
}

#[test]
fn reservations_never_exceed_a_gpus_memory() {
    let Some(sb) = Sandbox::with_machine(GPUPIN, "reservations_never_exceed_memory", &two_gpus())
    else {
        return;
    };
    let big = [("gpupin.share", "shared"), ("gpupin.reserve", "50GiB")];
    let a = start_count(&sb, "a", &big).unwrap();
    let b = start_count(&sb, "b", &big).unwrap();
    assert_ne!(
        sb.gpupin.held_minors(a.id()),
        sb.gpupin.held_minors(b.id()),
        "50GiB + 50GiB does not fit one 80GiB GPU"
    );
    let small = [("gpupin.share", "shared"), ("gpupin.reserve", "30GiB")];
    // 50 + 30 fills one 80GiB GPU exactly; a 31GiB reservation then fits on neither.
    let c = start_count(&sb, "c", &small).unwrap();
    assert_eq!(sb.gpupin.held_minors(c.id()).len(), 1);
    let over = [("gpupin.share", "shared"), ("gpupin.reserve", "31GiB")];
    let err = start_count(&sb, "d", &over).unwrap_err().to_string();
    assert!(err.contains("0 can take shared"), "{err}");
    let e = start_count(&sb, "e", &small).unwrap();
    assert_eq!(
        sb.gpupin.held_minors(e.id()).len(),
        1,
        "30GiB still fits beside the other 50"
    );
}
