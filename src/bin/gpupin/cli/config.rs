//! `gpupin config check [FILE]`: read a configuration as every gpupin binary would, say
//! in one line what is wrong with it (exit 1), or print it whole, every key with the
//! value gpupin uses (the defaults included), as TOML that reads back the same.

use gpupin::command::{Config, DEFAULT_CONFIG_PATH, config};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub action: ConfigAction,
}

#[derive(clap::Subcommand)]
pub enum ConfigAction {
    /// Check a config file (default: the one gpupin would read) and print the
    /// configuration gpupin uses, every key included
    Check {
        /// The file [default: --config, else $GPUPIN_CONFIG, else /etc/gpupin/config.toml]
        file: Option<PathBuf>,
    },
}

pub fn run(flag: Option<&std::path::Path>, args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    let ConfigAction::Check { file } = &args.action;
    let config = match file {
        Some(file) => Config::load(file)?,
        None => Config::discover(flag)?,
    };
    let source = match &config.path {
        Some(path) => format!("{} is valid", path.display()),
        None => format!("no {}: the defaults", DEFAULT_CONFIG_PATH),
    };
    outln!("# {source}; the configuration gpupin uses, every key:")?;
    out!("{}", config::effective_toml(&config))?;
    Ok(ExitCode::SUCCESS)
}
