//! Whole container starts with real runc: what gpupin's hooks add to `runc run`, and
//! what the hook process itself costs.
//!
//!     cargo bench --bench container_start                     # as root; 20 rounds
//!     GPUPIN_BENCH_ROUNDS=50 cargo bench --bench container_start  # as root
//!
//! Each round runs, in turn, a busybox `true` container with `/bin/true` as its prestart
//! and poststop hooks (the baseline: what any hook costs runc, the exec floor), one
//! without hooks, one with gpupin's hooks but no request (what every container on a host
//! with gpupin in its hooks pays), one asking for a GPU by annotation (nodes, device
//! cgroup, ledger record, release) on the simulated `sim:nvswitch8`, and the same with a
//! live file that lists processes on two GPUs (what `foreign = "avoid"` reads and looks
//! up in /proc on every exclusive request). The variants
//! alternate within each round so that drift on the machine hits all alike.
//!
//! Then the hook alone: `gpupin-hook prestart` (and, for comparison, the CLI's `gpupin
//! hook prestart`) for a container without a request against `/bin/true`, all fed the
//! same OCI state on stdin, 10 runs of each per round, alternating. Figures are medians,
//! and ratios against the baseline of the same run.
//!
//! The binaries are cargo's unless `GPUPIN_BIN_DIR` names others: the release build, with
//! its statically linked hook, is measured with
//!
//!     scripts/build-release target/dist
//!     GPUPIN_BIN_DIR=target/dist cargo bench --bench container_start

use gpupin_sandbox::harness::binary;
use gpupin_sandbox::{
    BundleSpec, HookCommand, Requirements, build_busybox_rootfs, is_static_elf, write_bundle,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const GPUPIN_HOOK: &str = env!("CARGO_BIN_EXE_gpupin-hook");

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
    for path in [binary(GPUPIN), binary(GPUPIN_HOOK)] {
        let linked = if is_static_elf(&path) {
            "static"
        } else {
            "dynamic"
        };
        println!("container_start: {} ({linked})", path.display());
    }
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
    report(
        &format!("{rounds} rounds of `runc run` (busybox `true`)"),
        &variants,
    );
    let hooks = hook_alone(&variants[0].bundle, rounds * 10);
    report(
        &format!(
            "{} runs each of the hook process for a container without a request",
            rounds * 10
        ),
        &hooks,
    );
}

/// `gpupin hook prestart` against `/bin/true`, each fed the OCI state of a container in
/// `bundle` (which asks for nothing) on stdin, alternating.
fn hook_alone(bundle: &Path, runs: usize) -> Vec<Variant> {
    let state = serde_json::json!({
        "ociVersion": "1.0.2", "id": "bench-hook", "status": "created", "pid": 1,
        "bundle": bundle, "annotations": {},
    })
    .to_string();
    let gpupin = binary(GPUPIN);
    let hook = binary(GPUPIN_HOOK);
    let commands: [(&str, &Path, &[&str]); 3] = [
        ("/bin/true, same stdin", Path::new("/bin/true"), &[]),
        ("gpupin-hook prestart", &hook, &["prestart"]),
        ("gpupin hook prestart", &gpupin, &["hook", "prestart"]),
    ];
    let mut variants: Vec<Variant> = commands
        .iter()
        .map(|(name, _, _)| Variant {
            name,
            slug: String::new(),
            bundle: bundle.to_path_buf(),
            times: Vec::new(),
        })
        .collect();
    for _ in 0..runs {
        for (v, (_, program, args)) in variants.iter_mut().zip(&commands) {
            v.times.push(feed(program, args, state.as_bytes()));
        }
    }
    variants
}

/// Runs `program` with `stdin` on its standard input, as a runtime runs a hook.
fn feed(program: &Path, args: &[&str], stdin: &[u8]) -> Duration {
    use std::io::Write;
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // /bin/true never reads: a broken pipe is its answer, as runc tolerates it.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let status = child.wait().unwrap();
    let took = started.elapsed();
    assert!(status.success(), "{} failed: {status}", program.display());
    took
}

fn setup(dir: &Path, busybox: &Path) -> Vec<Variant> {
    let rootfs = dir.join("rootfs");
    build_busybox_rootfs(busybox, &rootfs).unwrap();
    let config = dir.join("gpupin.toml");
    let state = dir.join("state");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch8\"\n",
            state.display().to_string(),
            state.join("audit.log").display().to_string()
        ),
    )
    .unwrap();
    let hook = HookCommand::beside(&binary(GPUPIN), Some(config));
    let live_hook = HookCommand::beside(&binary(GPUPIN), Some(live_config(dir, &state)));
    // The exec floor: a hook that does nothing (runc passes it the gpupin-style args,
    // which /bin/true ignores).
    let floor = HookCommand {
        exe: PathBuf::from("/bin/true"),
        config: None,
    };
    let mut base = BundleSpec::sleeper(&rootfs);
    base.args = vec!["true".into()];
    let specs = [
        ("runc, /bin/true hooks", base.clone().with_hook(&floor)),
        ("runc, no hooks", base.clone()),
        ("gpupin, no request", base.clone().with_hook(&hook)),
        (
            "gpupin, count=1",
            base.clone()
                .with_hook(&hook)
                .annotation("gpupin.count", "1"),
        ),
        (
            "gpupin, count=1, live",
            base.with_hook(&live_hook).annotation("gpupin.count", "1"),
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

/// A config like the first, with a live file whose GPUs 6 and 7 run processes of no
/// holder (this bench and its parent): every exclusive request reads the file and looks
/// those processes up in /proc (`foreign = "avoid"`, the default).
fn live_config(dir: &Path, state: &Path) -> PathBuf {
    let me = std::process::id() as i32;
    let parent = std::os::unix::process::parent_id() as i32;
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            let processes = match i {
                6 => vec![parent],
                7 => vec![me],
                _ => vec![],
            };
            let processes: Vec<_> = processes
                .into_iter()
                .map(|pid| serde_json::json!({"pid": pid, "used_memory": "1GiB"}))
                .collect();
            serde_json::json!({"index": i, "utilization": 0, "memory_free": "40GiB",
                               "processes": processes})
        })
        .collect();
    let live = dir.join("live.json");
    std::fs::write(&live, serde_json::json!({ "gpus": gpus }).to_string()).unwrap();
    let config = dir.join("gpupin-live.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch8\"\nlive_file = {:?}\n",
            state.display().to_string(),
            state.join("audit.log").display().to_string(),
            live.display().to_string(),
        ),
    )
    .unwrap();
    config
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

/// A table of medians, with ratios against the first variant.
fn report(what: &str, variants: &[Variant]) {
    let base = median(&variants[0].times);
    println!("container_start: {what}, medians; ratio against the first row");
    println!(
        "{:<24} {:>10} {:>10} {:>8}",
        "variant", "median ms", "min ms", "ratio"
    );
    for v in variants {
        let m = median(&v.times);
        let min = v.times.iter().min().copied().unwrap_or_default();
        println!(
            "{:<24} {:>10.2} {:>10.2} {:>8.2}",
            v.name,
            m.as_secs_f64() * 1e3,
            min.as_secs_f64() * 1e3,
            m.as_secs_f64() / base.as_secs_f64()
        );
    }
}
