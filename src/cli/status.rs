//! `gpupin status`: which GPUs are held, by whom, since when; what each GPU does now and
//! whose its processes are; `--watch` redraws it like `watch`.

use gpupin::base::message::one_line;
use gpupin::host::inventory;
use gpupin::host::whose::{self, Seen};
use gpupin::input::config::Config;
use gpupin::model::gpu::Inventory;
use gpupin::model::live::Live;
use gpupin::report::Status;
use gpupin::state::ledger::{Ledger, holders_of};
use std::cell::RefCell;
use std::collections::HashMap;
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
    let Some(every) = args.watch else {
        let screen = Screen::read(config)?;
        let shown = screen.shown(args);
        let status = screen.status(shown.as_deref());
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
        let body = match Screen::read(config) {
            Ok(screen) if args.json => screen
                .status(screen.shown(args).as_deref())
                .json()
                .to_string(),
            Ok(screen) => render(&screen.status(screen.shown(args).as_deref()), args),
            Err(err) if args.json => serde_json::json!({"error": one_line(&*err)}).to_string(),
            Err(err) => format!("gpupin: {}\n", one_line(&*err)),
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

/// What `gpupin serve` answers its `status` op with (the Python client's
/// `gpupin.status()`): this command's JSON, read by the daemon, without the GPUs'
/// processes: whose they are is for each user's own `gpupin status` to read from /proc,
/// not for the root daemon to hand to anyone who asks.
pub fn served(config: &Config) -> Result<serde_json::Value, String> {
    let screen = Screen::read_with(config, false).map_err(|e| one_line(&*e))?;
    Ok(screen.status(None).json())
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

/// One look at the machine: the ledger, and what the GPUs do now where a source says.
struct Screen {
    grace: Duration,
    inventory: Inventory,
    records: Vec<gpupin::state::ledger::Record>,
    waiting: Vec<gpupin::state::ledger::Waiting>,
    idle: Vec<gpupin::state::ledger::Idle>,
    leftovers: Vec<gpupin::report::Leftover>,
    live: Option<Vec<Live>>,
    processes: Option<Vec<Vec<Seen>>>,
    live_error: Option<String>,
}

impl Screen {
    fn read(config: &Config) -> anyhow::Result<Screen> {
        Screen::read_with(config, true)
    }

    /// `processes`: whether to say what runs on each GPU, and whose.
    fn read_with(config: &Config, processes: bool) -> anyhow::Result<Screen> {
        let inventory = config.load_inventory()?;
        let ledger = Ledger::open_read_only(&config.ledger_settings())?;
        let records = ledger.records()?;
        let waiting = ledger.waiting()?;
        // What gpupin serve's looks found (the figures read here are one moment: they
        // cannot say how long a holder has been quiet).
        let idle = ledger.idle(&records);
        let leftovers = gpupin::report::leftovers(&records);
        // Fresh figures, not the allocations' snapshot cache: a person watching wants
        // now, and may not write the state dir.
        let file = config.live_file.as_deref();
        let (live, live_error) = match inventory::read_live(file, &inventory, &config.nvml, None) {
            Ok(live) => (live, None),
            Err(err) => (None, Some(one_line(&err))),
        };
        let names = user_names();
        let processes = match processes {
            true => live.as_deref().map(|l| whose::observe(l, &names)),
            false => None,
        };
        Ok(Screen {
            grace: config.claim_grace,
            inventory,
            records,
            waiting,
            idle,
            leftovers,
            live,
            processes,
            live_error,
        })
    }

    fn status<'s>(&'s self, shown: Option<&'s [usize]>) -> Status<'s> {
        Status {
            live: self.live.as_deref(),
            processes: self.processes.as_deref(),
            live_error: self.live_error.as_deref(),
            waiting: &self.waiting,
            idle: &self.idle,
            leftovers: &self.leftovers,
            shown,
            ..Status::new(&self.inventory, &self.records, self.grace)
        }
    }

    /// The positions of the GPUs the filters let through; `None` without filters.
    fn shown(&self, args: &StatusArgs) -> Option<Vec<usize>> {
        if args.gpu.is_empty() && args.user.is_none() && !args.free {
            return None;
        }
        let now = SystemTime::now();
        // A GPU's holders, or for a GPU in MIG mode its instances'.
        let holders = |g: &gpupin::model::gpu::Gpu| {
            std::iter::once(g.uuid.as_str())
                .chain(g.mig_instances().iter().map(|m| m.uuid.as_str()))
                .flat_map(|uuid| holders_of(uuid, &self.records))
                .collect::<Vec<_>>()
        };
        let busy = |position: usize| {
            self.processes
                .as_ref()
                .and_then(|p| p.get(position))
                .is_some_and(|seen| !seen.is_empty())
        };
        let shown = self
            .inventory
            .gpus
            .iter()
            .enumerate()
            .filter(|(_, g)| args.gpu.is_empty() || args.gpu.contains(&g.index))
            .filter(|(_, g)| {
                args.user.as_ref().is_none_or(|user| {
                    holders(g)
                        .iter()
                        .any(|r| r.owner.as_ref().is_some_and(|o| &o.user == user))
                })
            })
            .filter(|(position, g)| {
                !args.free
                    || (holders(g).iter().all(|r| r.is_stale(now, self.grace)) && !busy(*position))
            })
            .map(|(position, _)| position)
            .collect();
        Some(shown)
    }
}

/// A uid's name through NSS (LDAP and sssd users too), else /etc/passwd; each uid
/// looked up once a screen.
fn user_names() -> impl Fn(u32) -> Option<String> {
    let seen: RefCell<HashMap<u32, Option<String>>> = RefCell::default();
    move |uid| {
        seen.borrow_mut()
            .entry(uid)
            .or_insert_with(|| {
                let nss = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid));
                nss.ok()
                    .flatten()
                    .map(|u| one_line_name(&u.name))
                    .or_else(|| whose::passwd_name(uid))
            })
            .clone()
    }
}

/// A user name as text that cannot steer a terminal.
fn one_line_name(name: &str) -> String {
    gpupin::base::message::escape_controls(name)
}
