//! gpupin as a runc hook, end to end: real containers on a busybox rootfs, a simulated
//! 8-GPU machine, and the checks a user would make (`ls /dev`, `stat`, `env` inside the
//! container, devices.list and `gpupin status` on the host). Needs root and runc.

use gpupin_sandbox::harness::{
    self, CONTROL_NODES, GPU_MAJOR, Sandbox, char_node, devices_list, nvidia_nodes, stat_node,
};
use gpupin_sandbox::{Container, SandboxError, hook_message};
use std::collections::BTreeSet;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// What a container holding the GPUs of `minors` must see under /dev.
fn expected_nodes(minors: &[u32]) -> BTreeSet<String> {
    let gpus = minors.iter().map(|m| format!("nvidia{m}"));
    let control = CONTROL_NODES.iter().map(|(name, _, _)| name.to_string());
    gpus.chain(control).collect()
}

/// The device cgroup lines gpupin adds for `minors`, as the kernel lists them.
fn expected_allow_lines(minors: &[u32]) -> BTreeSet<String> {
    let gpus = minors.iter().map(|m| (GPU_MAJOR, *m));
    let control = CONTROL_NODES
        .iter()
        .map(|(_, major, minor)| (*major, *minor));
    gpus.chain(control)
        .map(|(major, minor)| format!("c {major}:{minor} rwm"))
        .collect()
}

/// Asserts the container sees exactly the nodes of `minors` with the right numbers.
fn assert_sees_exactly(c: &Container, minors: &[u32]) {
    assert_eq!(
        nvidia_nodes(c),
        expected_nodes(minors),
        "container {}",
        c.id()
    );
    for m in minors {
        assert_eq!(
            stat_node(c, &format!("/dev/nvidia{m}")),
            char_node(GPU_MAJOR, *m)
        );
    }
    for (name, major, minor) in CONTROL_NODES {
        assert_eq!(
            stat_node(c, &format!("/dev/{name}")),
            char_node(*major, *minor)
        );
    }
}

/// gpupin's message out of runc's report of a refused start, which must carry it (runc
/// quotes the hook's stderr, escaped, in its own log line).
fn refusal(result: Result<Container, SandboxError>) -> String {
    let err = match result {
        Ok(c) => panic!("container {} started but should have been refused", c.id()),
        Err(err) => err.to_string(),
    };
    match hook_message(&err) {
        Some(message) => message,
        None => panic!("no gpupin message in runc's error: {err}"),
    }
}

#[test]
fn two_gpus_by_annotation_are_exactly_what_the_container_gets() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "two_gpus_by_annotation_are_exactly_what_the_container_gets",
    ) else {
        return;
    };
    // runc's own defaults, from a container that asked for nothing.
    let plain = sb.start(&sb.id("plain"), &sb.spec()).unwrap();
    let runc_defaults = devices_list(plain.pid().unwrap());
    plain.stop().unwrap();

    let id = sb.id("two");
    let c = sb
        .start(&id, &sb.spec().annotation("gpupin.count", "2"))
        .unwrap();
    let minors = sb.gpupin.held_minors(&id);
    assert_eq!(minors.len(), 2, "{:#}", sb.gpupin.status());
    assert_sees_exactly(&c, &minors);

    let mut expected = runc_defaults;
    expected.extend(expected_allow_lines(&minors));
    assert_eq!(devices_list(c.pid().unwrap()), expected);

    let record_file = sb.gpupin.state_dir.join(format!("holders/{id}.json"));
    assert!(record_file.is_file(), "no {}", record_file.display());
    let holder = sb.gpupin.holder(&id).expect("held while running");
    assert_eq!(holder["pid"], c.pid().unwrap());
    let uuids: Vec<String> = serde_json::from_value(holder["gpus"].clone()).unwrap();
    let config = std::fs::read_to_string(sb.bundle_dir(&id).join("config.json")).unwrap();
    assert!(
        config.contains(&format!("NVIDIA_VISIBLE_DEVICES={}", uuids.join(","))),
        "bundle config.json lacks NVIDIA_VISIBLE_DEVICES for {uuids:?}"
    );

    c.stop().unwrap();
    assert!(
        sb.gpupin.holder(&id).is_none(),
        "still held after runc delete"
    );
    assert!(
        !record_file.exists(),
        "{} left behind",
        record_file.display()
    );
    assert_eq!(sb.gpupin.status()["free"], 8);
}

