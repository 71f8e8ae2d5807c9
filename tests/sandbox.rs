//! The sandbox itself, without gpupin: a plain busybox container under runc. When this
//! fails, every other runc test fails for the same reason.

use gpupin_sandbox::BundleSpec;
use gpupin_sandbox::harness::{Sandbox, nvidia_nodes};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

#[test]
fn plain_container_runs_execs_and_is_deleted() {
    let Some(sb) = Sandbox::new(GPUPIN, "plain_container_runs_execs_and_is_deleted") else {
        return;
    };
    let id = sb.id("plain");
    let c = sb
        .start(&id, &BundleSpec::sleeper(&sb.rootfs).env("HELLO", "world"))
        .unwrap();
    let state = c.state().unwrap();
    assert_eq!(state.status, "running");
    assert!(state.pid > 0);
    assert!(c.exec_stdout(&["env"]).unwrap().contains("HELLO=world"));
    assert!(c.exec_stdout(&["ls", "/dev"]).unwrap().contains("null"));
    assert!(nvidia_nodes(&c).is_empty());
    c.stop().unwrap();
    assert!(!sb.runc.exists(&id), "runc still knows {id}");
}

#[test]
fn failed_start_reports_runc_stderr_and_leaves_nothing() {
    let Some(sb) = Sandbox::new(
        GPUPIN,
        "failed_start_reports_runc_stderr_and_leaves_nothing",
    ) else {
        return;
    };
    let id = sb.id("nosuch");
    let mut spec = BundleSpec::sleeper(&sb.rootfs);
    spec.args = vec!["/no/such/program".into()];
    let err = sb.start(&id, &spec).unwrap_err().to_string();
    assert!(err.contains("/no/such/program"), "{err}");
    assert!(!sb.runc.exists(&id));
}
