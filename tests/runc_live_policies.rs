//! `least-loaded` and `most-free` with real runc containers, following a live file that
//! changes between two container starts (on a real machine NVML gives these figures).

use gpupin_sandbox::harness::Sandbox;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

/// A live file for sim:nvswitch8 where `busy[i]`% and `free_gib[i]` describe GPU i.
fn live_json(busy: [u32; 8], free_gib: [u64; 8]) -> String {
    let gpus: Vec<String> = (0..8)
        .map(|i| {
            format!(
                r#"{{"index": {i}, "utilization": {}, "memory_free": "{}GiB"}}"#,
                busy[i], free_gib[i]
            )
        })
        .collect();
    format!(r#"{{"gpus": [{}]}}"#, gpus.join(", "))
}

fn start_with_policy(sb: &Sandbox, name: &str, policy: &str) -> gpupin_sandbox::Container {
    let spec = sb
        .spec()
        .annotation("gpupin.count", "1")
        .annotation("gpupin.policy", policy);
    sb.start(&sb.id(name), &spec).unwrap()
}

/// A sandbox whose config names `live.json` beside itself (relative paths in the config
/// are relative to the config file), and that file's path.
fn sandbox(test: &str) -> Option<(Sandbox, std::path::PathBuf)> {
    let sb = Sandbox::with_config(GPUPIN, test, "sim:nvswitch8", "live_file = \"live.json\"")?;
    let live = sb.gpupin.config.parent().unwrap().join("live.json");
    Some((sb, live))
}

#[test]
fn least_loaded_follows_the_live_file() {
    let Some((sb, live)) = sandbox("least_loaded_follows_the_live_file") else {
        return;
    };
    std::fs::write(&live, live_json([90, 80, 70, 60, 50, 5, 40, 30], [40; 8])).unwrap();
    let a = start_with_policy(&sb, "a", "least-loaded");
    assert_eq!(sb.gpupin.held_minors(a.id()), [5]);

    std::fs::write(&live, live_json([90, 80, 1, 60, 50, 5, 40, 30], [40; 8])).unwrap();
    let b = start_with_policy(&sb, "b", "least-loaded");
    assert_eq!(
        sb.gpupin.held_minors(b.id()),
        [2],
        "the file changed: GPU 2 is idle now"
    );

    // Equal load: the most free memory decides.
    std::fs::write(&live, live_json([10; 8], [1, 2, 3, 4, 5, 6, 70, 8])).unwrap();
    let c = start_with_policy(&sb, "c", "least-loaded");
    assert_eq!(sb.gpupin.held_minors(c.id()), [6]);
}

#[test]
fn most_free_follows_the_live_file() {
    let Some((sb, live)) = sandbox("most_free_follows_the_live_file") else {
        return;
    };
    std::fs::write(&live, live_json([0; 8], [10, 20, 30, 40, 50, 60, 70, 75])).unwrap();
    let a = start_with_policy(&sb, "a", "most-free");
    assert_eq!(sb.gpupin.held_minors(a.id()), [7]);

    std::fs::write(&live, live_json([0; 8], [10, 20, 30, 79, 50, 60, 70, 75])).unwrap();
    let b = start_with_policy(&sb, "b", "most-free");
    assert_eq!(sb.gpupin.held_minors(b.id()), [3]);
}

#[test]
fn memory_filter_uses_the_live_free_memory() {
    let Some((sb, live)) = sandbox("memory_filter_uses_the_live_free_memory") else {
        return;
    };
    std::fs::write(&live, live_json([0; 8], [5, 5, 5, 5, 5, 5, 50, 5])).unwrap();
    let spec = sb
        .spec()
        .annotation("gpupin.count", "1")
        .annotation("gpupin.memory", "40GiB");
    let c = sb.start(&sb.id("big"), &spec).unwrap();
    assert_eq!(
        sb.gpupin.held_minors(c.id()),
        [6],
        "only GPU 6 has 40GiB free"
    );
    let err = sb.start(&sb.id("none"), &spec).unwrap_err().to_string();
    assert!(err.contains("0 can take free memory >= 40GiB"), "{err}");
}
