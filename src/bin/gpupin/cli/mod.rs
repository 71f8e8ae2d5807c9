//! Command-line structure (clap) and dispatch; each command lives in its own file.

// First: the printing macros must be defined before the commands that use them.
#[macro_use]
mod out;

mod completions;
mod config;
#[cfg(feature = "demo")]
mod demo;
#[cfg(feature = "device-plugin")]
mod device_plugin;
mod doctor;
mod drain;
mod evict;
mod exec;
mod exec_gate;
mod exec_progress;
mod flag;
mod gc;
mod hold;
mod holders;
mod hook;
mod install;
mod inventory;
mod key;
mod log;
mod metrics;
#[cfg(feature = "nri")]
mod nri;
mod nvml;
mod pick;
mod queue;
mod release;
mod request_args;
mod route;
mod serve;
mod status;
mod usage;
mod within;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};
use gpupin::command::Config;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "gpupin",
    version,
    about = "Pin NVIDIA GPUs to containers on a shared machine"
)]
pub struct Cli {
    /// Config file [default: $GPUPIN_CONFIG, else /etc/gpupin/config.toml]
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run as an OCI hook: reads the container state on stdin (precreate: the spec, written back edited on stdout)
    Hook(hook::HookArgs),
    /// Show the machine's GPUs and how they are linked
    Inventory(inventory::InventoryArgs),
    /// Show which GPUs are held, by whom, since when
    #[command(
        after_long_help = "Examples:\n  gpupin status                 one line per GPU: who holds it, since when\n  gpupin status --free          the GPUs nobody holds and nothing runs on\n  gpupin status --user alice    alice's GPUs\n  gpupin status --long --watch  the detailed tables, redrawn every 2 s"
    )]
    Status(status::StatusArgs),
    /// Show the requests waiting for GPUs, in the order they will be served
    #[command(
        after_long_help = "Examples:\n  gpupin queue                  who waits for GPUs, and for what\n  gpupin queue --json"
    )]
    Queue(queue::QueueArgs),
    /// Show which GPUs a request would get now, without allocating
    #[command(
        after_long_help = "Examples:\n  gpupin pick --count 2 --explain       what a request would get now, and why\n  gpupin pick --count 1 --memory 40GiB  with a memory filter"
    )]
    Pick(pick::PickArgs),
    /// Run a command on GPUs of the ledger, confined to them, released when it ends
    #[command(
        after_long_help = "Examples:\n  gpupin exec --count 2 -- python train.py           two GPUs, released when it ends\n  gpupin exec --count 1 --wait 30m -- ./job.sh      wait up to 30 minutes for a GPU\n  gpupin exec --within slurm-42 -- python eval.py  a GPU of a Slurm job's"
    )]
    Exec(exec::ExecArgs),
    /// Set GPUs aside with no container: for a Slurm job, for maintenance
    #[command(
        after_long_help = "Examples:\n  gpupin hold maint-7 --devices 7 --until-release --reason \"fan replaced\"\n  gpupin hold demo --count 2 --for 3h --reason \"customer demo\"\n  gpupin release maint-7"
    )]
    Hold(hold::HoldArgs),
    /// Print the key that lets a container or another user take GPUs from inside a holder
    Key(key::KeyArgs),
    /// The daemon through which users who are not root run exec, hold and release
    Serve(serve::ServeArgs),
    /// Release GPUs held by containers and processes that are gone; clear what no holder owns
    Gc,
    /// Show the audit trail: who was given, held and gave back which GPUs, and what was refused
    #[command(
        after_long_help = "Examples:\n  gpupin log --since 2h              the last two hours\n  gpupin log --holder web-1         one container's history, by its name\n  gpupin log --follow --user alice  alice's events as they come"
    )]
    Log(log::LogArgs),
    /// Show GPU-hours by user, holder or GPU over a period
    #[command(
        after_long_help = "Examples:\n  gpupin usage --since 7d              GPU-hours by user, last week\n  gpupin usage --by holder --since 1d"
    )]
    Usage(usage::UsageArgs),
    /// Release the GPUs of one holder that has ended (a name or id as status shows it), cancel a queued request, or remove one entry of the ledger
    #[command(
        after_long_help = "A holder that still runs is never released while it can use its GPUs: end it with gpupin evict; root's --force stops it first (as evict does) and releases it once it is gone.\n\nExamples:\n  gpupin release maint-7                      a hold, or a holder that has ended\n  gpupin release bob-q                        a request that waits in gpupin queue\n  sudo gpupin release --force train           stop it first, then release\n  gpupin release 3f2a1b2c3d4e                 a container by its short id\n  gpupin release --exact --ignore-missing slurm-42   as a script (the Slurm epilog)"
    )]
    Release(release::ReleaseArgs),
    /// Stop a holder that still runs (its engine, or SIGTERM then SIGKILL) and release its GPUs; a user ends their own
    #[command(
        after_long_help = "Examples:\n  gpupin evict exec-4242               your own job: SIGTERM, then its GPUs are released\n  sudo gpupin evict web-1              docker stop, then its GPUs are released\n  sudo gpupin evict train --grace 30s --reason \"node maintenance\"\n                                       SIGTERM, SIGKILL after 30 s; the job's stderr says why"
    )]
    Evict(evict::EvictArgs),
    /// Take GPUs out of allocation for maintenance: new requests skip them, their holders keep them until they end
    #[command(
        after_long_help = "Examples:\n  sudo gpupin drain 3 --reason \"fan swap, ticket 4411\"\n  sudo gpupin drain 3 5 --reason \"driver update\" --wait   return once no holder has them\n  sudo gpupin undrain 3"
    )]
    Drain(drain::DrainArgs),
    /// Put drained GPUs (or GPUs whose health took them out) back into allocation
    Undrain(drain::UndrainArgs),
    /// Reset GPUs with nvidia-smi --gpu-reset (none may hold them); those whose health took them out are handed out again
    #[command(
        after_long_help = "gpupin serve's health watch lets go of NVML while the GPUs are reset (the driver resets no GPU a process has open); other NVML clients (DCGM, nvidia-persistenced) must be stopped by you. An admin's drain stays after the reset.\n\nExamples:\n  sudo gpupin reset 3\n  sudo gpupin reset 3 5"
    )]
    Reset(drain::ResetArgs),
    /// Start real containers on a simulated machine and show gpupin at work
    #[cfg(feature = "demo")]
    Demo(demo::DemoArgs),
    /// Serve the kubelet's device plugin API: advertise the GPUs, allocate what the kubelet assigns
    #[cfg(feature = "device-plugin")]
    DevicePlugin(device_plugin::DevicePluginArgs),
    /// Serve containerd's or CRI-O's NRI: every container their CRI creates goes through the ledger
    #[cfg(feature = "nri")]
    Nri(nri::NriArgs),
    /// Register gpupin with a container engine
    Install(install::InstallArgs),
    /// Take gpupin out of a container engine's configuration again
    Uninstall(install::UninstallArgs),
    /// Check this host: driver, inventory, device nodes, cgroups, state dir, engines; how to fix what is wrong
    Doctor(doctor::DoctorArgs),
    /// Check a config file and print the configuration gpupin uses
    #[command(
        after_long_help = "Examples:\n  gpupin config check                          the config gpupin would read\n  gpupin config check /etc/gpupin/config.toml"
    )]
    Config(config::ConfigArgs),
    /// NVML's answers as JSON, for gpupin-hook and gpupin-runtime
    #[command(hide = true)]
    Nvml(nvml::NvmlArgs),
    /// The start of a job gpupin exec runs: waits until its GPUs are its own
    #[command(hide = true)]
    ExecGate(exec_gate::ExecGateArgs),
    /// Print Prometheus metrics: GPUs held and free, holders, the queue, allocations and refusals
    Metrics(metrics::MetricsArgs),
    /// Print shell completions: gpupin completions bash > /etc/bash_completion.d/gpupin
    Completions(completions::CompletionsArgs),
    /// Write the man pages (roff) into a directory, for packagers
    #[command(hide = true)]
    Manpage(completions::ManpageArgs),
    /// Each holder as gpupin status shows it, one a line: for the shell completions
    #[command(hide = true)]
    Holders,
}

