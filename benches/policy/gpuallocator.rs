//! gpupin's `topology` policy beside NVIDIA's go-gpuallocator BestEffort policy (what
//! NVIDIA's Kubernetes device plugin answers GetPreferredAllocation with), on the same
//! machines, counts and held GPUs: `benches/policy.rs` prints the table after its own,
//! and `tests/policy_gpuallocator.rs` checks the plumbing on small cases.
//!
//! The peer is `gpuallocator-bench` (tests/peers/allocator, built by tests/peers/build
//! into `<peers cache>/allocator/`). It reads the inventory files written here, in
//! gpupin's JSON format, builds go-gpuallocator's devices from each pair's link, times
//! `Allocate` and prints one JSON line per case, or `timed_out` past the time limit.
//!
//! "Worth" is gpupin's ranking (`policy::topology`'s terms in order, without the
//! lowest-positions tie-break): two sets of equal worth are equally good by every term
//! gpupin compares.

// Both the bench and the test include this file; neither uses all of it.
#![allow(dead_code)]

use gpupin::parts::{Inventory, PolicyInput, Terms, to_json, topology};
use serde::Deserialize;
use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The limit the issue sets on one case of the peer.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// The built peer, or why it is not there.
pub fn peer() -> Result<PathBuf, String> {
    let cache = gpupin_sandbox::harness::toolkit::peers_cache()?;
    let bin = cache.join("allocator").join("gpuallocator-bench");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!(
            "no {}: run tests/peers/build (needs Go)",
            bin.display()
        ))
    }
}

/// go-gpuallocator's version, as tests/peers/build recorded it beside the peer.
pub fn version(peer: &Path) -> String {
    peer.parent()
        .and_then(|dir| std::fs::read_to_string(dir.join("version")).ok())
        .map_or_else(|| "unknown".into(), |v| v.trim().to_string())
}

/// One request: `count` GPUs of `machine` with only the `free` positions available.
pub struct Case<'a> {
    pub machine: &'a str,
    pub inventory: &'a Inventory,
    pub free: Vec<bool>,
    pub count: usize,
}

impl Case<'_> {
    /// The GPU indexes not available (what the peer is told).
    pub fn held(&self) -> Vec<u32> {
        self.free
            .iter()
            .zip(&self.inventory.gpus)
            .filter(|(free, _)| !**free)
            .map(|(_, g)| g.index)
            .collect()
    }

    fn input(&self) -> PolicyInput<'_> {
        PolicyInput {
            inventory: self.inventory,
            free: &self.free,
            count: self.count,
            cursor: 0,
            live: None,
        }
    }
}

/// What go-gpuallocator answered for one case.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Its set (positions, ascending) and the median time of one call.
    Chosen {
        chosen: Vec<usize>,
        ns_per_call: f64,
    },
    /// The case ran past the limit and was killed.
    TimedOut { timeout_s: f64 },
}

/// One line of the peer's output.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    machine: String,
    count: usize,
    held: Vec<u32>,
    ns_per_call: Option<f64>,
    calls: Option<u64>,
    chosen: Option<Vec<u32>>,
    #[serde(default)]
    timed_out: bool,
    timeout_s: Option<f64>,
}

