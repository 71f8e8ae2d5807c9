//! Every policy on 2- to 64-GPU machines, with a seeded random quarter of the GPUs held,
//! beside the brute-force reference search where that is feasible (up to 16 GPUs; at 64,
//! C(64, 32) ~ 1.8e18 sets rule it out).
//!
//!     cargo bench --bench policy                          # every count up to 16, 1..32 on 64
//!     GPUPIN_BENCH_QUICK=1 cargo bench --bench policy     # counts 1, 2, 4, 8 only, shorter runs
//!
//! After the runs it prints a Markdown table of medians (docs/policy-benchmarks.md), read
//! back from criterion's estimates. Before timing, every topology answer is checked to be
//! exact (search finished within its node budget) and, up to 16, equal to the brute force.
//!
//! Then, when tests/peers/build has built it, NVIDIA's go-gpuallocator (BestEffort) runs on
//! the same machines, counts and held GPUs, and a second table puts its time beside
//! `topology`'s and compares the two sets by gpupin's ranking ([`gpuallocator`]). A case
//! that takes it over 60 s is killed and reported as timed out (the 64-GPU machines'
//! counts above 1). `GPUPIN_BENCH_GPUALLOCATOR=0` leaves the comparison out;
//! `GPUPIN_BENCH_GPUALLOCATOR_TIMEOUT=<seconds>` sets another limit for a quicker look.

use criterion::{BenchmarkId, Criterion};
use gpupin::parts::{
    Gpu, Inventory, InventorySource, Link, Live, PolicyInput, PolicyName, load_inventory,
    reference, topology,
};
use gpupin_sandbox::harness::rng::Rng;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "policy/gpuallocator.rs"]
mod gpuallocator;

struct Machine {
    name: &'static str,
    inventory: Inventory,
    counts: Vec<usize>,
}

fn main() {
    let quick = std::env::var_os("GPUPIN_BENCH_QUICK").is_some();
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(if quick { 20 } else { 100 }))
        .measurement_time(Duration::from_millis(if quick { 50 } else { 200 }))
        .configure_from_args();
    let machines = machines(quick);
    let nodes: Vec<Vec<u64>> = machines.iter().map(|m| bench_machine(&mut c, m)).collect();
    c.final_summary();
    println!("{}", table(&machines, &nodes));
    side_by_side(&machines);
}

/// gpupin's `topology` beside go-gpuallocator's BestEffort, from the same run.
fn side_by_side(machines: &[Machine]) {
    if std::env::var_os("GPUPIN_BENCH_GPUALLOCATOR").is_some_and(|v| v == "0") {
        println!("\nNo side-by-side with go-gpuallocator: GPUPIN_BENCH_GPUALLOCATOR=0");
        return;
    }
    let peer = match gpuallocator::peer() {
        Ok(peer) => peer,
        Err(why) => {
            println!("\nNo side-by-side with go-gpuallocator: {why}");
            return;
        }
    };
    let timeout = match std::env::var("GPUPIN_BENCH_GPUALLOCATOR_TIMEOUT") {
        Ok(s) => Duration::from_secs_f64(s.parse().unwrap_or_else(|_| {
            panic!("GPUPIN_BENCH_GPUALLOCATOR_TIMEOUT={s:?}: expected seconds, such as 60")
        })),
        Err(_) => gpuallocator::TIMEOUT,
    };
    let cases: Vec<gpuallocator::Case> = machines
        .iter()
        .flat_map(|m| {
            m.counts.iter().map(|&count| gpuallocator::Case {
                machine: m.name,
                inventory: &m.inventory,
                free: free_set(m.inventory.gpus.len(), count),
                count,
            })
        })
        .collect();
    // The inventory files and cases stay for a look or a rerun of the peer by hand.
    let dir = target_dir().join("policy-gpuallocator");
    std::fs::create_dir_all(&dir).expect("target dir is writable");
    let version = gpuallocator::version(&peer);
    gpuallocator::say(&format!(
        "go-gpuallocator {version} BestEffort on {} cases, {} s limit each (inventories in {})",
        cases.len(),
        timeout.as_secs_f64(),
        dir.display()
    ));
    let answers = gpuallocator::run(&peer, &dir, &cases, timeout, |case, answer| {
        gpuallocator::say(&format!(
            "go-gpuallocator {} count {}: {answer:?}",
            case.machine, case.count
        ))
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let crit = criterion_dir();
    let rows: Vec<gpuallocator::Row> = cases
        .iter()
        .zip(&answers)
        .map(|(case, answer)| {
            let ours = median(&crit, case.machine, "topology", case.count);
            gpuallocator::row(case, ours, answer)
        })
        .collect();
    let (equal, ours, theirs, timed_out) = gpuallocator::tally(&rows);
    println!(
        "\ngpupin topology beside go-gpuallocator {version} BestEffort:\n\n{}\n\n\
         {equal} of equal worth, {ours} where gpupin's set ranks higher, {theirs} where \
         BestEffort's does, {timed_out} timed out",
        gpuallocator::table(&rows)
    );
}

fn machines(quick: bool) -> Vec<Machine> {
    let counts = |n: usize| -> Vec<usize> {
        let all: Vec<usize> = if n > 16 {
            vec![1, 2, 4, 8, 16, 32]
        } else {
            (1..=n).collect()
        };
        all.into_iter().filter(|&c| !quick || c <= 8).collect()
    };
    let sim = |name: &'static str| {
        let inventory = load_inventory(
            &InventorySource::Sim(name.into()),
            Path::new("/nonexistent"),
            &gpupin::parts::NvmlAccess::InProcess,
        )
        .expect("built-in machine");
        Machine {
            name,
            counts: counts(inventory.gpus.len()),
            inventory,
        }
    };
    let synthetic =
        |name: &'static str, gpu: &str, n: usize, link: fn(usize, usize) -> Link| Machine {
            name,
            inventory: synthetic(n, gpu, link),
            counts: counts(n),
        };
    vec![
        sim("nvswitch8"),
        sim("pcie8"),
        sim("cubemesh8"),
        sim("nvswitch16"),
        sim("dgxa100"),
        sim("hgxh200"),
        sim("gh200pair"),
        sim("pcie8pxb"),
        sim("nvbridge4"),
        synthetic("pcietree16", "NVIDIA L40S", 16, pcie_tree),
        synthetic("random16", "Bench GPU", 16, random),
        synthetic("islands64", "NVIDIA H100 80GB HBM3", 64, islands),
        synthetic("pcietree64", "NVIDIA L40S", 64, pcie_tree),
        synthetic("cubemesh64", "Tesla V100-SXM2-32GB", 64, cube_meshes),
    ]
}

