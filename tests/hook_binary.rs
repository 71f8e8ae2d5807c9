//! The `gpupin-hook` binary as runtimes run it: its own arguments, a container without a
//! request, and NVML asked of the `gpupin` beside it (on this machine, which has no
//! NVIDIA driver, that answer is a one-line refusal). No root, no runc.

use gpupin_sandbox::harness::{Gpupin, gpupin_line_problem, run_with_input, stderr, stdout};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

fn hook_beside(g: &Gpupin) -> PathBuf {
    g.bin.with_file_name("gpupin-hook")
}

/// `gpupin-hook --config <g's> ARGS` with `input` on stdin.
fn hook(g: &Gpupin, args: &[&str], input: &str) -> Output {
    let mut cmd = Command::new(hook_beside(g));
    cmd.arg("--config").arg(&g.config).args(args);
    run_with_input(&mut cmd, input)
}

/// The OCI state of a container whose bundle asks for `annotations` (and nothing in env).
fn state(dir: &Path, id: &str, annotations: serde_json::Value) -> String {
    let bundle = dir.join(id);
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let spec = json!({"ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin"]}, "root": {"path": "rootfs"}});
    std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
    json!({"ociVersion": "1.0.2", "id": id, "status": "created", "pid": std::process::id(),
           "bundle": bundle, "annotations": annotations})
    .to_string()
}

/// One `gpupin: ` line on stderr, holding every needle.
fn assert_one_gpupin_line(out: &Output, needles: &[&str]) {
    let err = stderr(out);
    if let Some(problem) = gpupin_line_problem(&err) {
        panic!("{problem}");
    }
    for needle in needles {
        assert!(err.contains(needle), "{needle:?} missing from: {err}");
    }
}

fn no_nvidia_driver(test: &str) -> bool {
    let here = Path::new("/proc/driver/nvidia").exists();
    if here {
        eprintln!("skipping {test}: this machine has an NVIDIA driver, so NVML answers");
    }
    !here
}

#[test]
fn a_container_without_a_request_passes_with_nothing_written() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let out = hook(&g, &["prestart"], &state(g.dir.path(), "plain", json!({})));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    assert!(g.ledger_snapshot().is_empty());
}

#[test]
fn precreate_returns_the_spec_with_the_gpu_and_itself_as_the_later_hooks() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let spec = json!({
        "ociVersion": "1.0.2", "process": {"args": ["true"], "env": ["PATH=/bin"]},
        "root": {"path": "rootfs"}, "annotations": {"gpupin.count": "1"},
    });
    let out = hook(&g, &["precreate"], &spec.to_string());
    assert!(out.status.success(), "{}", stderr(&out));
    let edited: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(edited["linux"]["devices"][0]["path"], "/dev/nvidia0");
    let exe = hook_beside(&g).display().to_string();
    let config = g.config.display().to_string();
    for stage in ["prestart", "poststop"] {
        assert_eq!(edited["hooks"][stage][0]["path"], exe.as_str());
        assert_eq!(
            edited["hooks"][stage][0]["args"],
            json!(["gpupin-hook", "--config", config, stage])
        );
    }
    assert_eq!(g.ledger_snapshot().len(), 1, "the claim is held");
}

#[test]
fn help_and_version_go_to_stdout() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let help = Command::new(hook_beside(&g))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(
        stdout(&help).starts_with("usage: gpupin-hook [--config FILE] STAGE"),
        "{}",
        stdout(&help)
    );
    let version = Command::new(hook_beside(&g)).arg("-V").output().unwrap();
    assert_eq!(
        stdout(&version).trim(),
        format!("gpupin-hook {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_arguments_are_one_line_and_exit_2() {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    for (args, needle) in [
        (&[][..], "a hook stage is required"),
        (
            &["prestart", "poststop"][..],
            "unexpected argument \"poststop\"",
        ),
        (
            &["--bogus", "prestart"][..],
            "unexpected argument \"--bogus\"",
        ),
    ] {
        let out = Command::new(hook_beside(&g)).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert_one_gpupin_line(&out, &[needle, "(see gpupin-hook --help)"]);
    }
    let out = hook(&g, &["prestop"], "{}");
    assert_eq!(out.status.code(), Some(1));
    assert_one_gpupin_line(&out, &["unknown hook stage \"prestop\""]);
}

#[test]
fn nvml_is_asked_of_the_gpupin_beside_it() {
    if !no_nvidia_driver("nvml_is_asked_of_the_gpupin_beside_it") {
        return;
    }
    let g = Gpupin::new(GPUPIN, "nvml");
    let input = state(g.dir.path(), "c1", json!({"gpupin.count": "1"}));
    let out = hook(&g, &["prestart"], &input);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let helper = g.bin.display().to_string();
    assert_one_gpupin_line(
        &out,
        &[
            &format!("NVML through {helper}: NVML is not available"),
            "is the NVIDIA driver installed?",
        ],
    );
    assert!(g.ledger_snapshot().is_empty());
}

#[test]
fn the_helper_answers_one_line_without_a_driver() {
    if !no_nvidia_driver("the_helper_answers_one_line_without_a_driver") {
        return;
    }
    let g = Gpupin::new(GPUPIN, "nvml");
    for question in ["inventory", "live"] {
        let out = Command::new(&g.bin)
            .args(["nvml", question])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1));
        assert!(out.stdout.is_empty());
        assert_one_gpupin_line(&out, &["NVML is not available"]);
    }
    let out = Command::new(&g.bin)
        .args(["nvml", "topology"])
        .output()
        .unwrap();
    assert_one_gpupin_line(
        &out,
        &["unknown NVML question \"topology\": expected inventory, live or memory-limit"],
    );
}
