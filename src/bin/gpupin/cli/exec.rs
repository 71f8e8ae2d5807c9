//! `gpupin exec [request options] -- CMD [ARGS...]`: a bare-metal job on GPUs of the same
//! ledger as containers. Root allocates and confines the job itself; anyone else asks
//! `gpupin serve`. Either way the job's pid holds the GPUs, signals sent to gpupin reach
//! the job, and gpupin ends with the job's status.

use super::exec_progress::Progress;
use super::request_args::RequestArgs;
use super::route::Route;
use anyhow::Context;
use gpupin::command::{Client, Config, Gated, Key, Ledger, Request, exec, request};
use std::ffi::OsString;
use std::os::fd::AsFd;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub request: RequestArgs,
    /// Wait up to this long for the GPUs, in the queue with every container, e.g. 10m
    #[arg(long)]
    pub wait: Option<String>,
    #[command(flatten)]
    pub within: super::within::WithinArgs,
    /// The holder id the job is recorded under [default: exec-<pid>]
    #[arg(long)]
    pub name: Option<String>,
    /// The command and its arguments
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

impl ExecArgs {
    fn pairs(&self, config: &Config) -> anyhow::Result<Vec<(String, String)>> {
        let own = self.within.resolve()?.or_else(|| {
            std::env::var(Key::Within.env())
                .ok()
                .filter(|v| !v.is_empty())
        });
        // Inside a Slurm job, its hold: for a user, the daemon then checks that the hold
        // is theirs, as for any --within.
        let job = std::env::var(gpupin::command::JOB_ID_ENV)
            .ok()
            .and_then(|id| gpupin::command::job_holder(&id));
        let within = request::slurm_within(own.as_deref(), job.as_ref(), |hold| {
            Ledger::open_read_only(&config.ledger_settings()).is_ok_and(|l| l.holds(hold))
        });
        let mut pairs: Vec<(String, String)> = self
            .request
            .pairs()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (key, value) in [(Key::Wait, self.wait.clone()), (Key::Within, within)] {
            if let Some(v) = value {
                pairs.push((key.as_str().to_string(), v));
            }
        }
        Ok(pairs)
    }
}

pub fn run(config: &Config, args: &ExecArgs) -> anyhow::Result<ExitCode> {
    let pairs = args.pairs(config)?;
    let me = std::process::id() as i32;
    let gpupin = std::env::current_exe().context("finding the gpupin binary")?;
    match Route::of_this_process() {
        Route::Local => as_root(config, args, &pairs, me, &gpupin),
        Route::Daemon => through_daemon(config, args, pairs, &gpupin),
    }
}

fn as_root(
    config: &Config,
    args: &ExecArgs,
    pairs: &[(String, String)],
    me: i32,
    gpupin: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let (request, holder) = exec::job_request(pairs, args.name.as_deref(), me)?;
    if config.confine != gpupin::command::Confine::Off {
        // Before anything is held: a refusal leaves the ledger as it was.
        gpupin::command::require_caps()?;
    }
    let owner = gpupin::command::owner_of(0)?;
    let progress = Progress::start(config, holder.to_string(), request.wait.is_some());
    let grant = exec::grant(config, holder, &request, owner, me, "exec");
    progress.stop();
    let grant = grant?;
    exec::block_signals()?;
    let mut gated = match exec::spawn_gated(gpupin, &args.command, &grant.env, true) {
        Ok(g) => g,
        Err(e) => {
            exec::abandon(config, &grant);
            return Err(anyhow::Error::new(e).context("starting the job"));
        }
    };
    let job = gated.pid();
    let started = std::time::SystemTime::now();
    // Our own child, not reaped before `finish`: its pid cannot be reused meanwhile, and
    // the pidfd says so to `start` all the same.
    let job_fd = match rustix::process::Pid::from_raw(job)
        .ok_or(rustix::io::Errno::SRCH)
        .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()))
    {
        Ok(fd) => fd,
        Err(e) => {
            gated.abandon();
            exec::abandon(config, &grant);
            return Err(anyhow::Error::new(std::io::Error::from(e)).context("starting the job"));
        }
    };
    let cgroup = match exec::start(config, &grant, me, job, job_fd.as_fd()) {
        Ok(c) => c,
        Err(e) => {
            gated.abandon();
            return Err(e.into());
        }
    };
    let status = open_and_wait(&mut gated);
    wait_until_finished(config, &grant.holder, job, cgroup.as_ref());
    tell_if_ended(config, grant.holder.as_str(), started);
    Ok(ExitCode::from(exec::exit_code(status?)))
}

