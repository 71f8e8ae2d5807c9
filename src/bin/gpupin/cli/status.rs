//! `gpupin status`: which GPUs are held, by whom, since when; what each GPU does now and
//! whose its processes are; `--watch` redraws it like `watch`. The look at the machine and
//! its views are the library's (`report::status`); here are the arguments and the printing.

use gpupin::command::{Config, GpuFilter, Snapshot, Status, one_line};
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

/// `watch`'s floor: a shorter period only burns CPU on NVML queries.
const MIN_PERIOD: f64 = 0.1;
/// A day: longer is a typo (and too long for a `Duration` from an f64 to matter).
const MAX_PERIOD: f64 = 86_400.0;

#[derive(clap::Args)]
pub struct StatusArgs {
    /// Print JSON instead of a table (with --watch: one JSON document a line)
    #[arg(long)]
    pub json: bool,
    /// Redraw every SECS seconds until interrupted, as `watch` does
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2", value_parser = period)]
    pub watch: Option<Duration>,
    /// The detailed tables: one row per GPU and holder (kind, image, pid, age), then the
    /// GPUs' figures and their processes, instead of one line per GPU
    #[arg(long)]
    pub long: bool,
    /// Only these GPUs, by index, comma-separated
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub gpu: Vec<u32>,
    /// Only the GPUs a holder of this user holds
    #[arg(long, value_name = "USER", value_hint = clap::ValueHint::Username)]
    pub user: Option<String>,
    /// Only the GPUs nobody holds and no process runs on
    #[arg(long)]
    pub free: bool,
}

fn period(text: &str) -> Result<Duration, String> {
    match text.parse::<f64>() {
        Ok(secs) if (MIN_PERIOD..=MAX_PERIOD).contains(&secs) => Ok(Duration::from_secs_f64(secs)),
        _ => Err(format!(
            "expected seconds between {MIN_PERIOD} and {MAX_PERIOD}, such as 2 or 0.5"
        )),
    }
}

pub fn run(config: &Config, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let filter = GpuFilter {
        gpus: args.gpu.clone(),
        user: args.user.clone(),
        free: args.free,
    };
    let Some(every) = args.watch else {
        let snapshot = Snapshot::read(config, true)?;
        let shown = snapshot.shown(&filter);
        let status = snapshot.status(shown.as_deref());
        match args.json {
            true => outln!("{:#}", status.json())?,
            false => out!("{}", render(&status, args))?,
        }
        return Ok(ExitCode::SUCCESS);
    };
    let terminal = std::io::stdout().is_terminal();
    loop {
        // A bad moment (a record half-written by hand, NVML busy) is shown, not fatal:
        // the next refresh may be fine.
        let body = match Snapshot::read(config, true) {
            Ok(snapshot) if args.json => snapshot
                .status(snapshot.shown(&filter).as_deref())
                .json()
                .to_string(),
            Ok(snapshot) => render(&snapshot.status(snapshot.shown(&filter).as_deref()), args),
            Err(err) if args.json => serde_json::json!({"error": one_line(&err)}).to_string(),
            Err(err) => format!("gpupin: {}\n", one_line(&err)),
        };
        if args.json {
            outln!("{body}")?;
        } else if terminal {
            // Home and clear, then the screen in one write: no flicker, no scrolling.
            let title = format!("Every {}: gpupin status", humantime::format_duration(every));
            let when = humantime::format_rfc3339_seconds(SystemTime::now());
            out!("\x1b[H\x1b[2J{title}  {when}\n\n{body}")?;
        } else {
            // Screens one after another, a blank line apart, for a log or a pipe.
            outln!("{body}")?;
        }
        std::thread::sleep(every);
    }
}

/// The one-line-per-GPU view, or the detailed tables with `--long`.
fn render(status: &Status, args: &StatusArgs) -> String {
    match args.long {
        true => status.table(colour()),
        false => status.compact(colour()),
    }
}

/// Colour for a terminal that wants it (https://no-color.org, and not a dumb one).
fn colour() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let dumb = std::env::var_os("TERM").is_some_and(|t| t == "dumb");
    std::io::stdout().is_terminal() && !no_color && !dumb
}
