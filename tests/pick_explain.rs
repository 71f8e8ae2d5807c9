//! `gpupin pick --explain` on sim:cubemesh8, the two cases of issue 13: the answer stays
//! on NVLink where it can, and the explanation names the term that decided. The empty
//! machine needs nothing; holding GPUs needs root (`gpupin hold --until-release`).

use gpupin_sandbox::harness::{Gpupin, need_root, stdout};
use serde_json::Value;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");

fn pick(g: &Gpupin, count: &str) -> Value {
    let out = g.run(
        &[
            "pick",
            "--policy",
            "topology",
            "--count",
            count,
            "--explain",
            "--json",
        ],
        "",
    );
    assert!(out.status.success(), "{out:?}");
    serde_json::from_str(&stdout(&out)).unwrap()
}

fn indices(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap_or_else(|| g["index"].as_u64().unwrap()))
        .collect()
}

#[test]
fn five_of_the_empty_cube_mesh_have_an_nvlink_ring() {
    let g = Gpupin::new(GPUPIN, "sim:cubemesh8");
    let v = pick(&g, "5");
    assert_eq!(indices(&v["gpus"]), [0, 2, 3, 4, 7]);
    let chosen = &v["explain"]["chosen"];
    // 0-2-3-7-4-0: NV1, NV2, NV1, NV2, NV2 on V100s, 25 GB/s at the slowest.
    assert_eq!(chosen["ring_mb_s"], 25_000);
    assert_eq!(chosen["worst_path"], "SYS");
    assert_eq!(v["explain"]["exact"], true);
    let text = stdout(&g.run(
        &["pick", "--policy", "topology", "--count", "5", "--explain"],
        "",
    ));
    assert!(
        text.contains("ring bottleneck           25.0 GB/s"),
        "{text}"
    );
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
}

#[test]
fn three_beside_held_gpus_stay_on_nvlink_and_say_why() {
    if !need_root("three_beside_held_gpus_stay_on_nvlink_and_say_why") {
        return;
    }
    let g = Gpupin::new(GPUPIN, "sim:cubemesh8");
    let held = g.run(
        &["hold", "--devices", "2,6,7", "--until-release", "busy"],
        "",
    );
    assert!(held.status.success(), "{held:?}");
    let v = pick(&g, "3");
    assert_eq!(indices(&v["gpus"]), [0, 1, 3]);
    let e = &v["explain"];
    assert_eq!(e["chosen"]["worst_path"], "none");
    assert_eq!(e["decided_by"], "worst_path");
    assert_eq!(e["runner_up"]["worst_path"], "SYS");
    let text = stdout(&g.run(
        &["pick", "--policy", "topology", "--count", "3", "--explain"],
        "",
    ));
    let decides: Vec<&str> = text.lines().filter(|l| l.ends_with("<- decides")).collect();
    assert_eq!(decides.len(), 1, "{text}");
    assert!(decides[0].contains("worst PCIe path"), "{text}");
}

#[test]
fn other_policies_say_there_is_nothing_to_rank() {
    let g = Gpupin::new(GPUPIN, "sim:cubemesh8");
    let out = g.run(
        &[
            "pick",
            "--policy",
            "pack",
            "--count",
            "2",
            "--explain",
            "--json",
        ],
        "",
    );
    let v: Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert!(
        v["explain"]["note"]
            .as_str()
            .unwrap()
            .contains("only topology"),
        "{v}"
    );
}

/// One GPU has no pairs: the explanation shows the one term that applies and says why,
/// not a table of dashes.
#[test]
fn one_gpu_is_explained_by_what_it_leaves_free() {
    let g = Gpupin::new(GPUPIN, "sim:cubemesh8");
    let out = g.run(
        &["pick", "--policy", "topology", "--count", "1", "--explain"],
        "",
    );
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("term"))
        .skip(1)
        .collect();
    assert!(
        table[0]
            .trim_start()
            .starts_with("to free GPUs (less wins)"),
        "{text}"
    );
    assert!(
        !text.contains(" -\n") && !text.lines().any(|l| l.trim_end().ends_with(" -")),
        "{text}"
    );
    assert!(
        text.contains("(one GPU has no pairs: it is chosen for what it leaves the free GPUs)"),
        "{text}"
    );
}
