//! `gpupin log`: the audit trail, filtered, as a table or as the JSON lines it holds.

use super::flag::Parsed;
use gpupin::command::{Config, Entry, Filter, GpuSelector, When, audit};
use std::process::ExitCode;
use std::time::SystemTime;

#[derive(clap::Args)]
pub struct LogArgs {
    /// Only events since then: a duration back from now (2h, 7d) or an RFC 3339 time
    #[arg(long, value_name = "WHEN", value_parser = Parsed(When::parse))]
    pub since: Option<When>,
    /// Only events of this user, by name or uid (containers without one: their engine, e.g. docker)
    #[arg(long, value_name = "USER", value_parser = Parsed(audit::parse_user), value_hint = clap::ValueHint::Username)]
    pub user: Option<String>,
    /// Only events about this GPU, by index or UUID
    #[arg(long, value_name = "GPU", value_parser = Parsed(GpuSelector::parse))]
    pub gpu: Option<GpuSelector>,
    /// Only events of this holder: a container's name, a holder id, or the first 12
    /// characters of a container's id, as gpupin status and gpupin log show them
    #[arg(long, value_name = "HOLDER")]
    pub holder: Option<String>,
    /// Print the matching JSON lines as the log holds them instead of a table
    #[arg(long)]
    pub json: bool,
    /// After the events so far, print each new one as it is written, until interrupted
    /// (as tail -F: a rotated log is followed into the new file)
    #[arg(long, short = 'f')]
    pub follow: bool,
}

pub fn run(config: &Config, args: &LogArgs) -> anyhow::Result<ExitCode> {
    let filter = Filter {
        since: args.since.map(|w| w.resolve(SystemTime::now())),
        user: args.user.clone(),
        gpu: args.gpu.clone(),
        holder: args.holder.clone(),
    };
    // Followed from where the log ends now, before it is read: nothing written in
    // between is lost.
    let mut tail = match args.follow {
        true => Some(config.audit().tail()?),
        false => None,
    };
    // Only the lines that could be an event the filter keeps are parsed.
    let mut events = config.audit().events_where(filter.line_test());
    let mut table: Vec<Entry> = Vec::new();
    for entry in events.by_ref() {
        let entry = entry?;
        if !filter.matches(entry.at, &entry.event) {
            continue;
        }
        // JSON goes out as it is read: the whole log may be hundreds of MiB.
        if args.json {
            outln!("{}", entry.line)?;
        } else {
            table.push(entry);
        }
    }
    if !args.json {
        out!("{}", gpupin::command::log_table(&table))?;
    }
    note_unreadable(events.unreadable());
    let Some(tail) = &mut tail else {
        return Ok(ExitCode::SUCCESS);
    };
    loop {
        std::thread::sleep(FOLLOW_EVERY);
        for entry in tail.poll()? {
            if !filter.matches(entry.at, &entry.event) {
                continue;
            }
            match args.json {
                true => outln!("{}", entry.line)?,
                false => out!("{}", gpupin::command::log_row(&entry))?,
            }
        }
    }
}

/// How often `--follow` looks for new lines.
const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// One line on stderr, after the output, where lines of the log were no event.
pub fn note_unreadable(count: usize) {
    if count > 0 {
        let s = if count == 1 { "" } else { "s" };
        super::out::note(format_args!(
            "gpupin: {count} unreadable line{s} skipped in the audit log"
        ));
    }
}