/// Runs the peer over `cases` (each machine's inventory written into `dir`), calling
/// `progress` as each answer arrives: the 64-GPU cases take a minute each.
pub fn run(
    peer: &Path,
    dir: &Path,
    cases: &[Case],
    timeout: Duration,
    mut progress: impl FnMut(&Case, &Answer),
) -> Result<Vec<Answer>, String> {
    let mut files: BTreeMap<&str, PathBuf> = BTreeMap::new();
    let mut requests = String::new();
    for case in cases {
        let file = match files.get(case.machine) {
            Some(file) => file.clone(),
            None => {
                let file = dir.join(format!("{}.json", case.machine));
                std::fs::write(&file, to_json(case.inventory))
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                files.insert(case.machine, file.clone());
                file
            }
        };
        let request = serde_json::json!({
            "machine": case.machine,
            "inventory": file,
            "count": case.count,
            "held": case.held(),
        });
        requests += &format!("{request}\n");
    }
    let cases_file = dir.join("cases.jsonl");
    std::fs::write(&cases_file, requests).map_err(|e| format!("{}: {e}", cases_file.display()))?;

    let mut child = Command::new(peer)
        .arg("-timeout")
        .arg(format!("{}ms", timeout.as_millis()))
        .arg(&cases_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", peer.display()))?;
    let stdout = child.stdout.take().expect("piped");
    let mut answers = Vec::new();
    let mut lines = BufReader::new(stdout).lines();
    for case in cases {
        let line = match lines.next() {
            Some(line) => line.map_err(|e| format!("reading {}: {e}", peer.display()))?,
            None => break,
        };
        let answer = parse(case, &line)?;
        progress(case, &answer);
        answers.push(answer);
    }
    let status = child
        .wait()
        .map_err(|e| format!("{}: {e}", peer.display()))?;
    if !status.success() || answers.len() != cases.len() {
        return Err(format!(
            "{} ended ({status}) after {} of {} cases: its error is above",
            peer.display(),
            answers.len(),
            cases.len()
        ));
    }
    Ok(answers)
}

/// One answer, checked against the case it is for.
fn parse(case: &Case, text: &str) -> Result<Answer, String> {
    let bad = |why: String| format!("gpuallocator-bench answered {text:?}: {why}");
    let line: Line = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    if line.machine != case.machine || line.count != case.count || line.held != case.held() {
        return Err(bad(format!(
            "expected the answer for {} count {} held {:?}",
            case.machine,
            case.count,
            case.held()
        )));
    }
    if line.timed_out {
        let timeout_s = line
            .timeout_s
            .ok_or_else(|| bad("timed_out without timeout_s".into()))?;
        return Ok(Answer::TimedOut { timeout_s });
    }
    let (Some(ns_per_call), Some(_calls), Some(chosen)) =
        (line.ns_per_call, line.calls, line.chosen)
    else {
        return Err(bad("expected ns_per_call, calls and chosen".into()));
    };
    let positions: Vec<usize> = chosen
        .iter()
        .map(|&index| {
            case.inventory
                .gpus
                .iter()
                .position(|g| g.index == index)
                .filter(|&p| case.free[p])
                .ok_or_else(|| bad(format!("GPU {index} is not a free GPU of the machine")))
        })
        .collect::<Result<_, _>>()?;
    let mut sorted = positions.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != case.count || ns_per_call.is_nan() || ns_per_call <= 0.0 {
        return Err(bad(format!(
            "expected {} distinct GPUs and a time above 0",
            case.count
        )));
    }
    Ok(Answer::Chosen {
        chosen: sorted,
        ns_per_call,
    })
}

/// gpupin's own answer for a case: the `topology` policy's set.
pub fn gpupin_choice(case: &Case) -> Vec<usize> {
    topology::search(&case.input())
        .expect("enough GPUs are free")
        .chosen
}

/// How go-gpuallocator's set compares with gpupin's by gpupin's ranking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Worth {
    Equal,
    /// gpupin's set ranks higher; the first term that differs, gpupin's value first.
    GpupinBetter(String),
    /// go-gpuallocator's set ranks higher (the search would then be wrong).
    PeerBetter(String),
}

impl std::fmt::Display for Worth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Worth::Equal => f.write_str("equal"),
            Worth::GpupinBetter(why) => write!(f, "gpupin's better: {why}"),
            Worth::PeerBetter(why) => write!(f, "BestEffort's better: {why}"),
        }
    }
}

/// The two sets (positions, all free in `case`) by gpupin's ranking.
pub fn worth(case: &Case, gpupin: &[usize], peer: &[usize]) -> Worth {
    let input = case.input();
    let (Some(a), Some(b)) = (
        topology::terms(&input, gpupin),
        topology::terms(&input, peer),
    ) else {
        // No link data: every set ties (the policy is then `pack`).
        return Worth::Equal;
    };
    match a.rank().cmp(&b.rank()) {
        Ordering::Equal => Worth::Equal,
        Ordering::Greater => Worth::GpupinBetter(first_difference(&a, &b)),
        Ordering::Less => Worth::PeerBetter(first_difference(&b, &a)),
    }
}

/// The first ranking term where `better` beats `worse`, both values, better first.
fn first_difference(better: &Terms, worse: &Terms) -> String {
    let gb = |mbs: u64| format!("{:.1} GB/s", mbs as f64 / 1000.0);
    if better.worst_path != worse.worst_path {
        let path = |t: &Terms| match t.worst_path.as_str() {
            "none" => "all NVLink".to_string(),
            p => p.to_string(),
        };
        format!("worst PCIe path {} vs {}", path(better), path(worse))
    } else if better.ring != worse.ring {
        format!("ring {} vs {}", gb(better.ring), gb(worse.ring))
    } else if better.slowest != worse.slowest {
        format!(
            "slowest pair {} vs {}",
            gb(better.slowest),
            gb(worse.slowest)
        )
    } else if better.total != worse.total {
        format!("total {} vs {}", gb(better.total), gb(worse.total))
    } else {
        format!(
            "leaves the free GPUs better linked: {} vs {} to them",
            gb(better.left),
            gb(worse.left)
        )
    }
}

