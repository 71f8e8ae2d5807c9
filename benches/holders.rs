//! What a container start and a `gpupin pick` cost as the ledger fills: the same
//! `gpupin.count=1` request against 0, 100, 1,000 and 10,000 holders already there.
//!
//!     cargo bench --bench holders                                  # as root
//!     GPUPIN_BENCH_HOLDERS=0,1000 GPUPIN_BENCH_ROUNDS=9 cargo bench --bench holders
//!     scripts/build-release target/dist && GPUPIN_BIN_DIR=target/dist cargo bench --bench holders
//!
//! The machine is `sim:nvswitch16` with `max_shared = 1000`, and every holder is a shared
//! one on a GPU in turn, as on an inference box that runs many small containers per GPU.
//! The holders are made by gpupin: one `gpupin exec --share shared` of a long-lived
//! process writes the first record, and the others are that record again under other
//! names and GPUs, all naming that one process (so that its liveness is what a look at
//! each holder finds).
//!
//! Per size, `rounds` times: `gpupin pick --count 1 --share shared` (CPU time), and the
//! hook pair of a container that asks `gpupin.count=1, gpupin.share=shared`:
//! `gpupin-hook prestart` (GPUs chosen, nodes made, record bound) for a process in its own
//! mount namespace, then `gpupin-hook poststop` (released), as runc runs them (CPU time of
//! both, peak RSS of the prestart). Medians; the ratios are against the empty ledger of
//! the same run. CPU time, not wall time: the figures are what each call costs the
//! machine, whatever else runs on it.

use gpupin_sandbox::harness::binary;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const GPUPIN_HOOK: &str = env!("CARGO_BIN_EXE_gpupin-hook");
const GPUS: usize = 16;

fn main() {
    if !rustix::process::geteuid().is_root() {
        println!("holders: not run: the hook's prestart makes device nodes, which needs root");
        return;
    }
    let sizes: Vec<usize> = std::env::var("GPUPIN_BENCH_HOLDERS")
        .ok()
        .map(|v| v.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![0, 100, 1_000, 10_000]);
    let rounds: usize = std::env::var("GPUPIN_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    println!(
        "holders: {} and {}, {rounds} rounds per size",
        binary(GPUPIN).display(),
        binary(GPUPIN_HOOK).display()
    );
    let mut rows = Vec::new();
    for &size in &sizes {
        let dir = tempfile::Builder::new()
            .prefix("gpupin-bench-holders")
            .tempdir()
            .unwrap();
        let box_ = Box_::fill(dir.path(), size);
        rows.push((size, box_.measure(rounds)));
    }
    report(&rows);
}

/// A machine with its ledger filled, and the process every holder names.
struct Box_ {
    config: PathBuf,
    /// The ledger's records, and how many were made.
    holders: PathBuf,
    size: usize,
    bundle: PathBuf,
    /// `gpupin exec`, and the pid of the job it started, which the records name.
    exec: Option<(Child, i32)>,
}

impl Drop for Box_ {
    fn drop(&mut self) {
        if let Some((exec, job_pid)) = &mut self.exec {
            // SAFETY: a plain kill of the job this bench started.
            unsafe { libc::kill(*job_pid, libc::SIGKILL) };
            let _ = exec.kill();
            let _ = exec.wait();
        }
    }
}

/// What one size cost: medians of CPU milliseconds, and the prestart's peak RSS in KiB.
struct Figures {
    pick_ms: f64,
    pair_ms: f64,
    prestart_rss_kib: u64,
}

