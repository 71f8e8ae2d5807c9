//! A year of a busy box's audit trail and what reading it costs: `gpupin usage`, `gpupin
//! log --holder` and `gpupin metrics` as child processes, each timed by the kernel's
//! account of the child (getrusage: user + system cpu, peak RSS), not by a wall clock.
//!
//!     cargo bench --bench audit_year                              # 365 days, 3 rounds
//!     GPUPIN_BENCH_AUDIT_DAYS=3 GPUPIN_BENCH_ROUNDS=1 cargo test --bench audit_year    # smoke
//!     GPUPIN_BENCH_KEEP=1 cargo bench --bench audit_year      # keeps the trail, to profile
//!
//! `.ci/run` runs the smoke size in the test profile: the generator and every command
//! still run; no figure is judged.
//!
//! The trail (benches/audit_year/generate.rs, seeded) is written to a temp dir ending now:
//! 40 users, 16 GPUs, about 2,050 events a day in gpupin's own line format, rotated as
//! gpupin rotates (`audit_max_size` 64 MiB, `audit_keep` 4: five files for a year). Each
//! command runs once untimed (so that the page cache holds the files and whatever an
//! earlier run leaves, such as the metrics cursor, is there), then `GPUPIN_BENCH_ROUNDS`
//! times; the table gives the median cpu, the largest peak RSS and the median wall time.
//! `gpupin metrics` runs as the user running the bench, who owns the state dir and so
//! keeps the counters' cursor there, as root does; its last row removes the cursor before
//! each run (a first scrape). Likewise `gpupin usage` writes its digests of the log's files
//! (`audit.digests/`) on the untimed run, as root's first read does; the row "no digests"
//! removes them before each run.

#[path = "audit_year/generate.rs"]
mod generate;

use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// What the kernel says one child cost.
struct Cost {
    cpu: Duration,
    max_rss_kib: u64,
    wall: Duration,
}

fn main() {
    let days: u32 = env_number("GPUPIN_BENCH_AUDIT_DAYS", 365);
    let rounds: usize = env_number("GPUPIN_BENCH_ROUNDS", 3).max(1);
    let dir = tempfile::tempdir().expect("a temp dir");
    if std::env::var_os("GPUPIN_BENCH_KEEP").is_some() {
        // To profile a command by hand: the trail and its config stay.
        let kept = dir.keep();
        println!("audit_year: the trail is kept in {}", kept.display());
        return main_in(&kept, days, rounds);
    }
    main_in(dir.path(), days, rounds);
}

fn main_in(dir: &Path, days: u32, rounds: usize) {
    let log_dir = dir.join("log");
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs();
    let year = generate::Year {
        days,
        seed: 34,
        end: now,
        max_bytes: 64 << 20,
        keep: 4,
    };
    let started = Instant::now();
    let written = generate::write_year(&log_dir, &year).expect("writing the trail");
    println!(
        "audit_year: {days} days, {} events ({} refusals), {:.0} MB in {} files of the main log, written in {:.1} s",
        written.events,
        written.refusals,
        written.bytes as f64 / 1e6,
        written.files.len(),
        started.elapsed().as_secs_f64()
    );
    // The state dir a box that has allocated before has (root's, 0755), where the
    // counters' cursor is kept.
    let state = dir.join("state");
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&state)
        .expect("creating the state dir");
    let config = dir.join("gpupin.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = {:?}\naudit_log = {:?}\ninventory = \"sim:nvswitch16\"\n",
            state,
            log_dir.join("audit.log"),
        ),
    )
    .expect("writing the config");
    let holder = written.a_holder.clone();
    let commands: Vec<(Vec<&str>, Forget)> = vec![
        (vec!["usage", "--since", "365d"], Forget::Nothing),
        (
            vec!["usage", "--since", "365d", "--by", "gpu"],
            Forget::Nothing,
        ),
        (
            vec!["usage", "--since", "365d", "--by", "holder"],
            Forget::Nothing,
        ),
        (vec!["usage", "--since", "7d"], Forget::Nothing),
        (vec!["usage", "--since", "365d"], Forget::Digests),
        (vec!["log", "--holder", &holder], Forget::Nothing),
        (vec!["metrics"], Forget::Nothing),
        (vec!["metrics"], Forget::Cursor),
    ];
    println!("\n| command | cpu (median of {rounds}) | peak RSS | wall (median) |");
    println!("|---|---:|---:|---:|");
    let cursor = state.join("metrics-cursor.json");
    let digests = log_dir.join("audit.digests");
    for (args, forgotten) in &commands {
        let forget = || match forgotten {
            Forget::Nothing => {}
            Forget::Cursor => {
                let _ = std::fs::remove_file(&cursor);
            }
            Forget::Digests => {
                let _ = std::fs::remove_dir_all(&digests);
            }
        };
        forget();
        run(&config, args);
        let mut costs: Vec<Cost> = (0..rounds)
            .map(|_| {
                forget();
                run(&config, args)
            })
            .collect();
        costs.sort_by_key(|c| c.cpu);
        let cpu = costs[costs.len() / 2].cpu;
        let rss = costs.iter().map(|c| c.max_rss_kib).max().unwrap_or(0);
        let mut walls: Vec<Duration> = costs.iter().map(|c| c.wall).collect();
        walls.sort();
        let shown = args
            .iter()
            .map(|a| if *a == holder { "X" } else { a })
            .collect::<Vec<_>>()
            .join(" ");
        let label = match forgotten {
            Forget::Nothing => format!("`gpupin {shown}`"),
            Forget::Cursor => format!("`gpupin {shown}`, no cursor"),
            Forget::Digests => format!("`gpupin {shown}`, no digests"),
        };
        println!(
            "| {label} | {:.3} s | {:.1} MiB | {:.3} s |",
            cpu.as_secs_f64(),
            rss as f64 / 1024.0,
            walls[walls.len() / 2].as_secs_f64()
        );
    }
}

/// What a row removes before each run, to time a first read.
enum Forget {
    Nothing,
    /// The counters' cursor: a first scrape (after a reboot, or by a user where root
    /// never scraped and no metrics file is kept).
    Cursor,
    /// `usage`'s digests of the log's files: the first read after an upgrade, which
    /// writes them (the bench runs as the log's owner, as root does).
    Digests,
}

fn env_number<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?}: expected a whole number, such as 3")),
        Err(_) => default,
    }
}

/// Runs `gpupin --config CONFIG ARGS`, its output to /dev/null, and reads its cost from
/// wait4 (this child's rusage alone). A failure ends the bench: a figure of a command
/// that failed would measure nothing.
// The child is reaped by wait4, which std's `wait` cannot stand in for (no rusage).
#[allow(clippy::zombie_processes)]
fn run(config: &Path, args: &[&str]) -> Cost {
    let started = Instant::now();
    let child = Command::new(GPUPIN)
        .env_remove("GPUPIN_CONFIG")
        .arg("--config")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting gpupin");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for the kernel to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not waited for yet; both pointers are to live locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed();
    assert_eq!(waited, pid, "wait4: {}", std::io::Error::last_os_error());
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr {
        use std::io::Read;
        let _ = pipe.read_to_string(&mut stderr);
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "gpupin {args:?} failed: {stderr}"
    );
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Cost {
        cpu: time(usage.ru_utime) + time(usage.ru_stime),
        max_rss_kib: usage.ru_maxrss as u64,
        wall,
    }
}
