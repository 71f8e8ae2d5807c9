//! `hold`: GPUs set aside for the caller (root: for anyone) while a process of theirs
//! runs (watched, so that they go when it ends), or, root only, until released or for a
//! while; with request keys, a hold may wait in the queue (the Python client's `acquire`).

use super::super::authorize::{self, HoldFor};
use super::super::connections::{Shared, still_open};
use super::super::error::ServeError;
use super::super::peer::{Peer, Pinned};
use super::super::protocol::Reply;
use super::granted;
use crate::host::users;
use crate::input::config::Config;
use crate::jobs::exec;
use crate::jobs::hold::{self, HoldOwner, HoldRequest};
use crate::model::holder::HolderId;
use crate::state::ledger::{Record, StillWanted};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The reply to a hold: its holder and GPUs with the environment that names them for
/// CUDA.
pub(in crate::jobs::serve) fn answer(
    shared: &Shared,
    config: &Config,
    peer: Peer,
    asked: HoldRequest,
    stream: &Arc<UnixStream>,
) -> Result<Reply, ServeError> {
    let record = hold_for(shared, peer, asked, Some(stream))?;
    Ok(Reply {
        env: hold_env(config, &record),
        ..granted(&record)
    })
}

/// The environment that tells a held process's CUDA which GPUs are its own, as a job's
/// (`exec::job_env`): the Python client sets it in the process that holds them.
fn hold_env(config: &Config, record: &Record) -> Vec<(String, String)> {
    match config.load_inventory() {
        Ok(inventory) => exec::job_env(&inventory, record, config.cuda_visible_devices),
        Err(_) => Vec::new(),
    }
}

/// A hold for the caller; one with a process is watched, so that it goes when the
/// process ends. `caller`: the connection, whose hang-up ends a wait in the queue.
fn hold_for(
    shared: &Shared,
    peer: Peer,
    asked: HoldRequest,
    caller: Option<&Arc<UnixStream>>,
) -> Result<Record, ServeError> {
    let config = shared.config();
    let config = &*config;
    let me = users::owner_of(peer.uid)?;
    let owner = match authorize::hold_for(peer, &me.user, asked.user.as_deref())
        .map_err(ServeError::Denied)?
    {
        HoldFor::Named(name) => users::owner_named(name)?,
        HoldFor::Caller => me,
    };
    authorize::may_hold_without_process(peer, asked.until_release, asked.pid)
        .map_err(ServeError::Denied)?;
    let request = asked.keys()?;
    let pinned = match asked.pid {
        Some(pid) => {
            let pinned = Pinned::open(pid).map_err(|source| ServeError::Pin { pid, source })?;
            authorize::may_pin(peer, pid, pinned.parent_and_owner()).map_err(ServeError::Denied)?;
            Some(pinned)
        }
        None => None,
    };
    if pinned.is_some() {
        shared.watcher.admits(peer.uid, &asked.id, asked.pid)?;
    }
    let whose = HoldOwner {
        owner,
        limited: authorize::limited(peer),
    };
    // A wait in the queue ends when the caller hangs up or its process ends.
    let still_wanted = match (caller, &pinned) {
        (Some(caller), Some(pinned)) => {
            let caller = Arc::clone(caller);
            let fd = pinned.fd.try_clone().map_err(ServeError::Pidfd)?;
            let process = Pinned {
                pid: pinned.pid,
                fd,
            };
            Some(StillWanted(Arc::new(move || {
                still_open(&caller) && process.alive()
            })))
        }
        _ => None,
    };
    // A refused allocation is audited by grant::allocate.
    // A wait comes among the request keys (`request`), never as `asked.wait`.
    let record = hold::hold_with(config, &asked, &whose, request, still_wanted, "serve")?;
    if let (Some(pinned), Ok(holder)) = (pinned, HolderId::new(&record.id)) {
        let pid = pinned.pid;
        if let Err(why) = still_the_pinned(&pinned, &record) {
            if let Ok(ledger) = crate::state::open_ledger(config) {
                let _ = ledger.release_job(&holder, pid);
            }
            return Err(why);
        }
        if let Err(e) = shared
            .watcher
            .watch(peer.uid, holder.clone(), pinned, None, true)
        {
            // Another request of the caller's took the last watch meanwhile: nothing
            // would release this hold at its process's end, so it goes now.
            if let Ok(ledger) = crate::state::open_ledger(config) {
                let _ = ledger.release_job(&holder, pid);
            }
            return Err(e.into());
        }
    }
    Ok(record)
}