impl Box_ {
    fn fill(dir: &Path, size: usize) -> Box_ {
        let state = dir.join("state");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "inventory = \"sim:nvswitch16\"\nstate_dir = {:?}\naudit_log = {:?}\nmax_shared = 1000\n",
                state.display().to_string(),
                dir.join("audit.log").display().to_string()
            ),
        )
        .unwrap();
        // gpupin's exec writes the first record and keeps its process alive; the empty
        // ledger has none.
        let mut exec = None;
        if size > 0 {
            let mut started = Command::new(binary(GPUPIN))
                .args(["--config", config.to_str().unwrap()])
                .args(["exec", "--share", "shared", "--count", "1", "--"])
                .args(["sleep", "1000000"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap();
            let holders = state.join("holders");
            let record = wait_for_record(&holders, &mut started);
            let job_pid = record["pid"].as_i64().unwrap() as i32;
            exec = Some((started, job_pid));
            let uuid = |gpu: usize| {
                let mut uuid = record["gpus"][0].as_str().unwrap().to_string();
                uuid.truncate(uuid.len() - 12);
                format!("{uuid}{gpu:012x}")
            };
            for n in 1..size {
                let gpu = n % GPUS;
                let mut copy = record.clone();
                copy["id"] = format!("bench-{n}").into();
                copy["gpus"] = serde_json::json!([uuid(gpu)]);
                copy["indices"] = serde_json::json!([gpu]);
                // Written beside the ledger and renamed into it, as gpupin writes records:
                // the exec's job looks at the ledger meanwhile, and must never see half a
                // record.
                let staged = dir.join("record.json");
                std::fs::write(&staged, serde_json::to_string_pretty(&copy).unwrap() + "\n")
                    .unwrap();
                std::fs::rename(&staged, holders.join(format!("bench-{n}.json"))).unwrap();
            }
        }
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(bundle.join("rootfs/dev")).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            serde_json::json!({
                "ociVersion": "1.0.2",
                "process": {"args": ["true"], "cwd": "/"},
                "root": {"path": "rootfs"},
                "annotations": asked(),
            })
            .to_string(),
        )
        .unwrap();
        Box_ {
            config,
            holders: state.join("holders"),
            size,
            bundle,
            exec,
        }
    }

    fn measure(&self, rounds: usize) -> Figures {
        let config = self.config.to_str().unwrap();
        let (mut pick, mut pair, mut rss) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let (cpu, _) = run(
                Command::new(binary(GPUPIN))
                    .args(["--config", config, "pick", "--count", "1"])
                    .args(["--share", "shared"]),
                b"",
            );
            pick.push(cpu);
            // The container's process: in a mount namespace of its own, as runc's is.
            let mut container = Command::new("unshare")
                .args(["--mount", "--propagation", "private", "sleep", "1000"])
                .spawn()
                .unwrap();
            wait_for_own_mounts(container.id());
            let id = format!("bench-ctr-{round}");
            let state = |status: &str, pid: Option<u32>| {
                let mut s = serde_json::json!({
                    "ociVersion": "1.0.2", "id": id, "status": status,
                    "bundle": self.bundle, "annotations": asked(),
                });
                if let Some(pid) = pid {
                    s["pid"] = pid.into();
                }
                s.to_string()
            };
            let hook = |stage: &str, stdin: String| {
                run(
                    Command::new(binary(GPUPIN_HOOK)).args(["--config", config, stage]),
                    stdin.as_bytes(),
                )
            };
            let (start_cpu, start_rss) = hook("prestart", state("created", Some(container.id())));
            let _ = container.kill();
            let _ = container.wait();
            let (stop_cpu, _) = hook("poststop", state("stopped", None));
            pair.push(start_cpu + stop_cpu);
            rss.push(start_rss);
        }
        // Every holder was there all along: none went stale, the containers' went again.
        let records = std::fs::read_dir(&self.holders).map_or(0, |d| d.count());
        assert_eq!(records, self.size, "records in {}", self.holders.display());
        Figures {
            pick_ms: median_ms(&mut pick),
            pair_ms: median_ms(&mut pair),
            prestart_rss_kib: {
                rss.sort_unstable();
                rss[rss.len() / 2]
            },
        }
    }
}

fn asked() -> serde_json::Value {
    serde_json::json!({"gpupin.count": "1", "gpupin.share": "shared"})
}

/// Runs `command` with `stdin`, which must succeed; its CPU time (user and system) and
/// peak RSS in KiB, from the kernel's account of that child alone (`wait4`).
// The child is reaped by wait4, which std's `wait` cannot stand in for (no rusage).
#[allow(clippy::zombie_processes)]
fn run(command: &mut Command, stdin: &[u8]) -> (Duration, u64) {
    use std::io::Write;
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(stdin);
    let mut stderr = String::new();
    let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `child` is ours and not yet waited for; `status` and `usage` outlive the call.
    let waited = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(
        waited,
        child.id() as i32,
        "wait4: {}",
        std::io::Error::last_os_error()
    );
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "{command:?} failed: {stderr}"
    );
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    (
        time(usage.ru_utime) + time(usage.ru_stime),
        usage.ru_maxrss as u64,
    )
}

/// The record `gpupin exec` wrote, once it names the job (bound to it) rather than the
/// exec itself.
fn wait_for_record(holders: &Path, exec: &mut Child) -> serde_json::Value {
    for _ in 0..500 {
        let record = std::fs::read_dir(holders).ok().and_then(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .find(|p| p.extension().is_some_and(|x| x == "json"))
        });
        let bound = record
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .filter(|r| {
                r["pid"]
                    .as_i64()
                    .is_some_and(|pid| pid != i64::from(exec.id()))
            });
        if let Some(record) = bound {
            return record;
        }
        assert!(exec.try_wait().unwrap().is_none(), "gpupin exec ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("gpupin exec wrote no record in {}", holders.display());
}

/// Until `pid` runs in a mount namespace other than ours (unshare has done its work).
fn wait_for_own_mounts(pid: u32) {
    let ours = std::fs::read_link("/proc/self/ns/mnt").unwrap();
    for _ in 0..500 {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
        if theirs.is_ok_and(|t| t != ours) {
            return;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    panic!("process {pid} never entered a mount namespace of its own");
}

fn median_ms(times: &mut [Duration]) -> f64 {
    times.sort_unstable();
    times[times.len() / 2].as_secs_f64() * 1000.0
}

fn report(rows: &[(usize, Figures)]) {
    let Some((_, empty)) = rows.iter().find(|(size, _)| *size == 0).or(rows.first()) else {
        return;
    };
    println!(
        "{:>8}  {:>12} {:>6}  {:>22} {:>6}  {:>18}",
        "holders", "pick cpu", "ratio", "prestart+poststop cpu", "ratio", "prestart peak RSS"
    );
    for (size, f) in rows {
        println!(
            "{size:>8}  {:>9.1} ms {:>5.2}x  {:>19.1} ms {:>5.2}x  {:>15.1} MB",
            f.pick_ms,
            f.pick_ms / empty.pick_ms,
            f.pair_ms,
            f.pair_ms / empty.pair_ms,
            f.prestart_rss_kib as f64 / 1024.0
        );
    }
}
