//! `gpupin metrics` and `metrics_file`: the exposition text read back by a real parser
//! (the Python prometheus_client's, from Debian's python3-prometheus-client), its values
//! checked against the ledger for a known sequence of holds, a refusal and a job.

use gpupin_sandbox::harness::{self, Gpupin, stderr};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const PYTHON: &str = "/usr/bin/python3";

/// Parses exposition text with prometheus_client and returns every sample as
/// "name{k=v,...}" -> value (labels sorted). The parser refuses text that breaks the
/// format: a missing TYPE, a bad escape, a counter sample without `_total`.
const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
        out[f"{s.name}{{{labels}}}"] = s.value
    out[f"type:{family.name}"] = family.type
print(json.dumps(out))
"#;

fn parser_ready(test: &str) -> bool {
    let found = Command::new(PYTHON)
        .args(["-c", "import prometheus_client"])
        .output()
        .map_err(|e| format!("{PYTHON}: {e}"))
        .and_then(|o| {
            o.status
                .success()
                .then_some(())
                .ok_or_else(|| "python3-prometheus-client is not installed".to_string())
        });
    harness::required(test, found).is_some()
}

fn parse(text: &str) -> BTreeMap<String, Value> {
    let mut child = Command::new(PYTHON)
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn ok(g: &Gpupin, args: &[&str]) {
    let out = g.run(args, "");
    assert!(out.status.success(), "{args:?}: {}", stderr(&out));
}

fn value(samples: &BTreeMap<String, Value>, key: &str) -> f64 {
    samples
        .get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no sample {key} in {samples:#?}"))
}

#[test]
fn the_metrics_file_follows_the_ledger_and_parses() {
    let test = "the_metrics_file_follows_the_ledger_and_parses";
    if !harness::need_root(test) || !parser_ready(test) {
        return;
    }
    let live = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        live.path(),
        r#"{"gpus": [{"index": 0, "utilization": 35, "memory_free": "20GiB"}, {"index": 1, "utilization": 0, "memory_free": "80GiB"}, {"index": 2, "utilization": 0, "memory_free": "80GiB"}, {"index": 3, "utilization": 0, "memory_free": "80GiB"}, {"index": 4, "utilization": 0, "memory_free": "80GiB"}, {"index": 5, "utilization": 0, "memory_free": "80GiB"}, {"index": 6, "utilization": 0, "memory_free": "80GiB"}, {"index": 7, "utilization": 100, "memory_free": "1GiB"}]}"#,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpupin.prom");
    let g = Gpupin::with_extra(
        GPUPIN,
        "sim:nvswitch8",
        &format!(
            "metrics_file = {:?}\nlive_file = {:?}\nconfine = false\n",
            file.to_str().unwrap(),
            live.path().to_str().unwrap()
        ),
    );
    // Two GPUs held, a request for one of them refused, a job that came and went.
    ok(
        &g,
        &["hold", "maint", "--devices", "2,3", "--until-release"],
    );
    let refused = g.run(&["hold", "other", "--devices", "3", "--until-release"], "");
    assert!(!refused.status.success());
    ok(&g, &["exec", "--devices", "5", "--", "true"]);

    let text = std::fs::read_to_string(&file).unwrap();
    let samples = parse(&text);
    let status = g.status();
    for gpu in status["gpus"].as_array().unwrap() {
        let index = gpu["index"].as_u64().unwrap();
        let held = !gpu["holders"].as_array().unwrap().is_empty();
        let key = samples
            .keys()
            .find(|k| k.starts_with("gpupin_gpu_held{") && k.contains(&format!("gpu={index},")))
            .unwrap_or_else(|| panic!("no gpupin_gpu_held for GPU {index}: {text}"))
            .clone();
        assert_eq!(
            value(&samples, &key),
            f64::from(u8::from(held)),
            "GPU {index}"
        );
    }
    assert_eq!(value(&samples, "gpupin_gpus{}"), 8.0);
    assert_eq!(value(&samples, "gpupin_gpu_holders{gpu=3}"), 1.0);
    assert_eq!(
        value(
            &samples,
            "gpupin_gpu_holder{engine=,gpu=2,holder=maint,kind=hold,mode=exclusive,state=running,user=root}"
        ),
        1.0
    );
    assert_eq!(value(&samples, "gpupin_holders{engine=,kind=hold}"), 1.0);
    assert_eq!(value(&samples, "gpupin_allocations_total{kind=hold}"), 1.0);
    assert_eq!(value(&samples, "gpupin_allocations_total{kind=exec}"), 1.0);
    assert_eq!(
        value(&samples, "gpupin_refusals_total{reason=device_unavailable}"),
        1.0
    );
    assert_eq!(value(&samples, "gpupin_releases_total{event=release}"), 1.0);
    assert_eq!(value(&samples, "gpupin_queue_length{}"), 0.0);
    assert_eq!(value(&samples, "gpupin_gpu_utilization_ratio{gpu=0}"), 0.35);
    assert_eq!(
        value(&samples, "gpupin_gpu_memory_free_bytes{gpu=7}"),
        f64::from(1u32 << 30)
    );
    assert_eq!(samples["type:gpupin_allocations"], "counter");
    assert_eq!(samples["type:gpupin_gpu_held"], "gauge");

    // `gpupin metrics` says the same, from the cursor the file's rewrites keep, and
    // again without it, counted from the whole log (a first scrape).
    let out = g.run(&["metrics"], "");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(parse(&harness::stdout(&out)), samples);
    let cursor = g.state_dir.join("metrics-cursor.json");
    assert_file_mode(&cursor, 0o644);
    std::fs::remove_file(&cursor).unwrap();
    let out = g.run(&["metrics"], "");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(parse(&harness::stdout(&out)), samples);
    assert!(cursor.exists(), "root's gpupin metrics keeps the cursor");

    // A release rewrites the file at once.
    ok(&g, &["release", "maint"]);
    let samples = parse(&std::fs::read_to_string(&file).unwrap());
    assert_eq!(value(&samples, "gpupin_releases_total{event=release}"), 2.0);
    assert!(
        !samples.keys().any(|k| k.starts_with("gpupin_gpu_holder{")),
        "no holder left: {samples:#?}"
    );
    assert_file_mode(&file, 0o644);
}

fn assert_file_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    let got = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(got, mode, "{}", path.display());
}
