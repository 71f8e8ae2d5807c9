//! Whole container starts with real runc: what gpupin's hooks add to `runc run`.
//!
//!     cargo bench --bench container_start                     # as root; 20 rounds
//!     GPUPIN_BENCH_ROUNDS=50 cargo bench --bench container_start  # as root
//!
//! Each round runs, in turn, a busybox `true` container without hooks (the baseline),
//! one with gpupin's prestart and poststop hooks but no request (what every container on
//! a host with gpupin in its hooks pays), and one asking for a GPU by annotation (nodes,
//! device cgroup, ledger record, release) on the simulated `sim:nvswitch8`. The variants
//! alternate within each round so that drift on the machine hits all three alike. Figures
//! are medians, and ratios against the baseline of the same run.

use gpupin_sandbox::{BundleSpec, HookCommand, Requirements, build_busybox_rootfs, write_bundle};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

struct Variant {
    name: &'static str,
    /// `name` as a container id and directory name.
    slug: String,
    bundle: PathBuf,
    times: Vec<Duration>,
}

fn main() {
    let reqs = match Requirements::check() {
        Ok(reqs) => reqs,
        Err(reason) => {
            println!("container_start: not run: {reason}");
            return;
        }
    };
    let rounds: usize = std::env::var("GPUPIN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let dir = tempfile::Builder::new()
        .prefix("gpupin-bench")
        .tempdir()
        .unwrap();
    let mut variants = setup(dir.path(), &reqs.busybox);
    let root = dir.path().join("runc-root");
    for round in 0..rounds {
        for v in &mut variants {
            let id = format!("bench-{}-{}-{round}", std::process::id(), v.slug);
            v.times.push(run_once(&reqs.runc, &root, &v.bundle, &id));
        }
    }
    report(&variants, rounds);
}

fn setup(dir: &Path, busybox: &Path) -> Vec<Variant> {
    let rootfs = dir.join("rootfs");
    build_busybox_rootfs(busybox, &rootfs).unwrap();
    let config = dir.join("gpupin.toml");
    let state = dir.join("state");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\ninventory = \"sim:nvswitch8\"\n",
            state.display().to_string()
        ),
    )
    .unwrap();
    let hook = HookCommand {
        exe: PathBuf::from(GPUPIN),
        config: Some(config),
    };
    let mut base = BundleSpec::sleeper(&rootfs);
    base.args = vec!["true".into()];
    let specs = [
        ("runc", base.clone()),
        ("gpupin, no request", base.clone().with_hook(&hook)),
        (
            "gpupin, count=1",
            base.with_hook(&hook).annotation("gpupin.count", "1"),
        ),
    ];
    specs
        .into_iter()
        .map(|(name, spec)| {
            let slug: String = name
                .chars()
                .filter_map(|c| match c {
                    'a'..='z' | '0'..='9' => Some(c),
                    ' ' | '=' => Some('-'),
                    _ => None,
                })
                .collect();
            let bundle = dir.join("bundles").join(&slug);
            write_bundle(&bundle, &spec).unwrap();
            Variant {
                name,
                slug,
                bundle,
                times: Vec::new(),
            }
        })
        .collect()
}

/// `runc run` in the foreground: create, hooks, start, wait for `true`, delete (poststop).
fn run_once(runc: &Path, root: &Path, bundle: &Path, id: &str) -> Duration {
    let started = Instant::now();
    let status = Command::new(runc)
        .arg("--root")
        .arg(root)
        .args(["run", "--bundle"])
        .arg(bundle)
        .arg(id)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .unwrap();
    let took = started.elapsed();
    assert!(status.success(), "runc run {id} failed: {status}");
    took
}

fn median(times: &[Duration]) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    sorted[sorted.len() / 2]
}

fn report(variants: &[Variant], rounds: usize) {
    let base = median(&variants[0].times);
    println!("container_start: {rounds} rounds of `runc run` (busybox `true`), medians");
    println!(
        "{:<20} {:>10} {:>10} {:>8}",
        "variant", "median ms", "min ms", "ratio"
    );
    for v in variants {
        let m = median(&v.times);
        let min = v.times.iter().min().copied().unwrap_or_default();
        println!(
            "{:<20} {:>10.1} {:>10.1} {:>8.2}",
            v.name,
            m.as_secs_f64() * 1e3,
            min.as_secs_f64() * 1e3,
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
}