/// Whether the process `record` names is still the one pinned when the hold was asked
/// for: it ran when the record was written (the record's start time is of a live
/// process) and the pidfd says it runs now. A process that ended in between, its pid
/// taken by another since, must not have the hold: the ledger would take that other
/// process for the holder (same pid, a start time of a live process), and nothing would
/// watch it.
fn still_the_pinned(pinned: &Pinned, record: &Record) -> Result<(), ServeError> {
    let now = crate::base::procinfo::start_time(pinned.pid);
    match authorize::still_the_process(record.start_time, now, pinned.alive()) {
        true => Ok(()),
        false => Err(ServeError::EndedBeforeRecorded { pid: pinned.pid }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::ServeSettings;
    use crate::jobs::serve::testing::{NOBODY, caller, daemon, denied, failed, nobodys_process};
    use crate::state::ledger::Ledger;
    use std::time::{Duration, Instant};

    #[test]
    fn a_user_holds_only_for_themselves_with_a_process_of_their_own() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: starting a process as nobody needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let mut limited = (*shared.config()).clone();
        limited.limits.max_gpus_per_user = Some(2);
        *shared.config.write().unwrap() = Arc::new(limited);
        let mut theirs = nobodys_process();
        let mut roots = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ask = |id: &str, devices: &str, pid: Option<u32>, user: Option<&str>| HoldRequest {
            id: id.into(),
            devices: devices.into(),
            pid: pid.map(|p| p as i32),
            user: user.map(String::from),
            ..HoldRequest::default()
        };
        let nobody = caller(NOBODY);
        let by_name = hold_for(
            &shared,
            nobody,
            ask("h1", "1", Some(theirs.id()), Some("nobody")),
            None,
        );
        let record = by_name.unwrap();
        assert_eq!(record.owner.as_ref().map(|o| o.uid), Some(NOBODY));
        assert_eq!(record.pid, Some(theirs.id() as i32));
        let by_uid = hold_for(
            &shared,
            nobody,
            ask("h2", "2", Some(theirs.id()), Some("65534")),
            None,
        );
        assert_eq!(by_uid.unwrap().owner.unwrap().user, "nobody");
        // Their limit applies to them (2 GPUs): not to root's holds for them below.
        assert!(
            failed(hold_for(
                &shared,
                nobody,
                ask("h3", "3", Some(theirs.id()), None),
                None,
            ))
            .ends_with("(limits.max_gpus_per_user)")
        );
        assert_eq!(
            denied(hold_for(
                &shared,
                nobody,
                ask("h4", "4", Some(theirs.id()), Some("root")),
                None,
            )),
            "only root may hold GPUs for another user (root)"
        );
        let until_release = HoldRequest {
            until_release: true,
            ..ask("h5", "5", None, None)
        };
        assert_eq!(
            denied(hold_for(&shared, nobody, until_release, None)),
            "only root may hold GPUs until released: give --pid with a process of yours"
        );
        assert_eq!(
            denied(hold_for(
                &shared,
                nobody,
                ask("h6", "6", Some(roots.id()), None),
                None,
            )),
            format!("pid {} is not a process of uid {NOBODY}", roots.id())
        );
        // Root holds for anyone, with anyone's process or until released.
        let root = caller(0);
        let for_nobody = hold_for(
            &shared,
            root,
            ask("r1", "3", Some(theirs.id()), Some("nobody")),
            None,
        );
        assert_eq!(for_nobody.unwrap().owner.unwrap().uid, NOBODY);
        let until_release = HoldRequest {
            until_release: true,
            ..ask("r2", "4", None, Some("nobody"))
        };
        assert_eq!(
            hold_for(&shared, root, until_release, None)
                .unwrap()
                .owner
                .unwrap()
                .uid,
            NOBODY
        );
        let ledger = Ledger::open(&shared.config().ledger_settings()).unwrap();
        let mut held: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        held.sort();
        assert_eq!(held, ["h1", "h2", "r1", "r2"]);
        for child in [&mut theirs, &mut roots] {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// A process that ended while its hold waited in the queue, its pid taken since by
    /// another process of the same user: the hold is not that other process's. Before the
    /// record was checked against the pidfd, the reply said it was held (for the recycled
    /// pid, until the watcher saw the pidfd end).
    #[test]
    fn a_hold_never_passes_to_a_process_that_took_its_pid() {
        if !rustix::process::geteuid().is_root() {
            // With CI=true an end-to-end check must run, never skip.
            assert_ne!(
                std::env::var("CI").as_deref(),
                Ok("true"),
                "recycling a pid (ns_last_pid) needs root"
            );
            eprintln!("skipped: recycling a pid (ns_last_pid) needs root (CI runs as root)");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let shared = daemon(tmp.path(), ServeSettings::default());
        let config = shared.config();
        hold::testing::roots(&config, "full", "0,1,2,3,4,5,6,7");
        let mut first = nobodys_process();
        let pid = first.id() as i32;
        let asked = HoldRequest {
            id: "py".into(),
            devices: String::new(),
            by_minor: false,
            pid: Some(pid),
            until_release: false,
            user: None,
            within: None,
            count: None,
            mig: None,
            reason: None,
            for_secs: None,
            request: vec![
                ("gpupin.count".into(), "1".into()),
                ("gpupin.wait".into(), "2m".into()),
            ],
            wait: None,
        };
        let waiting = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || hold_for(&shared, caller(NOBODY), asked, None))
        };
        let ledger = Ledger::open(&config.ledger_settings()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while ledger.waiting().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "the hold never queued");
            std::thread::sleep(Duration::from_millis(20));
        }
        first.kill().unwrap();
        first.wait().unwrap();
        let mut second = recycled(pid);
        ledger.release(&HolderId::new("full").unwrap()).unwrap();
        let outcome = waiting.join().unwrap();
        if let Some(second) = second.as_mut() {
            second.kill().unwrap();
            second.wait().unwrap();
        }
        assert_eq!(
            failed(outcome),
            format!(
                "pid {pid} ended before its hold was recorded: nothing is held (hold again with a running process)"
            )
        );
        let held: Vec<String> = ledger
            .records()
            .unwrap()
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert!(held.is_empty(), "{held:?}");
        assert!(
            second.is_some(),
            "the pid was never taken again: the test showed less"
        );
    }

    /// Nobody's process with `pid`, made by setting the kernel's last pid just below it
    /// (other processes may take it first: a few tries).
    fn recycled(pid: i32) -> Option<std::process::Child> {
        for _ in 0..50 {
            std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
            let mut child = nobodys_process();
            if child.id() as i32 == pid {
                return Some(child);
            }
            child.kill().unwrap();
            child.wait().unwrap();
        }
        None
    }
}
