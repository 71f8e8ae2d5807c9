//! `gpupin usage` for people (a table) and for scripts (JSON).

#[cfg(test)]
use crate::state::usage::Rows;
use crate::state::usage::{By, Usage, UsageRow};
use serde_json::{Value, json};
use std::fmt;

/// `gpupin usage`: a row per key, largest first, the total, and the period; written as
/// it is printed (a year `--by holder` is hundreds of thousands of rows).
pub fn usage_table(usage: &Usage) -> UsageTable<'_> {
    UsageTable(usage)
}

/// See `usage_table`: columns aligned as `table::aligned` aligns them.
pub struct UsageTable<'a>(&'a Usage);

impl fmt::Display for UsageTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let usage = self.0;
        let key = match usage.by {
            By::User => "USER",
            By::Holder => "HOLDER",
            By::Gpu => "GPU",
        };
        let rows = || usage.rows.iter().chain([usage.total]);
        let hours = |row: UsageRow| format!("{:.2}", row.gpu_hours());
        // No row has more hours or holders than the total: its cells are the widest.
        let total = usage.total;
        let h = hours(total).len().max("GPU-HOURS".len());
        let n = total.holders.to_string().len().max("HOLDERS".len());
        use crate::base::message::controls_escaped as shown;
        let k = rows()
            .map(|row| shown(row.key).chars().count())
            .fold(key.len(), usize::max);
        writeln!(f, "{key:<k$}  {:>h$}  {:>n$}", "GPU-HOURS", "HOLDERS")?;
        for row in rows() {
            let (key, holders) = (shown(row.key), row.holders);
            writeln!(f, "{key:<k$}  {:>h$.2}  {holders:>n$}", row.gpu_hours())?;
        }
        writeln!(
            f,
            "from {} to {}",
            humantime::format_rfc3339_seconds(usage.since),
            humantime::format_rfc3339_seconds(usage.until)
        )
    }
}

/// `gpupin usage --json`. GPU-hours unrounded: a script that adds rows up gets the total.
pub fn usage_json(usage: &Usage) -> Value {
    let row = |r: UsageRow| json!({"key": r.key, "gpu_hours": r.gpu_hours(), "holders": r.holders});
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
        let usage = Usage {
            since: UNIX_EPOCH + Duration::from_secs(1_714_564_800),
            until: UNIX_EPOCH + Duration::from_secs(1_714_564_800 + 86400),
            by: By::User,
            rows: Rows::of([("bob", 900, 1), ("alice", 45000, 2)]),
            total: UsageRow {
                key: "total",
                gpu_seconds: 45900,
                holders: 3,
            },
        };
        assert_eq!(
            usage_table(&usage).to_string(),
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