#[test]
fn env_request_is_honoured_like_an_annotation() {
    let Some(sb) = Sandbox::new(GPUPIN, "env_request_is_honoured_like_an_annotation") else {
        return;
    };
    let id = sb.id("env");
    let c = sb.start(&id, &sb.spec().env("GPUPIN_COUNT", "1")).unwrap();
    let minors = sb.gpupin.held_minors(&id);
    assert_eq!(minors.len(), 1);
    assert_sees_exactly(&c, &minors);
    c.stop().unwrap();
    assert!(sb.gpupin.holder(&id).is_none());
}

#[test]
fn eight_at_once_get_eight_different_gpus_and_a_ninth_is_refused() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "eight_at_once_get_eight_different_gpus_and_a_ninth_is_refused",
    ) else {
        return;
    };
    let ids: Vec<String> = (0..8).map(|i| sb.id(&format!("eight{i}"))).collect();
    let barrier = std::sync::Barrier::new(ids.len());
    let containers: Vec<Container> = std::thread::scope(|s| {
        let handles: Vec<_> = ids
            .iter()
            .map(|id| {
                let (sb, barrier) = (&sb, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    sb.start(id, &sb.spec().annotation("gpupin.count", "1"))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });

    let mut all_minors = BTreeSet::new();
    for c in &containers {
        let minors = sb.gpupin.held_minors(c.id());
        assert_eq!(minors.len(), 1, "{} holds {minors:?}", c.id());
        assert_sees_exactly(c, &minors);
        all_minors.insert(minors[0]);
    }
    assert_eq!(all_minors, (0..8).collect(), "some GPU was given twice");

    let ninth = sb.id("ninth");
    let before = sb.gpupin.ledger_snapshot();
    let err = refusal(sb.start(&ninth, &sb.spec().annotation("gpupin.count", "1")));
    assert!(err.contains("8 of 8 GPUs held"), "{err}");
    assert!(!sb.runc.exists(&ninth), "the refused container exists");
    assert_eq!(sb.gpupin.ledger_snapshot(), before);
}

#[test]
fn explicit_devices_held_is_refused_free_is_granted() {
    let Some(sb) = Sandbox::new(GPUPIN, "explicit_devices_held_is_refused_free_is_granted") else {
        return;
    };
    let first = sb.id("first");
    let _a = sb
        .start(&first, &sb.spec().annotation("gpupin.devices", "3"))
        .unwrap();

    let second = sb.id("second");
    let err = refusal(sb.start(&second, &sb.spec().annotation("gpupin.devices", "3")));
    assert!(err.contains(&format!("is held by {first}")), "{err}");
    assert!(!sb.runc.exists(&second));

    let third = sb.id("third");
    let c = sb
        .start(&third, &sb.spec().annotation("gpupin.devices", "4"))
        .unwrap();
    // On the simulated machines minor == index.
    assert_eq!(sb.gpupin.held_minors(&third), [4]);
    assert_sees_exactly(&c, &[4]);
}

#[test]
fn container_without_request_is_untouched() {
    let Some(sb) = Sandbox::new(GPUPIN, "container_without_request_is_untouched") else {
        return;
    };
    let id = sb.id("plain");
    let spec = sb.spec().env("OTHER", "1").annotation("org.example.x", "y");
    let c = sb.start(&id, &spec).unwrap();
    let config_before = serde_json::to_string_pretty(&spec.to_config()).unwrap();
    let config_after = std::fs::read_to_string(sb.bundle_dir(&id).join("config.json")).unwrap();

    assert!(nvidia_nodes(&c).is_empty());
    let env = c.exec_stdout(&["env"]).unwrap();
    assert!(!env.contains("NVIDIA") && !env.contains("GPUPIN"), "{env}");
    assert_eq!(config_after, config_before, "config.json was edited");
    assert!(sb.gpupin.ledger_snapshot().is_empty());
    assert_eq!(sb.gpupin.status()["free"], 8);
}

#[test]
fn killed_container_without_poststop_is_reaped_by_gc() {
    let Some(sb) = Sandbox::new(GPUPIN, "killed_container_without_poststop_is_reaped_by_gc") else {
        return;
    };
    let id = sb.id("killed");
    let c = sb
        .start(&id, &sb.spec().annotation("gpupin.count", "8"))
        .unwrap();
    c.kill_without_poststop().unwrap();
    assert!(sb.gpupin.holder(&id).is_some(), "poststop ran after all?");

    let out = sb.gpupin.run(&["gc"], "");
    assert!(out.status.success(), "{}", harness::stderr(&out));
    assert!(
        harness::stdout(&out).contains(&id),
        "{}",
        harness::stdout(&out)
    );
    assert!(sb.gpupin.holder(&id).is_none());
    assert_eq!(sb.gpupin.status()["free"], 8);
}

#[test]
fn killed_container_without_poststop_is_reaped_at_next_allocation() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "killed_container_without_poststop_is_reaped_at_next_allocation",
    ) else {
        return;
    };
    let dead = sb.id("dead");
    let c = sb
        .start(&dead, &sb.spec().annotation("gpupin.devices", "0"))
        .unwrap();
    c.kill_without_poststop().unwrap();

    let next = sb.id("next");
    let n = sb
        .start(&next, &sb.spec().annotation("gpupin.devices", "0"))
        .unwrap();
    assert_eq!(sb.gpupin.held_minors(&next), [0]);
    assert_sees_exactly(&n, &[0]);
    assert!(sb.gpupin.holder(&dead).is_none());
}

