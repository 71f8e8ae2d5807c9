//! The shipped Grafana dashboard and Prometheus alert rules (monitoring/) against the
//! metrics gpupin exports: every metric they name is one `gpupin metrics` prints (with
//! live figures, as on a host with NVML), Prometheus' own `promtool` accepts the rules and
//! every query of the dashboard, and `promtool test rules` fires each alert on the series
//! it is for. promtool comes from Debian's prometheus package (.ci/run installs it);
//! without it the test says why it skips (under CI=true it fails instead).

use gpupin_sandbox::harness::{self, Gpupin, required};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

const GPUPIN: &str = env!("CARGO_BIN_EXE_gpupin");
const MONITORING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/monitoring");

/// The `gpupin_*` names a text mentions.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("gpupin_") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_lowercase() || bytes[end] == b'_') {
            end += 1;
        }
        if !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_') {
            names.insert(text[start..end].to_string());
        }
        i = end;
    }
    names
}

/// What `gpupin metrics` exports on a simulated machine with live figures for each GPU.
fn exported() -> BTreeSet<String> {
    let g = Gpupin::new(GPUPIN, "sim:nvswitch8");
    let live = g.dir.path().join("live.json");
    let gpus: Vec<Value> = (0..8)
        .map(|i| serde_json::json!({"index": i, "utilization": 10, "memory_free": "40GiB"}))
        .collect();
    std::fs::write(&live, serde_json::json!({ "gpus": gpus }).to_string()).unwrap();
    let mut config = std::fs::read_to_string(&g.config).unwrap();
    config.push_str(&format!("live_file = {:?}\n", live.display().to_string()));
    std::fs::write(&g.config, config).unwrap();
    let out = g.run(&["metrics"], "");
    assert!(out.status.success(), "{}", harness::stderr(&out));
    harness::stdout(&out)
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

fn read(name: &str) -> String {
    std::fs::read_to_string(Path::new(MONITORING).join(name)).unwrap()
}

/// Every `expr` of the dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let dashboard: Value = serde_json::from_str(&read("grafana-dashboard.json")).unwrap();
    let panels = dashboard["panels"].as_array().unwrap();
    assert!(!panels.is_empty());
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_dashboard_and_the_alerts_name_only_metrics_gpupin_exports() {
    let exported = exported();
    for file in ["grafana-dashboard.json", "prometheus-alerts.yml"] {
        let named = metric_names(&read(file));
        assert!(!named.is_empty(), "{file} names no metric");
        let unknown: Vec<&String> = named.difference(&exported).collect();
        assert!(
            unknown.is_empty(),
            "{file} names {unknown:?}, which gpupin metrics does not export ({exported:?})"
        );
    }
}

fn promtool() -> Result<PathBuf, String> {
    gpupin_sandbox::find_on_path("promtool")
        .ok_or_else(|| "promtool is not installed (Debian: apt-get install prometheus)".into())
}

fn promtool_ok(promtool: &Path, args: &[&str], cwd: &Path) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap();
    let text = format!("{}{}", harness::stdout(&out), harness::stderr(&out));
    assert!(out.status.success(), "promtool {args:?}: {text}");
    text
}

#[test]
fn promtool_accepts_the_rules_and_the_dashboards_queries_and_fires_each_alert() {
    let test = "promtool_accepts_the_rules_and_the_dashboards_queries_and_fires_each_alert";
    let Some(promtool) = required(test, promtool()) else {
        return;
    };
    let dir = Path::new(MONITORING);
    let checked = promtool_ok(&promtool, &["check", "rules", "prometheus-alerts.yml"], dir);
    assert!(checked.contains("SUCCESS: 10 rules found"), "{checked}");
    let tested = promtool_ok(
        &promtool,
        &["test", "rules", "prometheus-alerts.test.yml"],
        dir,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Each dashboard query as a recording rule: promtool parses its PromQL.
    let queries = dashboard_queries();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, query) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: gpupin_dashboard_query_{i}\n        expr: {}\n",
            serde_json::to_string(query).unwrap()
        ));
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("dashboard-rules.yml"), rules).unwrap();
    let checked = promtool_ok(
        &promtool,
        &["check", "rules", "dashboard-rules.yml"],
        tmp.path(),
    );
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}

#[test]
fn metric_names_are_found_where_a_query_names_them() {
    let found =
        metric_names("sum(gpupin_gpu_held) - x_gpupin_no + rate(gpupin_refusals_total[5m])");
    let found: Vec<&str> = found.iter().map(String::as_str).collect();
    assert_eq!(found, ["gpupin_gpu_held", "gpupin_refusals_total"]);
}
