//! What the test suites and benches share: the rule for a missing requirement (skip, or
//! fail under CI=true), gpupin configurations in temp dirs with real containers beside
//! them, `gpupin status --json` queries, ledger snapshots, the one-line refusal checks,
//! GPU-node filters, stand-in containers, and a fake NVIDIA driver root with its CDI
//! spec. gpupin is always its binary, whose path the caller passes in
//! (`env!("CARGO_BIN_EXE_gpupin")`), or the one of that name in `$GPUPIN_BIN_DIR`.
//!
//! Test code: it panics on whatever a test would fail on, and says on stderr why a test
//! is skipped.

mod check;
pub mod driver;
mod fake;
pub mod ledger;
mod nodes;
pub mod rng;
mod setup;
pub mod status;
pub mod toolkit;

pub use crate::engines;
pub use check::{assert_one_gpupin_line, gpupin_line_problem, refusal_problem};
pub use fake::{DEVICES_CGROUP, FakeContainer, Sleeper};
pub use nodes::{
    CONTROL_NODES, GPU_MAJOR, char_node, devices_list, gpu_nodes, is_gpu_node, nvidia_gpu_nodes,
    nvidia_nodes, stat_node,
};
pub use setup::{Gpupin, Sandbox};

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// Names the directory of gpupin's binaries to test instead of the ones cargo built:
/// `GPUPIN_BIN_DIR=target/dist cargo test --test runc_hook` runs a suite against the
/// release build of `scripts/build-release` (its statically linked hook and shim).
pub const BIN_DIR_ENV: &str = "GPUPIN_BIN_DIR";

/// The binary to run for `built` (a `CARGO_BIN_EXE_*` path): the one of the same name in
/// `$GPUPIN_BIN_DIR` when that is set, else `built`.
pub fn binary(built: &str) -> std::path::PathBuf {
    let built = std::path::Path::new(built);
    match std::env::var_os(BIN_DIR_ENV).filter(|d| !d.is_empty()) {
        Some(dir) => {
            let name = built.file_name().expect("a binary path has a file name");
            std::path::Path::new(&dir).join(name)
        }
        None => built.to_path_buf(),
    }
}

/// Whether this is a CI run (CI=true), where a test must run or fail, never skip: CI
/// must not go green by skipping.
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// `Some` of what a test needs when it was found; otherwise skips the test (`None`,
/// after saying why on stderr) or, under CI=true, fails it.
pub fn required<T>(test: &str, found: Result<T, String>) -> Option<T> {
    match found {
        Ok(found) => Some(found),
        Err(reason) if is_ci() => panic!("{test} needs what is missing here: {reason}"),
        Err(reason) => {
            say(&format!("skipping {test}: {reason}"));
            None
        }
    }
}

/// Whether `test` can run as root: false (skipped, or failed under CI=true) otherwise.
pub fn need_root(test: &str) -> bool {
    let root = crate::is_root()
        .then_some(())
        .ok_or_else(|| "not running as root".to_string());
    required(test, root).is_some()
}

/// Says once per test binary, on stderr, which engines the suites run on
/// (`GPUPIN_ENGINES`), with each one's version.
pub fn announce_engines() {
    static SAID: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    SAID.get_or_init(|| say(&format!("engines: {}", engines::describe())));
}

/// A line on stderr that libtest does not capture: a skip must be seen without
/// `--nocapture` (eprintln! output of a passing test is swallowed).
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Bytes of a child's output as text.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub fn stderr(out: &Output) -> String {
    text(&out.stderr)
}

pub fn stdout(out: &Output) -> String {
    text(&out.stdout)
}

/// Runs `cmd` with `input` on stdin, capturing stdout and stderr.
pub fn run_with_input(cmd: &mut Command, input: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    // A command may exit before reading stdin (a bad argument); a broken pipe is fine.
    let _ = child.stdin.take().unwrap().write_all(input.as_bytes());
    child.wait_with_output().unwrap()
}

/// SIGTERM to `child`, then SIGKILL where it has not ended within `patience`; reaped
/// either way. For a daemon a test started (dockerd, crio), when it is done with it.
pub fn terminate(child: &mut std::process::Child, patience: std::time::Duration) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a pid this process spawned and has not reaped yet.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    let started = std::time::Instant::now();
    while started.elapsed() < patience {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Detaches every mount under `dir` this process's mountinfo lists, the deepest first:
/// what a daemon mounted under its own dir, so that the temp dir can go.
pub fn unmount_under(dir: &std::path::Path) {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<&str> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| std::path::Path::new(m).starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        if let Ok(path) = std::ffi::CString::new(m) {
            // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
            unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        }
    }
}
