//! The table the container-start benches print: variants timed in turn within each
//! round, so that drift on the machine hits all alike; medians, and ratios against the
//! first variant of the same run.

use std::process::Command;
use std::time::{Duration, Instant};

/// Says how to run `bench` again, and whose binaries it runs: cargo's, or those of
/// `$GPUPIN_BIN_DIR` (the release build).
pub fn print_invocation(bench: &str, rounds: usize) {
    println!("{bench}: GPUPIN_BENCH_ROUNDS={rounds} cargo bench --bench {bench}");
    let bins = std::env::var(gpupin_sandbox::harness::BIN_DIR_ENV).unwrap_or_default();
    let from = if bins.is_empty() {
        "cargo's build"
    } else {
        &bins
    };
    println!("{bench}: binaries from {from}");
}

/// GPUPIN_BENCH_ROUNDS, or `default` (each bench sizes its own to about a minute on a
/// 2-core VM); at least 1.
pub fn rounds(default: usize) -> usize {
    std::env::var("GPUPIN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

pub struct Variant {
    pub name: &'static str,
    pub times: Vec<Duration>,
}

impl Variant {
    pub fn new(name: &'static str) -> Variant {
        Variant {
            name,
            times: Vec::new(),
        }
    }
}

/// Runs `cmd` to the end, output discarded unless it fails; how long it took.
pub fn time(cmd: &mut Command) -> Duration {
    let started = Instant::now();
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// `cmd` as one line a reader could paste, its environment first (values here need no
/// quoting).
pub fn command_line(cmd: &Command) -> String {
    let env = cmd.get_envs().filter_map(|(key, value)| {
        Some(format!(
            "{}={}",
            key.to_string_lossy(),
            value?.to_string_lossy()
        ))
    });
    let words = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned());
    env.chain(words).collect::<Vec<_>>().join(" ")
}

/// The value below which `q` (0 to 1) of `times` lie, nearest rank.
fn quantile(times: &[Duration], q: f64) -> Duration {
    let mut sorted = times.to_vec();
    sorted.sort();
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[rank]
}

/// A table of medians with quartiles (how far one run's figures scatter, to weigh the
/// ratios by), and ratios of medians against the first variant.
pub fn report(bench: &str, what: &str, variants: &[Variant]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let base = quantile(&variants[0].times, 0.5);
    println!("{bench}: {what}, medians; ratio against the first row");
    println!(
        "{:<38} {:>10} {:>8} {:>8} {:>8} {:>8}",
        "variant", "median ms", "p25 ms", "p75 ms", "min ms", "ratio"
    );
    for v in variants {
        let m = quantile(&v.times, 0.5);
        println!(
            "{:<38} {:>10.2} {:>8.2} {:>8.2} {:>8.2} {:>8.3}",
            v.name,
            ms(m),
            ms(quantile(&v.times, 0.25)),
            ms(quantile(&v.times, 0.75)),
            ms(quantile(&v.times, 0.0)),
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
}
