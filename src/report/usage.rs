//! `gpupin usage` for people (a table) and for scripts (JSON).

use super::table::aligned;
use crate::state::usage::{By, Usage, UsageRow};
use serde_json::{Value, json};
use std::fmt::Write;

/// `gpupin usage`: a row per key, largest first, the total, and the period.
pub fn usage_table(usage: &Usage) -> String {
    let key = match usage.by {
        By::User => "USER",
        By::Holder => "HOLDER",
        By::Gpu => "GPU",
    };
    let mut rows = vec![vec![key.to_string(), "GPU-HOURS".into(), "HOLDERS".into()]];
    for row in usage.rows.iter().chain([&usage.total]) {
        rows.push(vec![
            crate::base::message::escape_controls(&row.key),
            format!("{:.2}", row.gpu_hours()),
            row.holders.to_string(),
        ]);
    }
    let mut out = aligned(&rows, &[1, 2]);
    let _ = writeln!(
        out,
        "from {} to {}",
        humantime::format_rfc3339_seconds(usage.since),
        humantime::format_rfc3339_seconds(usage.until)
    );
    out
}

/// `gpupin usage --json`. GPU-hours unrounded: a script that adds rows up gets the total.
pub fn usage_json(usage: &Usage) -> Value {
    let row =
        |r: &UsageRow| json!({"key": r.key, "gpu_hours": r.gpu_hours(), "holders": r.holders});
    json!({
        "since": humantime::format_rfc3339_seconds(usage.since).to_string(),
        "until": humantime::format_rfc3339_seconds(usage.until).to_string(),
        "by": usage.by.as_str(),
        "rows": usage.rows.iter().map(row).collect::<Vec<_>>(),
        "total": {"gpu_hours": usage.total.gpu_hours(), "holders": usage.total.holders},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn usage_has_a_total_and_its_period() {
        let row = |key: &str, gpu_seconds, holders| UsageRow {
            key: key.into(),
            gpu_seconds,
            holders,
        };
        let usage = Usage {
            since: UNIX_EPOCH + Duration::from_secs(1_714_564_800),
            until: UNIX_EPOCH + Duration::from_secs(1_714_564_800 + 86400),
            by: By::User,
            rows: vec![row("alice", 45000, 2), row("bob", 900, 1)],
            total: row("total", 45900, 3),
        };
        assert_eq!(
            usage_table(&usage),
            "USER   GPU-HOURS  HOLDERS\n\
             alice      12.50        2\n\
             bob         0.25        1\n\
             total      12.75        3\n\
             from 2024-05-01T12:00:00Z to 2024-05-02T12:00:00Z\n"
        );
        let json = usage_json(&usage);
        assert_eq!(
            json["rows"][1],
            json!({"key": "bob", "gpu_hours": 0.25, "holders": 1})
        );
        assert_eq!(json["by"], "user");
        assert_eq!(json["until"], "2024-05-02T12:00:00Z");
    }
}
