//! Whole container starts under podman: what gpupin's hooks (installed in a hooks dir by
//! `gpupin install podman`) add to `podman run`, with and without a request.
//!
//!     cargo bench --bench podman_start                        # as root; 60 rounds
//!     GPUPIN_BENCH_ROUNDS=50 cargo bench --bench podman_start  # as root
//!     scripts/build-release target/dist && GPUPIN_BIN_DIR=$PWD/target/dist cargo bench --bench podman_start
//!
//! The last runs the release build (statically linked hook and shim) instead of cargo's
//! binaries.
//!
//! podman as the end-to-end tests drive it (their harness: private storage on vfs, runc,
//! the simulated `sim:nvswitch8`), removed when the bench ends. Each round runs, in turn,
//! `podman run --rm --network none ... --rootfs ROOTFS true` in the foreground, so that
//! the time covers create, hooks, start, exit and removal: with an empty hooks dir (the
//! baseline), with gpupin's hooks dir and no request (what every container pays once the
//! hooks are installed), and with gpupin's hooks and `--annotation gpupin.count=1`
//! (precreate allocation, nodes, device cgroup, ledger record, release). Beside them, the
//! exec floor of that last one: the same three hooks.d stages matched by the same
//! annotation, run by `/bin/cat` and `/bin/true`, which is what any hook-based tool pays
//! podman before doing anything. Figures are medians, ratios against no hooks in the same
//! run.

#[path = "../tests/podman_support/mod.rs"]
mod podman_support;
#[path = "start_table/mod.rs"]
mod start_table;

use podman_support::{Options, Podman, combined, gpu_nodes};
use start_table::{Variant, command_line, print_invocation, report, rounds, time};
use std::path::Path;
use std::process::Command;

/// About a minute on a 2-core VM.
const ROUNDS: usize = 60;
const BENCH: &str = "podman_start";

/// Which hooks.d directory a variant runs with.
#[derive(Clone, Copy)]
enum Hooks {
    /// An empty directory.
    None,
    /// The exec floor: the same three stages, matched the same way, run by `/bin/cat`
    /// (precreate: the spec back unchanged) and `/bin/true` (prestart, poststop).
    Floor,
    /// gpupin's, as `gpupin install podman` writes them.
    Gpupin,
}

/// Name, hooks, `podman run` options, GPU nodes the container must see.
const VARIANTS: [(&str, Hooks, &[&str], usize); 4] = [
    ("no hooks", Hooks::None, &[], 0),
    ("hooks.d, no request", Hooks::Gpupin, &[], 0),
    (
        "cat/true hooks, --annotation",
        Hooks::Floor,
        &["--annotation", "gpupin.count=1"],
        0,
    ),
    (
        "hooks.d, --annotation gpupin.count=1",
        Hooks::Gpupin,
        &["--annotation", "gpupin.count=1"],
        1,
    ),
];

/// A hooks.d directory whose three files run `/bin/cat` at precreate and `/bin/true` at
/// prestart and poststop, for containers with a `gpupin.` annotation.
fn floor_hooks(dir: &Path) {
    std::fs::create_dir(dir).unwrap();
    for (stage, program) in [
        ("precreate", "/bin/cat"),
        ("prestart", "/bin/true"),
        ("poststop", "/bin/true"),
    ] {
        let file = serde_json::json!({
            "version": "1.0.0",
            "hook": {"path": program, "args": [program]},
            "when": {"annotations": {"^gpupin\\.": ".*"}},
            "stages": [stage],
        });
        std::fs::write(dir.join(format!("floor-{stage}.json")), file.to_string()).unwrap();
    }
}

fn main() {
    if let Err(reason) = podman_support::prerequisites() {
        println!("{BENCH}: not run: {reason}");
        return;
    }
    let rounds = rounds(ROUNDS);
    print_invocation(BENCH, rounds);
    let podman = podman_support::setup(BENCH, Options::default()).expect("checked above");
    let no_hooks = podman.path("no-hooks.d");
    std::fs::create_dir(&no_hooks).unwrap();
    let floor = podman.path("floor-hooks.d");
    floor_hooks(&floor);
    let hooks = |which: Hooks| match which {
        Hooks::None => no_hooks.clone(),
        Hooks::Floor => floor.clone(),
        Hooks::Gpupin => podman.hooks_dir(),
    };
    let mut n = 0;
    let mut name = || {
        n += 1;
        podman.name(n)
    };
    for (label, with, options, _) in VARIANTS {
        let cmd = run(&podman, &hooks(with), &name(), options, &["true"]);
        println!("  {label}: {}", command_line(&cmd));
    }
    // Untimed: each variant does what it says (and the caches are warm).
    for (label, with, options, gpus) in VARIANTS {
        let out = run(&podman, &hooks(with), &name(), options, &["ls", "/dev"])
            .output()
            .unwrap();
        podman_support::assert_success(label, &out);
        let text = combined(&out);
        let seen = gpu_nodes(text.split_whitespace());
        assert_eq!(seen.len(), gpus, "{label}: GPU nodes inside: {seen:?}");
    }
    let mut variants: Vec<Variant> = VARIANTS
        .iter()
        .map(|(label, ..)| Variant::new(label))
        .collect();
    for _ in 0..rounds {
        for (v, (_, with, options, _)) in variants.iter_mut().zip(VARIANTS) {
            let mut cmd = run(&podman, &hooks(with), &name(), options, &["true"]);
            v.times.push(time(&mut cmd));
        }
    }
    let held = podman.holders();
    assert!(held.is_empty(), "every --rm container released: {held:?}");
    report(
        BENCH,
        &format!("{rounds} rounds of `podman run --rm` (busybox `true`)"),
        &variants,
    );
}

/// `podman run --rm --name NAME --network none OPTIONS --rootfs ROOTFS CMD`, with the
/// hooks in `hooks_dir`, foreground.
fn run(podman: &Podman, hooks_dir: &Path, name: &str, options: &[&str], cmd: &[&str]) -> Command {
    let mut command = podman.podman_with_hooks(hooks_dir);
    command
        .args(["run", "--rm", "--name", name, "--network", "none"])
        .args(options)
        .arg("--rootfs")
        .arg(podman.rootfs())
        .args(cmd);
    command
}
