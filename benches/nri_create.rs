//! What a pod's container costs to create and start through the CRI, as containerd 2.x
//! sees it: with `gpupin nri` (NRI, the default runtime), with the `gpupin` runtime
//! handler (gpupin-runtime, no NRI), and with neither (the baseline of the same run: the
//! CRI and runc alone, asking for nothing).
//!
//!     GPUPIN_ENGINES=modern cargo bench --bench nri_create                  # as root; 200 creates each
//!     GPUPIN_ENGINES=modern GPUPIN_BENCH_ROUNDS=5 cargo test --bench nri_create   # smoke
//!
//! Each round runs a pod (host network, not timed), then times CreateContainer and
//! StartContainer of its container together (NRI allocates at create, the runtime
//! handler at start), then stops and removes the pod (not timed): the GPU goes back
//! before the next round. The three nodes are private containerds of the peers' 2.4.2
//! (tests/containerd_support, tests/cri_support), on the simulated `sim:nvswitch8`; the
//! rounds alternate between them so that drift on the machine hits all alike. Printed:
//! p50 and p99 of each, and their ratios to the baseline.

#[path = "../tests/containerd_support/mod.rs"]
mod containerd_support;
#[path = "../tests/cri_support/mod.rs"]
mod cri_support;

use cri_support::{Node, container_config, sandbox_config};
use std::time::{Duration, Instant};

struct Way {
    name: &'static str,
    node: Node,
    handler: &'static str,
    annotations: &'static [(&'static str, &'static str)],
    times: Vec<Duration>,
}

fn main() {
    let rounds: usize = std::env::var("GPUPIN_BENCH_ROUNDS")
        .ok()
        .map(|r| {
            r.parse().unwrap_or_else(|_| {
                panic!("GPUPIN_BENCH_ROUNDS={r:?}: expected a whole number, such as 200")
            })
        })
        .unwrap_or(200);
    if !containerd_support::is_v2() {
        println!("nri_create: NRI needs containerd 2.x: run with GPUPIN_ENGINES=modern");
        return;
    }
    let Some(baseline) = Node::start("nri_create baseline") else {
        return;
    };
    let Some(nri) = Node::start_with_nri("nri_create nri", |_| {}) else {
        return;
    };
    let _plugin = nri.start_nri_plugin("gpupin-nri.log");
    let Some(handler) = Node::start("nri_create handler") else {
        return;
    };
    let mut ways = [
        Way {
            name: "CRI and runc alone, no request (baseline)",
            node: baseline,
            handler: "",
            annotations: &[],
            times: Vec::new(),
        },
        Way {
            name: "`gpupin nri`, gpupin.count=1",
            node: nri,
            handler: "",
            annotations: &[("gpupin.count", "1")],
            times: Vec::new(),
        },
        Way {
            name: "runtime handler `gpupin`, gpupin.count=1",
            node: handler,
            handler: cri_support::HANDLER,
            annotations: &[("gpupin.count", "1")],
            times: Vec::new(),
        },
    ];
    for round in 0..rounds {
        for way in &mut ways {
            way.times.push(create_and_start(way, round));
        }
    }
    println!("\n| way | p50 | p99 | p50 / baseline | p99 / baseline |");
    println!("|---|---:|---:|---:|---:|");
    let (base50, base99) = percentiles(&mut ways[0].times.clone());
    for way in &mut ways {
        let (p50, p99) = percentiles(&mut way.times);
        println!(
            "| {} | {:.1} ms | {:.1} ms | {:.2} | {:.2} |",
            way.name,
            ms(p50),
            ms(p99),
            ms(p50) / ms(base50),
            ms(p99) / ms(base99)
        );
    }
}

/// One round of `way`: the create and start of a pod's container, timed.
fn create_and_start(way: &Way, round: usize) -> Duration {
    let cri = &way.node.cri;
    let sandbox = sandbox_config(&format!("bench-{round}"), way.annotations);
    let pod = cri
        .run_pod_sandbox(&sandbox, way.handler)
        .unwrap_or_else(|e| panic!("{}: RunPodSandbox: {e}", way.name));
    let started = Instant::now();
    let container = cri
        .create_container(&pod, container_config("main", &[], &[], &[], &[]), &sandbox)
        .unwrap_or_else(|e| panic!("{}: CreateContainer: {e}", way.name));
    cri.start_container(&container)
        .unwrap_or_else(|e| panic!("{}: StartContainer: {e}", way.name));
    let took = started.elapsed();
    cri.stop_pod_sandbox(&pod).unwrap();
    cri.remove_pod_sandbox(&pod).unwrap();
    took
}

/// p50 and p99 (nearest rank) of `times`.
fn percentiles(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort();
    let at = |p: f64| times[((p * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    (at(0.50), at(0.99))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
