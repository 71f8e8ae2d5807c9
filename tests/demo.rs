//! `gpupin demo`, the README's first command: with real containers where root and runc
//! are here, and through the hook protocol alone (`--no-containers`) everywhere.

use gpupin_sandbox::harness::Sandbox;
use std::process::{Command, Output};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

fn demo(args: &[&str]) -> Output {
    Command::new(GPUPIN)
        .arg("demo")
        .args(args)
        .output()
        .unwrap()
}

/// What every run of the demo shows: the requests, one refusal, the table, all GPUs back.
fn assert_demo_story(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for needle in [
        "train",
        "GPUs 0,1",
        "env GPUPIN_COUNT=1",
        "GPUs 7",
        "untouched",
        "refused: gpupin: ",
        "6 of 8 GPUs held",
        "2 of 8 GPUs free, 4 holders",
        "8 of 8 GPUs free, 0 holders",
        "Every GPU is free again.",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}

#[test]
fn demo_without_containers_runs_the_requests_through_the_hook_protocol() {
    let out = demo(&["--no-containers"]);
    assert_demo_story(&out);
    assert!(String::from_utf8_lossy(&out.stdout).contains("creates no device node"));
}

#[test]
fn demo_with_real_containers_shows_their_nodes() {
    if Sandbox::new(GPUPIN, "demo_with_real_containers_shows_their_nodes").is_none() {
        return;
    }
    let out = demo(&[]);
    assert_demo_story(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("runc run -d"), "{stdout}");
    assert!(stdout.contains("nvidiactl"), "{stdout}");
    assert!(stdout.contains("sees no nvidia node"), "{stdout}");
}