/// Entries of a host directory whose names start with `nvidia`.
fn nvidia_entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("nvidia"))
        .collect()
}

#[test]
fn dev_symlink_out_of_the_rootfs_gets_no_node_and_a_clear_error() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "dev_symlink_out_of_the_rootfs_gets_no_node_and_a_clear_error",
    ) else {
        return;
    };
    let outside = sb.gpupin.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let rootfs = sb.gpupin.dir.path().join("evil-rootfs");
    let busybox = gpupin_sandbox::find_static_busybox().unwrap();
    gpupin_sandbox::build_busybox_rootfs(&busybox, &rootfs).unwrap();
    std::fs::remove_dir(rootfs.join("dev")).unwrap();
    std::os::unix::fs::symlink(&outside, rootfs.join("dev")).unwrap();

    let mut spec = sb.spec().annotation("gpupin.count", "1");
    spec.rootfs = rootfs;
    let id = sb.id("devlink");
    let err = refusal(sb.start(&id, &spec));
    assert!(
        err.starts_with("gpupin: ") && err.contains("symlink"),
        "{err}"
    );
    assert_eq!(nvidia_entries(&outside), Vec::<String>::new());
    assert!(sb.gpupin.ledger_snapshot().is_empty());
}

#[test]
fn node_symlink_out_of_the_rootfs_gets_no_node_and_a_clear_error() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "node_symlink_out_of_the_rootfs_gets_no_node_and_a_clear_error",
    ) else {
        return;
    };
    let outside = sb.gpupin.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let rootfs = sb.gpupin.dir.path().join("evil-rootfs");
    let busybox = gpupin_sandbox::find_static_busybox().unwrap();
    gpupin_sandbox::build_busybox_rootfs(&busybox, &rootfs).unwrap();
    std::os::unix::fs::symlink(outside.join("nvidia0"), rootfs.join("dev/nvidia0")).unwrap();

    // Without runc's /dev tmpfs the container's /dev is the rootfs's, symlink included.
    let mut spec = sb
        .spec()
        .annotation("gpupin.devices", "0")
        .without_dev_tmpfs();
    spec.rootfs = rootfs;
    let id = sb.id("nodelink");
    let err = refusal(sb.start(&id, &spec));
    assert!(
        err.starts_with("gpupin: ") && err.contains("symlink"),
        "{err}"
    );
    assert_eq!(nvidia_entries(&outside), Vec::<String>::new());
    assert!(sb.gpupin.ledger_snapshot().is_empty());
}

#[test]
fn bad_requests_through_runc_are_refused_and_leave_the_ledger_unchanged() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "bad_requests_through_runc_are_refused_and_leave_the_ledger_unchanged",
    ) else {
        return;
    };
    // Something to keep: a bad request must not disturb an existing holder.
    let _holder = sb
        .start(&sb.id("holder"), &sb.spec().annotation("gpupin.count", "1"))
        .unwrap();
    let before = sb.gpupin.ledger_snapshot();
    let cases = [
        (("gpupin.count", "0"), "gpupin.count=\"0\""),
        (("gpupin.count", "-1"), "gpupin.count=\"-1\""),
        (("gpupin.count", "two"), "gpupin.count=\"two\""),
        (("gpupin.count", "99"), "99"),
        (
            ("gpupin.policy", "random"),
            "expected one of topology, pack, spread, least-loaded, most-free",
        ),
    ];
    for ((key, value), expected) in cases {
        let id = sb.id("bad");
        let mut spec = sb.spec().annotation(key, value);
        if key == "gpupin.policy" {
            spec = spec.annotation("gpupin.count", "1");
        }
        let err = refusal(sb.start(&id, &spec));
        assert!(
            err.starts_with("gpupin: ") && err.contains(expected),
            "{key}={value}: {err}"
        );
        assert!(!sb.runc.exists(&id));
        assert_eq!(sb.gpupin.ledger_snapshot(), before, "{key}={value}");
    }
}
