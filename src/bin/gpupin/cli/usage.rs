//! `gpupin usage`: GPU-hours by user, holder or GPU, from the audit trail and the
//! holders the ledger has now.

use super::flag::Parsed;
use gpupin::command::{By, Config, Ledger, When, usage};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

const DEFAULT_SINCE: When = When::Ago(Duration::from_secs(7 * 24 * 3600));

#[derive(clap::Args)]
pub struct UsageArgs {
    /// From when: a duration back from now (2h, 7d) or an RFC 3339 time [default: 7d]
    #[arg(long, value_name = "WHEN", value_parser = Parsed(When::parse))]
    pub since: Option<When>,
    /// Rows by user, holder or gpu [default: user]
    #[arg(long, value_name = "KEY", value_parser = Parsed(By::parse))]
    pub by: Option<By>,
    /// Print JSON instead of a table
    #[arg(long)]
    pub json: bool,
}

pub fn run(config: &Config, args: &UsageArgs) -> anyhow::Result<ExitCode> {
    let now = SystemTime::now();
    let since = args.since.unwrap_or(DEFAULT_SINCE).resolve(now);
    // The ledger before the log: a holder released in between is then in both, which
    // `usage` counts once, rather than in neither.
    let records = Ledger::open_read_only(&config.ledger_settings())?.records()?;
    let by = args.by.unwrap_or_default();
    let read = usage::usage_of_trail(&config.audit(), &records, since, now, by)?;
    let usage = read.usage;
    if args.json {
        outln!("{:#}", gpupin::command::usage_json(&usage))?;
    } else {
        out!("{}", gpupin::command::usage_table(&usage))?;
    }
    super::log::note_unreadable(read.unreadable);
    Ok(ExitCode::SUCCESS)
}
