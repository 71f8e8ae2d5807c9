//! `gpupin evict HOLDER`: root ends any holder that still runs, a user their own
//! (through `gpupin serve`, which does the stopping as root), then its GPUs are released
//! once it is gone; root's `gpupin release --force` is this too. A container of Docker or podman is stopped by its engine
//! (`docker stop`, so that a restart policy does not start it again); any other holder
//! with a process (runc, containerd, a `gpupin exec` job, a hold bound to a pid) gets
//! SIGTERM, and SIGKILL after the grace, through a pidfd, with the processes of its job
//! cgroups. The audit log gets an `evict` line naming who evicted whom and why before the
//! stop, and the release after it; the ledger keeps a note (`Ledger::note_ended`) from
//! which the evicted job's `gpupin exec` tells its user who ended it.

use crate::input::config::Config;
use crate::state::ledger::lookup::{self, Match};
use crate::state::ledger::{Ledger, LedgerError, Record, Released, Releaser, Waiting};
use rustix::process::Signal;
use std::ffi::OsStr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How long past the grace the holder may take to be gone (its engine's cleanup, the
/// hook's release) before evict gives up.
pub(crate) const SETTLE: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(100);
/// The longest grace a user's eviction through `gpupin serve` gets: the daemon's thread
/// waits it out.
pub(crate) const MAX_USER_GRACE: Duration = Duration::from_secs(60);
/// The longest `--reason` taken: one line of an audit log, a job's stderr.
pub(crate) const MAX_REASON: usize = 200;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EvictError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{name} is {owner}'s: only {owner} or root may end it")]
    NotYours { name: String, owner: String },
    #[error(
        "--reason {given:?} is not one line of at most {MAX_REASON} printable characters: say why in a short line"
    )]
    BadReason { given: String },
    #[error(
        "{name} has no process gpupin can stop (a hold without one ends with gpupin release {name})"
    )]
    NoProcess { name: String },
    #[error(
        "{name} still runs {waited}s after it was told to stop ({how}); its GPUs stay held: look at pid {pid}"
    )]
    StillRuns {
        name: String,
        how: String,
        waited: u64,
        pid: i32,
    },
}

/// How the holder was stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// It no longer ran: only released.
    WasNotRunning,
    /// `docker stop -t 10 NAME` and the like.
    ByEngine(String),
    /// SIGTERM, and SIGKILL when it outlived the grace.
    BySignal { killed: bool },
}

#[derive(Debug)]
pub struct Eviction {
    pub record: Record,
    pub stopped: Stopped,
}

impl Eviction {
    /// What was done to stop it: `stopped with SIGTERM`, `killed: still running 10s after
    /// SIGTERM`; `grace` as it was given.
    pub fn how(&self, grace: Duration) -> String {
        match &self.stopped {
            Stopped::WasNotRunning => "it was not running".to_string(),
            Stopped::ByEngine(command) => format!("stopped with {command}"),
            Stopped::BySignal { killed: false } => "stopped with SIGTERM".to_string(),
            Stopped::BySignal { killed: true } => {
                format!("killed: still running {}s after SIGTERM", grace.as_secs())
            }
        }
    }

    /// `evicted web (stopped with docker stop -t 10 ...); released GPU-...`, what the
    /// command prints.
    pub fn summary(&self, grace: Duration) -> String {
        format!(
            "evicted {} ({}); released {}",
            self.record.display_name(),
            self.how(grace),
            self.record.gpus.join(",")
        )
    }
}

/// Who evicts: root (any holder) or a user (their own), and why.
#[derive(Debug, Clone)]
pub struct Evictor {
    pub uid: u32,
    /// The user name the audit line and the evicted job's message give.
    pub user: String,
    /// `--reason`, checked with `check_reason`.
    pub reason: Option<String>,
    /// How the name may fit (`release --force --exact`: `Match::Exact`).
    pub how: Match,
}

/// A reason as given, or why it is refused: bounded, printable, one line (it goes into
/// the audit log and another user's terminal).
pub fn check_reason(reason: &str) -> Result<(), EvictError> {
    match crate::base::message::is_one_short_line(reason, MAX_REASON) {
        true => Ok(()),
        false => Err(EvictError::BadReason {
            given: reason.chars().take(MAX_REASON).collect(),
        }),
    }
}