/// Every pair drawn (seeded by the pair) from all link kinds: no machine looks like this,
/// but it leaves the search no interchangeable GPUs and many distinct scores.
fn random(a: usize, b: usize) -> Link {
    const KINDS: [Link; 9] = [
        Link::NvSwitch,
        Link::NvLink(1),
        Link::NvLink(2),
        Link::NvLink(4),
        Link::PcieSwitch,
        Link::PcieMultiSwitch,
        Link::HostBridge,
        Link::SameNuma,
        Link::CrossSocket,
    ];
    let mut rng = Rng(((a.min(b) as u64) << 32) | a.max(b) as u64);
    KINDS[(rng.next_u64() % KINDS.len() as u64) as usize]
}

/// Eight NVSwitch islands of eight; islands 0-3 on socket 0, 4-7 on socket 1.
fn islands(a: usize, b: usize) -> Link {
    if a / 8 == b / 8 {
        Link::NvSwitch
    } else if a / 32 == b / 32 {
        Link::SameNuma
    } else {
        Link::CrossSocket
    }
}

/// A PCIe tree: 4 GPUs per switch (PIX), 2 switches under an upstream switch (PXB), 2 of
/// those per host bridge (PHB), two host bridges per socket (NODE), two sockets (SYS).
/// At 16 GPUs that is one host bridge: PIX, PXB and PHB only.
fn pcie_tree(a: usize, b: usize) -> Link {
    if a / 4 == b / 4 {
        Link::PcieSwitch
    } else if a / 8 == b / 8 {
        Link::PcieMultiSwitch
    } else if a / 16 == b / 16 {
        Link::HostBridge
    } else if a / 32 == b / 32 {
        Link::SameNuma
    } else {
        Link::CrossSocket
    }
}

/// Eight DGX-1 cube-meshes (no interchangeable GPUs: the search works GPU by GPU), four per
/// socket, joined by PCIe: NODE within a socket, SYS across.
fn cube_meshes(a: usize, b: usize) -> Link {
    if a / 8 != b / 8 {
        return if a / 32 == b / 32 {
            Link::SameNuma
        } else {
            Link::CrossSocket
        };
    }
    let (lo, hi) = (a.min(b) % 8, a.max(b) % 8);
    if lo / 4 == hi / 4 {
        match (lo % 4, hi % 4) {
            (0, 3) | (1, 2) | (2, 3) => Link::NvLink(2),
            _ => Link::NvLink(1),
        }
    } else if hi == lo + 4 {
        Link::NvLink(if lo < 2 { 2 } else { 1 })
    } else {
        Link::CrossSocket
    }
}

