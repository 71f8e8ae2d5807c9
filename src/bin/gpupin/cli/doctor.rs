//! `gpupin doctor`: one line per finding (`ok`, `warn`, `problem`, what, and how to fix
//! it), NVML beside nvidia-smi as a table where both answer; exit status 1 when any
//! finding is a problem. `--json` for scripts.

use gpupin::command::{
    Comparison, Config, DEFAULT_CONFIG_PATH, DEFAULT_DAEMON_JSON, Finding, Report, Setup,
    escape_controls, examine, one_line,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print JSON instead of one line per finding
    #[arg(long)]
    pub json: bool,
    /// Docker's daemon.json to check
    #[arg(long, default_value = DEFAULT_DAEMON_JSON, value_name = "FILE")]
    pub daemon_json: PathBuf,
    /// A hooks.d directory of podman or CRI-O to check; repeatable, in the order the
    /// engine reads them [default: podman's, from containers.conf's hooks_dir]
    #[arg(long = "hooks-dir", value_name = "DIR")]
    pub hooks_dirs: Vec<PathBuf>,
    /// The nvidia-smi whose `-q -x` readings NVML's are checked against
    #[arg(long, default_value = "nvidia-smi", value_name = "PROGRAM")]
    pub nvidia_smi: PathBuf,
    /// Where procfs is mounted (tests, a host's tree mounted elsewhere)
    #[arg(long, default_value = "/proc", value_name = "DIR", hide = true)]
    pub proc: PathBuf,
    /// Where sysfs is mounted
    #[arg(long, default_value = "/sys", value_name = "DIR", hide = true)]
    pub sys: PathBuf,
    /// Where the device nodes are
    #[arg(long, default_value = "/dev", value_name = "DIR", hide = true)]
    pub dev: PathBuf,
}

/// Loads the config itself: a config that does not load is a finding like any other, and
/// the other checks still run (on the defaults).
pub fn run(config_flag: Option<&Path>, args: &DoctorArgs) -> anyhow::Result<ExitCode> {
    let config_arg = super::install::absolute_config(config_flag)?;
    let (config, config_error) = match Config::discover(config_flag) {
        Ok(config) => {
            gpupin::command::init_from_config(config.log);
            (config, None)
        }
        Err(err) => {
            let tried = config_arg
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_CONFIG_PATH));
            let config = Config {
                path: Some(tried),
                ..Config::default()
            };
            (config, Some(one_line(&err)))
        }
    };
    let exe = std::env::current_exe()?;
    let mut setup = Setup::host(config, exe);
    setup.config_error = config_error;
    setup.config_arg = config_arg;
    setup.daemon_json = args.daemon_json.clone();
    if !args.hooks_dirs.is_empty() {
        setup.hooks_dirs = args.hooks_dirs.clone();
        setup.hooks_source = gpupin::command::HooksSource::Given;
    }
    setup.nvidia_smi = args.nvidia_smi.clone();
    setup.proc = args.proc.clone();
    setup.sys = args.sys.clone();
    setup.dev = args.dev.clone();
    let report = examine(&setup);
    if args.json {
        outln!("{:#}", report.to_json())?;
    } else {
        print(&report)?;
    }
    Ok(match report.has_problems() {
        true => ExitCode::FAILURE,
        false => ExitCode::SUCCESS,
    })
}

fn print(report: &Report) -> anyhow::Result<()> {
    for finding in &report.findings {
        outln!("{}", line(finding))?;
    }
    if !report.nvml_vs_nvidia_smi.is_empty() {
        outln!()?;
        out!("{}", table(&report.nvml_vs_nvidia_smi))?;
    }
    Ok(())
}

/// `problem docker: ... has no "gpupin" runtime; fix: gpupin install docker`.
fn line(finding: &Finding) -> String {
    let mut line = format!("{:<7} {}", finding.status.as_str(), finding.what);
    if let Some(fix) = &finding.fix {
        line.push_str("; fix: ");
        line.push_str(fix);
    }
    line
}

/// NVML's readings beside nvidia-smi's, a `<- differs` after each that differs.
fn table(rows: &[Comparison]) -> String {
    // nvidia-smi's text, kept to its cell whatever it holds.
    let cell = |v: &Option<String>| v.as_deref().map_or("-".into(), escape_controls);
    let width = rows
        .iter()
        .flat_map(|r| &r.fields)
        .map(|f| cell(&f.nvml).len())
        .max()
        .unwrap_or(0)
        .max("NVML".len());
    let mut text = format!(
        "{:<4} {:<7} {:<width$}  NVIDIA-SMI -Q -X\n",
        "GPU", "FIELD", "NVML"
    );
    for row in rows {
        for (i, field) in row.fields.iter().enumerate() {
            let gpu = if i == 0 {
                row.index.to_string()
            } else {
                String::new()
            };
            let mark = if field.same { "" } else { "  <- differs" };
            let line = format!(
                "{gpu:<4} {:<7} {:<width$}  {}{mark}",
                field.name,
                cell(&field.nvml),
                cell(&field.nvidia_smi)
            );
            text.push_str(line.trim_end());
            text.push('\n');
        }
    }
    text
}
