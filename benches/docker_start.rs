//! Whole container starts under Docker: what `--runtime gpupin` (the gpupin-runtime
//! shim in front of runc) adds to `docker run`, with and without a request.
//!
//!     cargo bench --bench docker_start                        # as root; 40 rounds
//!     GPUPIN_BENCH_ROUNDS=50 cargo bench --bench docker_start  # as root
//!     scripts/build-release target/dist && GPUPIN_BIN_DIR=$PWD/target/dist cargo bench --bench docker_start
//!
//! The last runs the release build (statically linked hook and shim) instead of cargo's
//! binaries.
//!
//! A private dockerd (the end-to-end tests' harness: its own data root, socket and exec
//! root, busybox imported as an image, gpupin-runtime registered as `gpupin` on the
//! simulated `sim:nvswitch8`), stopped when the bench exits. Each round runs, in turn,
//! `docker run --rm --network none --runtime R ... IMAGE true` in the foreground, so that
//! the time covers create, hooks, start, exit and removal: with runc (the baseline),
//! with gpupin and no request (what every container pays once the runtime is in use),
//! and with gpupin and `-l gpupin.count=1` (allocation, nodes, device cgroup, ledger
//! record, release). Figures are medians, ratios against runc in the same run.

// The tests' harness; the bench uses a part of it, as each test binary does.
#[allow(unused_imports)]
#[path = "../tests/docker_support/mod.rs"]
mod docker_support;
#[path = "start_table/mod.rs"]
mod start_table;

use docker_support::{Harness, IMAGE, Need, gpu_nodes, ok};
use start_table::{Variant, command_line, print_invocation, report, rounds, time};
use std::process::Command;

/// About a minute on a 2-core VM.
const ROUNDS: usize = 40;
const BENCH: &str = "docker_start";

/// Name, runtime, `docker run` options, GPU nodes the container must see.
const VARIANTS: [(&str, &str, &[&str], usize); 3] = [
    ("runc", "runc", &[], 0),
    ("gpupin, no request", "gpupin", &[], 0),
    (
        "gpupin, -l gpupin.count=1",
        "gpupin",
        &["-l", "gpupin.count=1"],
        1,
    ),
];

fn main() {
    if let Some(reason) = docker_support::missing(Need::Docker) {
        println!("{BENCH}: not run: {reason}");
        return;
    }
    let rounds = rounds(ROUNDS);
    print_invocation(BENCH, rounds);
    let h = docker_support::harness(BENCH, Need::Docker).expect("checked above");
    // The runtime the daemon knows as `gpupin`; its ledger is ours alone.
    let (_guard, slot) = h.compose_slot();
    for (name, runtime, options, _) in VARIANTS {
        println!(
            "  {name}: {}",
            command_line(&run(h, runtime, options, &["true"]))
        );
    }
    // Untimed: each variant does what it says (and the caches are warm).
    for (name, runtime, options, gpus) in VARIANTS {
        let out = ok(&mut run(h, runtime, options, &["ls", "/dev"]));
        let seen = gpu_nodes(out.split_whitespace());
        assert_eq!(seen.len(), gpus, "{name}: GPU nodes inside: {seen:?}");
    }
    let mut variants: Vec<Variant> = VARIANTS
        .iter()
        .map(|(name, ..)| Variant::new(name))
        .collect();
    for _ in 0..rounds {
        for (v, (_, runtime, options, _)) in variants.iter_mut().zip(VARIANTS) {
            v.times.push(time(&mut run(h, runtime, options, &["true"])));
        }
    }
    let held = slot.holders();
    assert!(held.is_empty(), "every --rm container released: {held:?}");
    report(
        BENCH,
        &format!("{rounds} rounds of `docker run --rm` (busybox `true`)"),
        &variants,
    );
}

/// `docker run --rm --network none --runtime RUNTIME OPTIONS IMAGE CMD`, foreground.
fn run(h: &Harness, runtime: &str, options: &[&str], cmd: &[&str]) -> Command {
    let mut docker = h.docker();
    docker
        .args(["run", "--rm", "--network", "none", "--runtime", runtime])
        .args(options)
        .arg(IMAGE)
        .args(cmd);
    docker
}