/// The holder `given` names among those `by` may end: root's are all, a user's their own;
/// another's is refused naming its owner.
fn find(records: &[Record], given: &str, by: &Evictor) -> Result<Record, EvictError> {
    if by.uid == 0 {
        return Ok(lookup::the_one(records, given, by.how)?.clone());
    }
    let mine: Vec<Record> = records
        .iter()
        .filter(|r| r.owner.as_ref().is_some_and(|o| o.uid == by.uid))
        .cloned()
        .collect();
    match lookup::the_one(&mine, given, by.how) {
        Ok(record) => Ok(record.clone()),
        Err(none @ LedgerError::NoSuchHolder { .. }) => {
            match lookup::the_one(records, given, by.how) {
                Ok(theirs) => Err(EvictError::NotYours {
                    name: theirs.display_name().to_string(),
                    owner: theirs
                        .owner
                        .as_ref()
                        .map_or("root".to_string(), |o| o.user.clone()),
                }),
                Err(_) => Err(none.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Stops the holder `given` names (as `gpupin status` shows it) and releases it.
pub fn evict(
    config: &Config,
    given: &str,
    by: &Evictor,
    grace: Duration,
) -> Result<Eviction, EvictError> {
    if let Some(reason) = &by.reason {
        check_reason(reason)?;
    }
    let ledger = crate::state::open_ledger(config)?;
    let records = ledger.records()?;
    let record = find(&records, given, by)?;
    let name = record.display_name().to_string();
    if !active(&ledger, &record) {
        release(&ledger, &record, &by.user)?;
        return Ok(Eviction {
            record,
            stopped: Stopped::WasNotRunning,
        });
    }
    let Some(pid) = record.pid else {
        return Err(EvictError::NoProcess { name });
    };
    let engine_stop = engine_stop(&record, grace);
    let how = engine_stop
        .as_ref()
        .map_or("SIGTERM, then SIGKILL".to_string(), |c| c.join(" "));
    let why = by
        .reason
        .as_deref()
        .map(|r| format!("; reason: {r}"))
        .unwrap_or_default();
    ledger.audit_eviction(&record, &format!("gpupin evict by {}: {how}{why}", by.user));
    // Before the stop: the job's gpupin exec reads it once its child has died.
    let _ = ledger.note_ended(&record.id, &by.user, by.reason.as_deref(), "gpupin evict");
    let stopped = match engine_stop.filter(|argv| run(argv)) {
        Some(argv) => Stopped::ByEngine(argv.join(" ")),
        None => Stopped::BySignal {
            killed: terminate(&ledger, &record, pid, grace),
        },
    };
    // Its grace, and time for the kernel to tear down what SIGKILL ended.
    let waited = grace + SETTLE;
    if !gone(&ledger, &record, waited)? {
        return Err(EvictError::StillRuns {
            name,
            how,
            waited: waited.as_secs(),
            pid,
        });
    }
    release(&ledger, &record, &by.user)?;
    Ok(Eviction { record, stopped })
}

/// `gpupin evict NAME` of a request that waits in the queue (no holder has that name):
/// cancelled, `by`'s own or any for root (`Ledger::cancel_waiting`).
pub fn cancel_queued(config: &Config, given: &str, by: &Evictor) -> Result<Waiting, EvictError> {
    let ledger = crate::state::open_ledger(config)?;
    let releaser = Releaser {
        uid: by.uid,
        user: by.user.clone(),
        force: false,
        how: by.how,
        command: "evict",
    };
    Ok(ledger.cancel_waiting(given, &releaser)?)
}

/// `docker stop -t SECONDS ID` for a Docker or podman container when its CLI is there.
fn engine_stop(record: &Record, grace: Duration) -> Option<Vec<String>> {
    let engine = record.container.as_ref()?.engine.as_deref()?;
    if !matches!(engine, "docker" | "podman") {
        return None;
    }
    Some(vec![
        engine.to_string(),
        "stop".into(),
        "-t".into(),
        grace.as_secs().to_string(),
        record.id.clone(),
    ])
}

/// Runs `argv`; whether it succeeded.
fn run(argv: &[String]) -> bool {
    Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGTERM to the holder's process (and its job cgroups), SIGKILL after `grace` if it
/// still runs; whether SIGKILL was needed. The process is pinned by a pidfd and checked
/// against the record's start time, so a pid reused since is never signalled.
fn terminate(ledger: &Ledger, record: &Record, pid: i32, grace: Duration) -> bool {
    let pinned = rustix::process::Pid::from_raw(pid)
        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok())
        .filter(|_| {
            record
                .start_time
                .is_some_and(|s| crate::base::procinfo::is_alive(pid, s))
        });
    let send = |signal: Signal| {
        if let Some(fd) = &pinned {
            let _ = rustix::process::pidfd_send_signal(fd, signal);
        }
        for cgroup in &record.cgroups {
            let _ = crate::host::confine::signal(cgroup, signal);
        }
    };
    send(Signal::TERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if !still_runs(ledger, record) {
            return false;
        }
        std::thread::sleep(POLL);
    }
    send(Signal::KILL);
    for cgroup in &record.cgroups {
        let _ = crate::host::confine::kill(cgroup);
    }
    true
}

/// Whether the holder's record is still there and running.
fn still_runs(ledger: &Ledger, record: &Record) -> bool {
    ledger
        .records()
        .is_ok_and(|records| records.iter().any(|r| same(r, record) && active(ledger, r)))
}

/// Waits up to `wait` for the holder to stop running (its record gone, or stale).
fn gone(ledger: &Ledger, record: &Record, wait: Duration) -> Result<bool, LedgerError> {
    let deadline = Instant::now() + wait;
    loop {
        if !still_runs(ledger, record) {
            return Ok(true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        std::thread::sleep(POLL);
    }
}

/// Whether the holder has something to stop: a container or job that runs (or is about
/// to), or a hold bound to a process that lives (the Python client's `acquire`, `hold
/// --pid`), which would go on using the GPUs after a bare release.
fn active(ledger: &Ledger, record: &Record) -> bool {
    let hold_process = record.kind == crate::model::holder::HolderKind::Hold
        && record
            .pid
            .zip(record.start_time)
            .is_some_and(|(pid, start)| crate::base::procinfo::is_alive(pid, start));
    hold_process || record.runs(SystemTime::now(), ledger.unbound_grace())
}

/// The same holder, not one made again under its name since.
fn same(a: &Record, b: &Record) -> bool {
    a.id == b.id && a.created_at == b.created_at && a.salt == b.salt
}

/// Releases the holder if its record is still there (its engine may have released it).
fn release(ledger: &Ledger, record: &Record, by: &str) -> Result<(), LedgerError> {
    if !ledger.records()?.iter().any(|r| same(r, record)) {
        return Ok(());
    }
    let releaser = Releaser {
        uid: 0,
        user: by.to_string(),
        force: false,
        how: Match::Exact,
        command: "evict",
    };
    match ledger.release_named(OsStr::new(&record.id), &releaser) {
        Ok(Released::Holder(_) | Released::Entry(_) | Released::Nothing | Released::Request(_)) => {
            Ok(())
        }
        // Released by its engine between the look and the release.
        Err(LedgerError::NoSuchHolder { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::holder::Owner;
    use crate::state::ledger::testing;

    fn owned(id: &str, uid: u32, user: &str) -> Record {
        let mut r = testing::record(id, &["GPU-0"]);
        r.owner = Some(Owner {
            uid,
            user: user.into(),
            groups: vec![],
        });
        r
    }

    fn by(uid: u32) -> Evictor {
        Evictor {
            uid,
            user: "bob".into(),
            reason: None,
            how: Match::Shown,
        }
    }

    /// A user ends only their own holders; naming another's is refused naming its
    /// owner by user name, and root finds anyone's.
    #[test]
    fn a_user_finds_only_their_own_and_is_told_whose_another_is() {
        let records = [owned("exec-1", 1002, "bob"), owned("exec-2", 1001, "alice")];
        assert_eq!(find(&records, "exec-1", &by(1002)).unwrap().id, "exec-1");
        assert_eq!(
            find(&records, "exec-2", &by(1002)).unwrap_err().to_string(),
            "exec-2 is alice's: only alice or root may end it"
        );
        assert!(matches!(
            find(&records, "exec-9", &by(1002)),
            Err(EvictError::Ledger(LedgerError::NoSuchHolder { .. }))
        ));
        assert_eq!(find(&records, "exec-2", &by(0)).unwrap().id, "exec-2");
    }

    #[test]
    fn a_reason_is_one_short_printable_line() {
        assert!(check_reason("node maintenance at 14:00").is_ok());
        let long = "x".repeat(MAX_REASON + 1);
        for bad in [
            "",
            "  ",
            "two\nlines",
            "\x1b[31mred",
            "a\u{202E}b",
            long.as_str(),
        ] {
            let err = check_reason(bad).unwrap_err().to_string();
            assert!(err.starts_with("--reason "), "{err}");
            assert!(!err.contains('\n') && !err.contains('\x1b'), "{err}");
        }
    }

    use crate::input::config::testing::sim8_in as config;

    /// A process of the test's own, reaped in the background once it ends (a zombie
    /// would look alive to nobody but would linger); its pid.
    fn process(script: &str) -> i32 {
        let mut child = Command::new("sh").args(["-c", script]).spawn().unwrap();
        let pid = child.id() as i32;
        std::thread::spawn(move || child.wait());
        // Until the shell has set its traps: /proc shows it as sh's child or itself.
        std::thread::sleep(Duration::from_millis(200));
        pid
    }

    /// Alice's (uid 1001) hold of GPU `device` for `pid`, or until released.
    fn alices_hold(config: &Config, id: &str, device: &str, pid: Option<i32>) -> Record {
        let alice = Owner {
            uid: 1001,
            user: "alice".into(),
            groups: vec![],
        };
        crate::jobs::hold::testing::for_owner(config, id, device, alice, pid)
    }

    fn alice(reason: Option<&str>) -> Evictor {
        Evictor {
            uid: 1001,
            user: "alice".into(),
            reason: reason.map(str::to_string),
            how: Match::Shown,
        }
    }

    fn held(config: &Config) -> Vec<String> {
        let ledger = crate::state::open_ledger(config).unwrap();
        ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect()
    }

    /// The user's own hold bound to a process: the process is stopped with SIGTERM, and
    /// only then are the GPUs released; the note says who and why.
    #[test]
    fn a_running_holder_is_stopped_before_its_gpus_are_released() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let pid = process("sleep 30");
        alices_hold(&config, "h1", "0", Some(pid));
        let done = evict(
            &config,
            "h1",
            &alice(Some("wrong input")),
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(done.stopped, Stopped::BySignal { killed: false });
        assert_eq!(done.how(Duration::from_secs(5)), "stopped with SIGTERM");
        assert!(
            crate::base::procinfo::start_time(pid).is_none(),
            "the process is gone"
        );
        assert!(held(&config).is_empty());
        let ledger = crate::state::open_ledger(&config).unwrap();
        let note = ledger
            .ended("h1", SystemTime::now() - Duration::from_secs(60))
            .unwrap();
        assert_eq!(
            note.line("h1"),
            "h1 was ended by alice (gpupin evict): wrong input"
        );
    }

    /// A process that ignores SIGTERM is killed once the grace runs out, and its GPUs go
    /// only after that.
    #[test]
    fn one_that_ignores_sigterm_is_killed_after_the_grace() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let pid = process("trap '' TERM; while :; do sleep 0.05; done");
        alices_hold(&config, "h1", "0", Some(pid));
        let grace = Duration::from_millis(300);
        let done = evict(&config, "h1", &alice(None), grace).unwrap();
        assert_eq!(done.stopped, Stopped::BySignal { killed: true });
        assert_eq!(done.how(grace), "killed: still running 0s after SIGTERM");
        assert!(crate::base::procinfo::start_time(pid).is_none());
        assert!(held(&config).is_empty());
    }

    /// A holder that no longer runs, or a hold without a process, is only released.
    #[test]
    fn what_does_not_run_is_released_and_a_bare_hold_is_told_to_release() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let pid = process("exit 0");
        std::thread::sleep(Duration::from_millis(100));
        alices_hold(&config, "gone", "0", Some(std::process::id() as i32));
        // Bound to this test process, then pointed at one that has ended.
        let ledger = crate::state::open_ledger(&config).unwrap();
        let mut record = ledger.records().unwrap().remove(0);
        record.pid = Some(pid);
        assert!(!active(&ledger, &record));
        release(&ledger, &record, "alice").unwrap();
        assert!(held(&config).is_empty());
        // Released again: its record is gone, which is no error.
        release(&ledger, &record, "alice").unwrap();

        // A hold without a process has nothing to stop: it is released.
        alices_hold(&config, "bare", "1", None);
        let done = evict(&config, "bare", &by(0), Duration::from_secs(1)).unwrap();
        assert_eq!(done.stopped, Stopped::WasNotRunning);
        assert!(
            done.summary(Duration::from_secs(1))
                .starts_with("evicted bare (it was not running); released GPU-")
        );
        assert!(held(&config).is_empty());
    }

    /// Another user's holder is neither stopped nor released.
    #[test]
    fn another_users_holder_is_left_running() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let pid = process("sleep 30");
        alices_hold(&config, "h1", "0", Some(pid));
        let err = evict(&config, "h1", &by(1002), Duration::from_secs(1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "h1 is alice's: only alice or root may end it"
        );
        assert!(crate::base::procinfo::start_time(pid).is_some());
        assert_eq!(held(&config), ["h1"]);
        // A bad reason stops nothing either, even for root.
        let mut root = by(0);
        root.reason = Some("a\nb".into());
        assert!(evict(&config, "h1", &root, Duration::from_secs(1)).is_err());
        assert!(crate::base::procinfo::start_time(pid).is_some());
        evict(&config, "h1", &by(0), Duration::from_secs(5)).unwrap();
        assert!(held(&config).is_empty());
    }

    /// `gone` waits while the holder's process runs, says so when its wait runs out, and
    /// says it is gone once it is, not at its first look.
    #[test]
    fn gone_waits_for_the_process_to_go_and_says_when_it_does_not() {
        let tmp = tempfile::tempdir().unwrap();
        let config = config(tmp.path());
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        alices_hold(&config, "h1", "0", Some(child.id() as i32));
        let ledger = crate::state::open_ledger(&config).unwrap();
        let record = ledger.records().unwrap().remove(0);
        assert!(!gone(&ledger, &record, Duration::from_millis(300)).unwrap());
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            child.kill().unwrap();
            child.wait().unwrap();
        });
        assert!(gone(&ledger, &record, Duration::from_secs(30)).unwrap());
        ender.join().unwrap();
    }

    /// Only the same holder counts: one made again under its name since is another.
    #[test]
    fn a_holder_made_again_under_the_same_name_is_another() {
        let a = testing::record("x", &["GPU-0"]);
        assert!(same(&a, &a.clone()));
        for change in [
            |r: &mut Record| r.id = "y".into(),
            |r: &mut Record| r.created_at += 1,
            |r: &mut Record| r.salt = "other".into(),
        ] {
            let mut b = a.clone();
            change(&mut b);
            assert!(!same(&a, &b), "{b:?}");
        }
    }

    /// Docker and podman containers are stopped by their engine, with the grace.
    #[test]
    fn a_container_of_docker_or_podman_is_stopped_by_its_engine() {
        let mut record = testing::record("web", &["GPU-0"]);
        assert_eq!(engine_stop(&record, Duration::from_secs(10)), None);
        for engine in ["docker", "podman"] {
            record.container = Some(crate::model::holder::ContainerInfo {
                engine: Some(engine.into()),
                ..Default::default()
            });
            assert_eq!(
                engine_stop(&record, Duration::from_secs(7)).unwrap(),
                [engine, "stop", "-t", "7", "web"]
            );
        }
        record.container = Some(crate::model::holder::ContainerInfo {
            engine: Some("containerd".into()),
            ..Default::default()
        });
        assert_eq!(engine_stop(&record, Duration::from_secs(7)), None);
        assert!(run(&["true".to_string()]));
        assert!(!run(&["false".to_string()]));
    }
}
