//! `gpupin status --json` through the binary, and what the tests read out of it: who
//! holds which GPU, by UUID and by device minor.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

/// `BIN --config CONFIG status --json`, which must succeed.
pub fn query(bin: &Path, config: &Path) -> Value {
    let out = Command::new(bin)
        .arg("--config")
        .arg(config)
        .args(["status", "--json"])
        .env_remove("GPUPIN_CONFIG")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "status failed: {}",
        super::text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("status --json is JSON")
}

/// The holder records, as listed.
pub fn holders(status: &Value) -> Vec<Value> {
    status["holders"].as_array().unwrap().clone()
}

/// The record of holder `id`.
pub fn holder(status: &Value, id: &str) -> Option<Value> {
    holders(status).into_iter().find(|h| h["id"] == id)
}

/// Ids of the holders.
pub fn holder_ids(status: &Value) -> BTreeSet<String> {
    holdings(status).into_keys().collect()
}

/// GPU UUIDs each holder has, by holder id.
pub fn holdings(status: &Value) -> BTreeMap<String, Vec<String>> {
    holders(status)
        .iter()
        .map(|h| {
            let gpus = h["gpus"].as_array().unwrap();
            let gpus = gpus
                .iter()
                .map(|g| g.as_str().unwrap().to_string())
                .collect();
            (h["id"].as_str().unwrap().to_string(), gpus)
        })
        .collect()
}

/// The GPUs `id` holds, as status lists them.
fn gpus_held<'a>(status: &'a Value, id: &'a str) -> impl Iterator<Item = &'a Value> {
    status["gpus"].as_array().unwrap().iter().filter(move |g| {
        g["holders"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["id"] == id)
    })
}

/// Device minors of the GPUs `id` holds, sorted.
pub fn held_minors(status: &Value, id: &str) -> Vec<u32> {
    let mut minors: Vec<u32> = gpus_held(status, id)
        .map(|g| g["minor"].as_u64().unwrap() as u32)
        .collect();
    minors.sort();
    minors
}

/// (UUID, minor) of each GPU `id` holds, sorted.
pub fn held_gpus(status: &Value, id: &str) -> Vec<(String, u64)> {
    let mut gpus: Vec<(String, u64)> = gpus_held(status, id)
        .map(|g| {
            (
                g["uuid"].as_str().unwrap().to_string(),
                g["minor"].as_u64().unwrap(),
            )
        })
        .collect();
    gpus.sort();
    gpus
}

/// GPU UUID -> device minor, for every GPU of the inventory.
pub fn minors(status: &Value) -> BTreeMap<String, u64> {
    status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["uuid"].as_str().unwrap().to_string(),
                g["minor"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// UUID of the GPU with this index.
pub fn uuid_of(status: &Value, index: u64) -> String {
    let gpu = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["index"] == index);
    gpu.expect("index in inventory")["uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn status() -> Value {
        json!({
            "gpus": [
                {"index": 0, "uuid": "GPU-a", "minor": 4, "holders": [{"id": "c1"}]},
                {"index": 1, "uuid": "GPU-b", "minor": 2, "holders": [{"id": "c1"}]},
                {"index": 2, "uuid": "GPU-c", "minor": 0, "holders": []},
            ],
            "holders": [{"id": "c1", "gpus": ["GPU-a", "GPU-b"]}],
        })
    }

    #[test]
    fn a_holders_gpus_by_minor_and_uuid() {
        let s = status();
        assert_eq!(held_minors(&s, "c1"), vec![2, 4]);
        assert_eq!(
            held_gpus(&s, "c1"),
            vec![("GPU-a".to_string(), 4), ("GPU-b".to_string(), 2)]
        );
        assert!(held_minors(&s, "c2").is_empty());
        assert_eq!(holdings(&s)["c1"], vec!["GPU-a", "GPU-b"]);
        assert_eq!(uuid_of(&s, 2), "GPU-c");
        assert_eq!(minors(&s)["GPU-c"], 0);
    }
}