pub fn main() -> ExitCode {
    if let Err(err) = gpupin::command::init_from_env() {
        let line = gpupin::command::one_line(&err);
        let _ = writeln!(
            std::io::stderr().lock(),
            "gpupin: warning: {line}; logging off"
        );
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => return usage_error(err),
    };
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            if let Some(code) = out::broken_pipe_exit(&err) {
                return code;
            }
            if needs_root(&err) {
                report(&err.context("this needs root: run it with sudo"));
            } else {
                report(&err);
            }
            ExitCode::FAILURE
        }
    }
}

/// Whether a user who is not root was stopped by a permission the command needs root
/// for (the ledger's lock, daemon.json, hooks.d): a bare "Permission denied" on a temp
/// file says nothing about what to do.
fn needs_root(err: &anyhow::Error) -> bool {
    !rustix::process::geteuid().is_root()
        && err.chain().any(|e| {
            e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
        })
}

/// One line: runtimes fold hook stderr into their own error message.
fn report(err: &anyhow::Error) {
    out::note(format_args!(
        "gpupin: {}",
        gpupin::command::one_line(err.as_ref())
    ));
}

/// Help and version as clap prints them; a usage error as one line, in clap's words
/// without its usage block (a hook's stderr ends up in a runtime's one-line message).
fn usage_error(err: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        err.exit()
    }
    let text = err.render().to_string();
    let first = text.split("\n\n").next().unwrap_or_default();
    let first = first.strip_prefix("error: ").unwrap_or(first);
    // clap lists missing arguments on lines of their own.
    let message: Vec<&str> = first.lines().map(str::trim).collect();
    report(&anyhow::anyhow!(
        "{}{} (see {} --help)",
        message.join(" "),
        did_you_mean(&text),
        help_command(&text)
    ));
    ExitCode::from(2)
}