/// GPU indexes as ranges: `0-3,8,10-11`.
pub fn ranges(inventory: &Inventory, positions: &[usize]) -> String {
    let mut indexes: Vec<u32> = positions.iter().map(|&p| inventory.gpus[p].index).collect();
    indexes.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < indexes.len() {
        let mut j = i;
        while j + 1 < indexes.len() && indexes[j + 1] == indexes[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            indexes[i].to_string()
        } else {
            format!("{}-{}", indexes[i], indexes[j])
        });
        i = j + 1;
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    }
}

/// One row of the side-by-side table.
pub struct Row {
    pub machine: String,
    pub count: usize,
    /// GPU indexes held, as ranges.
    pub held: String,
    /// gpupin's median, ns; `None` when the bench did not time it.
    pub gpupin_ns: Option<f64>,
    pub gpupin_set: String,
    pub answer: Answer,
    pub peer_set: Option<String>,
    pub worth: Option<Worth>,
}

/// Compares one case's answers; `gpupin_ns` comes from the bench's own timing.
pub fn row(case: &Case, gpupin_ns: Option<f64>, answer: &Answer) -> Row {
    let ours = gpupin_choice(case);
    let (peer_set, worth) = match answer {
        Answer::Chosen { chosen, .. } => (
            Some(ranges(case.inventory, chosen)),
            Some(worth(case, &ours, chosen)),
        ),
        Answer::TimedOut { .. } => (None, None),
    };
    let held: Vec<usize> = (0..case.free.len()).filter(|&p| !case.free[p]).collect();
    Row {
        machine: case.machine.to_string(),
        count: case.count,
        held: ranges(case.inventory, &held),
        gpupin_ns,
        gpupin_set: ranges(case.inventory, &ours),
        answer: answer.clone(),
        peer_set,
        worth,
    }
}

/// The Markdown table (docs/policy-benchmarks.md).
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| machine | count | held | gpupin topology | go-gpuallocator BestEffort | BestEffort / topology | gpupin's set | BestEffort's set | worth by gpupin's ranking |\n\
         |---|---:|---|---:|---:|---:|---|---|---|",
    );
    for r in rows {
        let gpupin = r.gpupin_ns.map_or("n/a".into(), human);
        let (peer, ratio) = match (&r.answer, r.gpupin_ns) {
            (Answer::Chosen { ns_per_call, .. }, Some(ours)) => {
                (human(*ns_per_call), ratio(ns_per_call / ours))
            }
            (Answer::Chosen { ns_per_call, .. }, None) => (human(*ns_per_call), "n/a".into()),
            (Answer::TimedOut { timeout_s }, _) => {
                (format!("timed out ({timeout_s:.0} s)"), "n/a".into())
            }
        };
        out += &format!(
            "\n| {} | {} | {} | {gpupin} | {peer} | {ratio} | {} | {} | {} |",
            r.machine,
            r.count,
            r.held,
            r.gpupin_set,
            r.peer_set.as_deref().unwrap_or("-"),
            r.worth
                .as_ref()
                .map_or_else(|| "-".to_string(), |w| w.to_string()),
        );
    }
    out
}

/// Counts for the summary under the table: (equal, gpupin better, peer better, timed out).
pub fn tally(rows: &[Row]) -> (usize, usize, usize, usize) {
    let mut t = (0, 0, 0, 0);
    for r in rows {
        match &r.worth {
            Some(Worth::Equal) => t.0 += 1,
            Some(Worth::GpupinBetter(_)) => t.1 += 1,
            Some(Worth::PeerBetter(_)) => t.2 += 1,
            None => t.3 += 1,
        }
    }
    t
}

/// Two significant digits below 10 (0.034, 0.71, 3.4), whole numbers above.
fn ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}")
    } else {
        let decimals = (1.0 - r.log10().floor()).clamp(1.0, 6.0) as usize;
        format!("{r:.decimals$}")
    }
}

/// Nanoseconds as the bench's own table writes them.
pub fn human(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Writes progress where a long bench run shows it (stderr is not captured).
pub fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}
