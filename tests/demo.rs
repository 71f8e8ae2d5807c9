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
    // The commands it prints read as an admin types them here: the binary relative to the
    // current directory (cargo runs tests in the checkout), never an absolute path into it.
    let checkout = env!("CARGO_MANIFEST_DIR");
    assert!(
        !stdout.contains(&format!("{checkout}/")),
        "an absolute path into the checkout in:\n{stdout}"
    );
    assert!(
        stdout.contains("$ target/debug/gpupin --config ")
            || stdout.contains("$ target/release/gpupin --config "),
        "the status command as typed here missing from:\n{stdout}"
    );
    for needle in [
        "status --long",
        "train",
        "GPUs 0,1",
        "env GPUPIN_COUNT=1",
        "GPUs 7",
        "untouched",
        "refused: gpupin: ",
        "6 of 8 GPUs held",
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("creates no device node"), "{stdout}");
    assert!(stdout.contains("2 of 8 GPUs free, 4 holders"), "{stdout}");
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
    // The CUDA-style container: the one GPU left after the refusal, the driver's files
    // from the fake root's CDI spec, read-only, and its nvidia-smi running inside.
    for needle in [
        "cuda    annotations gpupin.count=1, spec edited before create -> GPUs 5; sees nvidia-modeset nvidia-uvm nvidia-uvm-tools nvidia5 nvidiactl",
        "driver files mounted read-only: libcuda.so.570.133.20 libnvidia-ml.so.570.133.20 nvidia-smi gsp_ga10x.bin",
        "`nvidia-smi` inside prints: fake nvidia-smi from the test driver root",
        // A script through gpupin exec on the last free GPU, ended by a TERM to gpupin.
        "it sees CUDA_VISIBLE_DEVICES=6 CUDA_DEVICE_ORDER=PCI_BUS_ID GPUPIN_HOLDER=script",
        "0 of 8 GPUs free, 6 holders",
        "gpupin exited with 143 (128 + TERM)",
    ] {
        assert!(
            stdout.contains(needle),
            "{needle:?} missing from:\n{stdout}"
        );
    }
}