/// `; did you mean 'status'?` from clap's tips of similar subcommands or flags.
fn did_you_mean(rendered: &str) -> String {
    let similar: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("tip: a similar") || l.starts_with("tip: some similar"))
        .filter_map(|l| l.split_once(": ").map(|(_, rest)| rest))
        .filter_map(|rest| rest.split_once("exist").map(|(_, names)| names))
        .flat_map(|names| {
            names
                .split(',')
                .map(|n| n.trim_start_matches(['s', ':', ' ']).trim())
        })
        .filter(|n| !n.is_empty())
        // clap suggests hidden commands too (`holds`: `holders`); they are not for people.
        .filter(|n| {
            let name = n.trim_matches('\'');
            !Cli::command()
                .get_subcommands()
                .any(|s| s.is_hide_set() && s.get_name() == name)
        })
        .collect();
    match similar.as_slice() {
        [] => String::new(),
        [one] => format!("; did you mean {one}?"),
        [rest @ .., last] => format!("; did you mean {} or {last}?", rest.join(", ")),
    }
}

/// The command whose help fits the mistake: `gpupin exec` from clap's `Usage: gpupin exec
/// [OPTIONS] <CMD>...`, else `gpupin`.
fn help_command(rendered: &str) -> String {
    rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|usage| {
            usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['-', '[', '<']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| !c.is_empty())
        .or_else(subcommand_typed)
        .unwrap_or_else(|| "gpupin".into())
}

/// `gpupin hold` for a value error, whose rendering has no usage line: the first word
/// on the command line that is a subcommand of gpupin's.
fn subcommand_typed() -> Option<String> {
    let cli = Cli::command();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            args.next();
            continue;
        }
        if cli.find_subcommand(&arg).is_some() {
            return Some(format!("gpupin {arg}"));
        }
        if !arg.starts_with('-') {
            return None;
        }
    }
    None
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match &cli.command {
        // The hook loads config lazily: a container without a request must not pay for it.
        Command::Hook(args) => return hook::run(cli.config.as_deref(), args),
        // NVML needs no config: the helper answers whichever binary asks.
        Command::Nvml(args) => return nvml::run(args),
        // The job's environment and config are its own from here.
        Command::ExecGate(args) => return exec_gate::run(args),
        // Neither needs a config: they describe the commands.
        Command::Completions(args) => return completions::completions(args),
        Command::Manpage(args) => return completions::manpages(args),
        // A config that does not load is one of doctor's findings, not the end of it.
        Command::Doctor(args) => return doctor::run(cli.config.as_deref(), args),
        // Checking a config is reading it.
        Command::Config(args) => return config::run(cli.config.as_deref(), args),
        // Modelling a machine from nvidia-smi's text needs no config either.
        Command::Inventory(inventory::InventoryArgs {
            action: Some(action),
            ..
        }) => return inventory::run_action(action),
        _ => {}
    }
    let config = load_config(cli.config.as_deref())?;
    match cli.command {
        Command::Hook(_)
        | Command::Nvml(_)
        | Command::ExecGate(_)
        | Command::Completions(_)
        | Command::Manpage(_)
        | Command::Doctor(_)
        | Command::Config(_) => unreachable!("handled above"),
        Command::Exec(args) => exec::run(&config, &args),
        Command::Metrics(args) => metrics::run(&config, &args),
        Command::Hold(args) => hold::run(&config, &args),
        Command::Key(args) => key::run(&config, &args),
        Command::Serve(args) => serve::run(&config, &args),
        Command::Inventory(args) => inventory::run(&config, &args),
        Command::Status(args) => status::run(&config, &args),
        Command::Queue(args) => queue::run(&config, &args),
        Command::Pick(args) => pick::run(&config, &args),
        Command::Gc => gc::run(&config),
        Command::Holders => holders::run(&config),
        Command::Release(args) => release::run(&config, &args),
        Command::Evict(args) => evict::run(&config, &args),
        Command::Drain(args) => drain::run_drain(&config, &args),
        Command::Undrain(args) => drain::run_undrain(&config, &args),
        Command::Reset(args) => drain::run_reset(&config, &args),
        Command::Log(args) => log::run(&config, &args),
        Command::Usage(args) => usage::run(&config, &args),
        #[cfg(feature = "demo")]
        Command::Demo(args) => demo::run(&config, cli.config.as_deref(), &args),
        #[cfg(feature = "device-plugin")]
        Command::DevicePlugin(args) => device_plugin::run(&config, &args),
        #[cfg(feature = "nri")]
        Command::Nri(args) => nri::run(&config, &args),
        Command::Install(args) => install::install(cli.config.as_deref(), &config, &args),
        Command::Uninstall(args) => install::uninstall(&args),
    }
}

pub fn load_config(flag: Option<&std::path::Path>) -> anyhow::Result<Config> {
    let config = Config::discover(flag).context("loading configuration")?;
    gpupin::command::init_from_config(config.log);
    Ok(config)
}
