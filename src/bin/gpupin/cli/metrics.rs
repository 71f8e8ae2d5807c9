//! `gpupin metrics`: Prometheus exposition text, for a scrape through a wrapper or a
//! look by hand; `metrics_file` in the config keeps a file of it up to date instead.

use gpupin::command::{Config, Ledger, read_live};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct MetricsArgs {}

pub fn run(config: &Config, _args: &MetricsArgs) -> anyhow::Result<ExitCode> {
    let inventory = config.load_inventory()?;
    // Live figures where there are any (NVML, a live file); none is no error here.
    let live = read_live(config.live_file.as_deref(), &inventory, &config.nvml, None)
        .ok()
        .flatten();
    let ledger = Ledger::open_read_only(&config.ledger_settings())?;
    // The counters start from the cursor the state dir's owner keeps (the metrics file's
    // writer, or root's own `gpupin metrics`), so that a scrape reads only the audit lines
    // since; without one the whole log is counted. Only that owner writes the cursor.
    let cursor = gpupin::command::cursor_of(&ledger);
    let text = gpupin::command::snapshot_text(
        &config.audit(),
        &ledger,
        &inventory,
        live.as_deref(),
        Some(&cursor),
    )?;
    out!("{text}")?;
    Ok(ExitCode::SUCCESS)
}
