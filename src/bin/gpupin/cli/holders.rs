//! `gpupin holders` (hidden): each holder as `gpupin status` shows it, one a line, for the
//! shell completions of `release`, `evict`, `key` and `log --holder`.

use gpupin::command::{Config, Ledger};
use std::process::ExitCode;

pub fn run(config: &Config) -> anyhow::Result<ExitCode> {
    let mut names: Vec<String> = Ledger::open_read_only(&config.ledger_settings())?
        .records()?
        .iter()
        .map(|r| r.shown_name().to_string())
        .collect();
    names.sort();
    names.dedup();
    for name in names {
        outln!("{name}")?;
    }
    Ok(ExitCode::SUCCESS)
}