/// `n` GPUs named `gpu` (the bandwidth table reads the generation from the name: a
/// cube-mesh is V100 hardware, NVSwitch islands H100; "Bench GPU" gets the defaults).
fn synthetic(n: usize, gpu: &str, link: fn(usize, usize) -> Link) -> Inventory {
    let gpus = (0..n)
        .map(|i| Gpu {
            index: i as u32,
            uuid: format!("GPU-bench-{i}"),
            name: gpu.into(),
            memory_bytes: 80 << 30,
            pci_bus_id: format!("00000000:{i:02x}:00.0"),
            minor: i as u32,
            numa_node: None,
            local_cpus: None,
            mig: None,
        })
        .collect();
    let links = (0..n)
        .map(|a| {
            (0..n)
                .map(|b| if a == b { Link::SelfLink } else { link(a, b) })
                .collect()
        })
        .collect();
    Inventory {
        source: "bench".into(),
        gpu_major: 195,
        gpus,
        control_nodes: vec![],
        links: Some(links),
        caps_major: None,
    }
}

/// A quarter of the GPUs held at random (fewer when the count needs them), seeded by
/// machine size and count.
fn free_set(n: usize, count: usize) -> Vec<bool> {
    let mut rng = Rng((n as u64) << 32 | count as u64);
    let mut free = vec![true; n];
    let mut held = 0;
    while held < (n / 4).min(n - count) {
        let p = (rng.next_u64() % n as u64) as usize;
        if free[p] {
            free[p] = false;
            held += 1;
        }
    }
    free
}

fn live(n: usize) -> Vec<Live> {
    let mut rng = Rng(n as u64);
    (0..n)
        .map(|_| Live {
            utilization: Some((rng.next_u64() % 101) as u32),
            memory_free: rng.next_u64() % (80 << 30),
            ..Live::default()
        })
        .collect()
}

/// Search nodes of the topology answer, per count.
fn bench_machine(c: &mut Criterion, m: &Machine) -> Vec<u64> {
    let n = m.inventory.gpus.len();
    let live = live(n);
    let mut group = c.benchmark_group(m.name);
    let mut nodes = Vec::new();
    for &count in &m.counts {
        let free = free_set(n, count);
        let input = PolicyInput {
            inventory: &m.inventory,
            free: &free,
            count,
            cursor: n / 2,
            live: Some(&live),
        };
        nodes.push(check(m.name, &input));
        for p in PolicyName::ALL {
            group.bench_with_input(BenchmarkId::new(p.as_str(), count), &input, |b, i| {
                b.iter(|| p.policy().choose(black_box(i)))
            });
        }
        if n <= 16 {
            group.bench_with_input(BenchmarkId::new("brute-force", count), &input, |b, i| {
                b.iter(|| reference::best(black_box(i)))
            });
        }
    }
    group.finish();
    nodes
}

/// Timing a wrong or budget-capped answer would prove nothing. Returns the search nodes.
fn check(machine: &str, input: &PolicyInput) -> u64 {
    let out = topology::search(input).expect("enough GPUs are free");
    assert!(
        out.exact,
        "{machine} count {}: node budget ran out",
        input.count
    );
    if input.inventory.gpus.len() <= 16 {
        assert_eq!(
            Some(out.chosen),
            reference::best(input),
            "{machine} count {}",
            input.count
        );
    }
    out.nodes
}

const COLUMNS: [&str; 6] = [
    "topology",
    "brute-force",
    "pack",
    "spread",
    "least-loaded",
    "most-free",
];

/// Medians from criterion's estimates, one row per machine and count.
fn table(machines: &[Machine], nodes: &[Vec<u64>]) -> String {
    let dir = criterion_dir();
    let mut out = String::from("| machine | count | ");
    out += &COLUMNS.join(" | ");
    out += " | topology / brute force | search nodes |\n|---|---:|";
    out += &"---:|".repeat(COLUMNS.len() + 2);
    for (m, nodes) in machines.iter().zip(nodes) {
        for (&count, nodes) in m.counts.iter().zip(nodes) {
            let medians: Vec<Option<f64>> = COLUMNS
                .iter()
                .map(|p| median(&dir, m.name, p, count))
                .collect();
            let cells: Vec<String> = medians
                .iter()
                .map(|v| v.map_or("n/a".into(), human))
                .collect();
            let ratio = match (medians[0], medians[1]) {
                (Some(t), Some(b)) => format!("{:.3}", t / b),
                _ => "n/a".into(),
            };
            out += &format!(
                "\n| {} | {count} | {} | {ratio} | {nodes} |",
                m.name,
                cells.join(" | ")
            );
        }
    }
    out
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from)
}

fn criterion_dir() -> PathBuf {
    std::env::var_os("CRITERION_HOME").map_or_else(|| target_dir().join("criterion"), PathBuf::from)
}

/// Nanoseconds, or `None` when that benchmark did not run (brute force at 64, a filter).
fn median(dir: &Path, group: &str, policy: &str, count: usize) -> Option<f64> {
    let path = dir
        .join(group)
        .join(policy)
        .join(count.to_string())
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn human(ns: f64) -> String {
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{:.2} ms", ns / 1e6)
    }
}