/// After the job's main process: until the job is over (its cgroup empty). Signals sent
/// to gpupin meanwhile go to what is left of the job.
fn wait_until_finished(
    config: &Config,
    holder: &gpupin::command::HolderId,
    job: i32,
    cgroup: Option<&gpupin::command::JobCgroup>,
) {
    let mut told = false;
    while exec::finish(config, holder, job, cgroup) == exec::Finished::Leftovers {
        if !told {
            let left = cgroup.map_or(0, |c| c.count());
            eprintln!(
                "gpupin: the job's main process ended; waiting for the {left} process{} it left in its cgroup, which still hold{} its GPUs (leftovers = \"{}\")",
                if left == 1 { "" } else { "es" },
                if left == 1 { "s" } else { "" },
                config.leftovers.as_str(),
            );
            told = true;
        }
        match exec::next_signal(exec::LEFTOVERS_POLL) {
            Ok(Some(sig)) => {
                if let (Some(cgroup), Some(sig)) =
                    (cgroup, rustix::process::Signal::from_named_raw(sig))
                {
                    cgroup.signal(sig);
                }
            }
            Ok(None) => {}
            Err(_) => std::thread::sleep(exec::LEFTOVERS_POLL),
        }
    }
}

fn through_daemon(
    config: &Config,
    args: &ExecArgs,
    pairs: Vec<(String, String)>,
    gpupin: &std::path::Path,
) -> anyhow::Result<ExitCode> {
    let mut client = Client::connect(&config.client_socket())?;
    // The daemon names an unnamed job after the process that asks: this one.
    let holder = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}{}", gpupin::command::EXEC_PREFIX, std::process::id()));
    let progress = Progress::start(config, holder, args.wait.is_some());
    let granted = client.ask(&Request::Exec {
        request: pairs,
        name: args.name.clone(),
    });
    progress.stop();
    let granted = granted?;
    exec::block_signals()?;
    // An unprivileged job has no capabilities to drop.
    let mut gated = exec::spawn_gated(gpupin, &args.command, &granted.env, false)
        .context("starting the job")?;
    if let Err(e) = client.ask(&Request::Bind { pid: gated.pid() }) {
        gated.abandon();
        return Err(e.into());
    }
    let started = std::time::SystemTime::now();
    // The daemon releases the GPUs when the job's process ends.
    let status = open_and_wait(&mut gated)?;
    if let Some(holder) = &granted.holder {
        tell_if_ended(config, holder, started);
    }
    Ok(ExitCode::from(exec::exit_code(status)))
}

/// When the job was evicted, says on stderr who ended it and why, as the note the
/// eviction left says (`Ledger::ended`): the job itself saw only a signal.
fn tell_if_ended(config: &Config, holder: &str, started: std::time::SystemTime) {
    let Ok(ledger) = gpupin::command::Ledger::open_read_only(&config.ledger_settings()) else {
        return;
    };
    if let Some(note) = ledger.ended(holder, started) {
        eprintln!("gpupin: {}", note.line(holder));
    }
}

fn open_and_wait(gated: &mut Gated) -> anyhow::Result<std::process::ExitStatus> {
    gated.open().context("starting the job")?;
    exec::forward_signals_and_wait(&mut gated.child).context("waiting for the job")
}
