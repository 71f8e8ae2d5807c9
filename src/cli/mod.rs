//! Command-line structure (clap) and dispatch; each command lives in its own file.

// First: the printing macros must be defined before the commands that use them.
#[macro_use]
mod out;

mod demo;
mod gc;
mod hook;
mod install;
mod install_podman;
mod inventory;
mod pick;
mod release;
mod status;

use anyhow::Context;
use clap::{Parser, Subcommand};
use gpupin::config::Config;
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
    Status(status::StatusArgs),
    /// Show which GPUs a request would get now, without allocating
    Pick(pick::PickArgs),
    /// Release GPUs held by containers and processes that are gone
    Gc,
    /// Release the GPUs of one holder (container id)
    Release(release::ReleaseArgs),
    /// Start real containers on a simulated machine and show gpupin at work
    Demo(demo::DemoArgs),
    /// Register gpupin with a container engine
    Install(install::InstallArgs),
    /// Take gpupin out of a container engine's configuration again
    Uninstall(install::UninstallArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(err) => {
            if let Some(code) = out::broken_pipe_exit(&err) {
                return code;
            }
            // One line: runtimes fold hook stderr into their own error message.
            out::note(format_args!(
                "gpupin: {}",
                gpupin::message::one_line(err.as_ref())
            ));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Hook(args) = &cli.command {
        // The hook loads config lazily: a container without a request must not pay for it.
        return hook::run(cli.config.as_deref(), args);
    }
    let config = load_config(cli.config.as_deref())?;
    match cli.command {
        Command::Hook(_) => unreachable!("handled above"),
        Command::Inventory(args) => inventory::run(&config, &args),
        Command::Status(args) => status::run(&config, &args),
        Command::Pick(args) => pick::run(&config, &args),
        Command::Gc => gc::run(&config),
        Command::Release(args) => release::run(&config, &args),
        Command::Demo(args) => demo::run(&config, cli.config.as_deref(), &args),
        Command::Install(args) => install::install(cli.config.as_deref(), &args),
        Command::Uninstall(args) => install::uninstall(&args),
    }
}

pub fn load_config(flag: Option<&std::path::Path>) -> anyhow::Result<Config> {
    Config::discover(flag).context("loading configuration")
}
