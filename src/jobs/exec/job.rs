//! One job's way through the ledger, the same for `gpupin exec` as root and for
//! `gpupin serve`: GPUs for the process that asks, then, once the job waits at its gate,
//! the record moved to the job and the job confined; at its end, the release.

use crate::admission::grant::GrantError;
use crate::admission::memory_limit;
use crate::host::confine::{self, ConfineError, JobCgroup};
use crate::host::inventory::InventoryError;
use crate::input::config::Config;
use crate::input::config::Leftovers;
use crate::input::request::GpuRequest;
use crate::model::gpu::Inventory;
use crate::model::holder::{HolderId, Owner};
use crate::state::ledger::{LedgerError, Record, StillWanted};
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// How often a caller of `finish` asks again while a job's leftovers run.
pub const LEFTOVERS_POLL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{0}; the job was not started")]
    Confine(#[source] ConfineError),
    #[error("{0}; the job was not started")]
    MemoryLimit(#[from] InventoryError),
}

/// GPUs granted to a job that has not started yet.
#[derive(Debug)]
pub struct JobGrant {
    pub holder: HolderId,
    pub inventory: Inventory,
    pub record: Record,
    /// What the job's environment gets (`job_env`).
    pub env: Vec<(String, String)>,
}

/// Allocates for a job of `owner`'s, held by `asker` (the process that asks) until the
/// job starts.
pub fn grant(
    config: &Config,
    holder: HolderId,
    request: &GpuRequest,
    owner: Owner,
    asker: i32,
    source: &str,
) -> Result<JobGrant, JobError> {
    grant_while(config, holder, request, owner, asker, source, None)
}

/// `grant`, for a caller that may go away while its request waits in the queue
/// (`gpupin serve`): the wait ends once `still_wanted` says no.
pub(crate) fn grant_while(
    config: &Config,
    holder: HolderId,
    request: &GpuRequest,
    owner: Owner,
    asker: i32,
    source: &str,
    still_wanted: Option<StillWanted>,
) -> Result<JobGrant, JobError> {
    let holder = unused_job_id(config, holder, asker)?;
    let (inventory, record) =
        super::allocate(config, &holder, request, owner, asker, source, still_wanted)?;
    let env = super::job_env(&inventory, &record, config.cuda_visible_devices);
    Ok(JobGrant {
        holder,
        inventory,
        record,
        env,
    })
}

/// A job gpupin names after the process that asks (`exec-<asker>`) never takes the name
/// of a job still running from an earlier process that had the same pid (a leftover
/// whose `gpupin exec` is gone): it is then `exec-<asker>-2`, `-3`, and so on. Only the
/// process `asker` asks under these names (users may not name holders `exec-`), so a look
/// without the lock is enough; a stale holder of the name is reaped by the allocation.
fn unused_job_id(config: &Config, holder: HolderId, asker: i32) -> Result<HolderId, JobError> {
    let generated = format!("{}{asker}", crate::model::holder::EXEC_PREFIX);
    if holder.as_str() != generated {
        return Ok(holder);
    }
    let ledger = crate::state::ledger::Ledger::open_read_only(&config.ledger_settings())?;
    let now = std::time::SystemTime::now();
    let taken: Vec<String> = ledger
        .records()?
        .into_iter()
        .filter(|r| r.id.starts_with(&generated) && !r.is_stale(now, ledger.unbound_grace()))
        .map(|r| r.id)
        .collect();
    let name = std::iter::once(generated.clone())
        .chain((2..).map(|n| format!("{generated}-{n}")))
        .find(|name| !taken.contains(name))
        .expect("an endless list has a free name");
    // Always a valid id: digits and dashes after a valid one.
    Ok(HolderId::new(&name).unwrap_or(holder))
}

/// The job `job` (waiting at its gate) takes the record over from `asker` and is put in a
/// device cgroup of its own, which its record then names (`Record::cgroups`). `job_fd`
/// is a pidfd of the job, opened before it was checked: the record and the cgroup go to
/// that process only, never to one that got its pid since. On error nothing is held any
/// more and the job must not run.
pub fn start(
    config: &Config,
    grant: &JobGrant,
    asker: i32,
    job: i32,
    job_fd: BorrowedFd<'_>,
) -> Result<Option<JobCgroup>, JobError> {
    let ledger = crate::state::open_ledger(config)?;
    let started = ledger
        .adopt(&grant.holder, asker, job, job_fd)
        .map_err(JobError::from)
        .and_then(|record| {
            let rules = super::denied_nodes(&grant.inventory, &record);
            confine::confine(job, job_fd, grant.holder.as_str(), config.confine, &rules)
                .map_err(JobError::Confine)
        })
        .and_then(|cgroup| {
            if let Some(cgroup) = &cgroup {
                // The job never runs after an error here: the cgroup goes once the
                // caller has reaped it (`gpupin gc` removes it otherwise).
                ledger.record_cgroups(&grant.holder, job, cgroup.dirs())?;
                limit_memory(config, &ledger, grant, job, cgroup)?;
            }
            Ok(cgroup)
        });
    if started.is_err() {
        let _ = ledger.release(&grant.holder);
    }
    started
}

/// A shared job's memory reservation as a limit the driver enforces on its cgroup, where
/// the machine is NVML's (`admission::memory_limit`). The record says whether it is
/// enforced or accounting only; a driver that has limits but refuses this one fails the
/// start.
fn limit_memory(
    config: &Config,
    ledger: &crate::state::ledger::Ledger,
    grant: &JobGrant,
    job: i32,
    cgroup: &JobCgroup,
) -> Result<(), JobError> {
    let Some(bytes) = memory_limit::reservation(&grant.record) else {
        return Ok(());
    };
    // A simulated or file inventory has no driver to enforce it.
    if !crate::host::inventory::from_nvml(&grant.inventory) {
        return Ok(());
    }
    let Some(dir) = limit_dir(cgroup) else {
        return Ok(());
    };
    let limit = memory_limit::set(&config.nvml, &grant.record, bytes, dir)?;
    tracing::info!(holder = %grant.holder, limit = ?limit, bytes, "memory reservation");
    ledger.record_memory_limit(&grant.holder, job, limit)?;
    Ok(())
}

/// The cgroup the driver's memory limit goes on: the job's cgroup2 directory where it
/// has one, else its first.
fn limit_dir(cgroup: &JobCgroup) -> Option<&std::path::Path> {
    let dirs = cgroup.dirs();
    cgroup
        .mechanisms()
        .iter()
        .position(|m| *m == confine::Mechanism::Bpf)
        .map(|p| dirs[p].as_path())
        .or_else(|| dirs.first().map(|d| d.as_path()))
}

/// What `finish` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finished {
    /// The job is over: its GPUs are released and its cgroups removed.
    Released,
    /// The job's main process ended, but processes it left are still in its cgroup
    /// (waited for, or killed and not gone yet, per `leftovers`): it keeps its GPUs, and
    /// the caller asks again later (`LEFTOVERS_POLL`).
    Leftovers,
}

/// Called once job `job`'s main process has ended (and again while it says
/// `Leftovers`): a confined job is over when its cgroups are empty, not when its first
/// process exits. With `leftovers = "kill"` what is left gets SIGKILL first. Then the
/// GPUs are released and the cgroups removed. Only the record of this job is released:
/// its holder id may have been released by hand and given to another job meanwhile.
///
/// `cgroup`: the job's cgroups where the caller confined it; `None` (a daemon that
/// started after the job): the ones its record names. An unconfined job has none, and
/// its main process's end ends it.
pub fn finish(
    config: &Config,
    holder: &HolderId,
    job: i32,
    cgroup: Option<&JobCgroup>,
) -> Finished {
    let ledger = crate::state::open_ledger(config);
    let recorded = match (cgroup, &ledger) {
        (None, Ok(ledger)) => ledger
            .records()
            .unwrap_or_default()
            .into_iter()
            .find(|r| r.id == holder.as_str() && r.pid == Some(job))
            .and_then(|r| JobCgroup::recorded(&r.cgroups)),
        _ => None,
    };
    if let Some(cgroup) = cgroup.or(recorded.as_ref())
        && cgroup.populated()
    {
        if config.leftovers == Leftovers::Kill
            && let Err(err) = cgroup.kill()
        {
            tracing::warn!(holder = %holder, error = %crate::base::message::one_line(&err), "killing a job's leftovers");
        }
        // Killed processes leave the cgroup once they are reaped; until then the job
        // keeps its GPUs.
        if cgroup.populated() {
            tracing::debug!(holder = %holder, leftovers = ?config.leftovers, "the job's cgroup still has processes");
            return Finished::Leftovers;
        }
    }
    let released = match &ledger {
        Ok(ledger) => ledger.release_job(holder, job).unwrap_or_else(|err| {
            tracing::warn!(holder = %holder, error = %crate::base::message::one_line(&err), "releasing a finished job");
            None
        }),
        Err(_) => None,
    };
    // The driver's memory limit, where the released record says one was set, is cleared
    // before the cgroup goes.
    if let (Some(record), Some(dir)) = (&released, cgroup.or(recorded.as_ref()).and_then(limit_dir))
        && let Err(err) = memory_limit::clear(&config.nvml, record, dir)
    {
        tracing::warn!(holder = %holder, error = %crate::base::message::one_line(&err), "clearing the job's memory limit");
    }
    if let Some(cgroup) = cgroup.or(recorded.as_ref())
        && let Err(err) = cgroup.remove()
    {
        tracing::info!(holder = %holder, error = %crate::base::message::one_line(&err), "the job's cgroup stays");
    }
    Finished::Released
}

/// Releases what `grant` holds, for a job that never started.
pub fn abandon(config: &Config, grant: &JobGrant) {
    if let Ok(ledger) = crate::state::open_ledger(config) {
        let _ = ledger.release(&grant.holder);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::input::request::{Origin, Selection};
    use crate::model::holder::HolderKind;
    use crate::policy::testing::machine;
    use crate::state::ledger::{HolderMeta, Machine};
    use std::path::{Path, PathBuf};

    fn config(tmp: &Path, leftovers: Leftovers) -> Config {
        Config {
            state_dir: tmp.join("state"),
            audit_log: tmp.join("audit.log"),
            leftovers,
            ..Config::default()
        }
    }

    fn set_populated(dir: &Path, populated: bool) {
        let events = format!("populated {}\n", u8::from(populated));
        std::fs::write(dir.join("cgroup.events"), events).unwrap();
    }

    /// Issue 19, finding 7: `finish` after the main process ended, with the job's cgroup
    /// known only from its record (a daemon started after the job): leftovers keep the
    /// record, "kill" kills them first, an empty cgroup releases.
    #[test]
    fn finish_releases_only_once_the_recorded_cgroup_is_empty() {
        let tmp = tempfile::tempdir().unwrap();
        let wait = config(tmp.path(), Leftovers::Wait);
        let kill = config(tmp.path(), Leftovers::Kill);
        let ledger = crate::state::open_ledger(&wait).unwrap();
        let mut main = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = main.id() as i32;
        let holder = HolderId::new("j").unwrap();
        let inv = machine(4);
        let meta = HolderMeta {
            source: "test".into(),
            pid: Some(pid),
            kind: HolderKind::Exec,
            ..HolderMeta::default()
        };
        let request = GpuRequest::new(Selection::Count(1), Origin::Cli);
        ledger
            .allocate(
                &holder,
                &request,
                &Machine::new(&inv, PolicyName::Pack),
                meta,
            )
            .unwrap();
        let dir: PathBuf = tmp.path().join("cgroups/gpupin-j");
        std::fs::create_dir_all(&dir).unwrap();
        set_populated(&dir, true);
        std::fs::write(dir.join("cgroup.kill"), "").unwrap();
        ledger
            .record_cgroups(&holder, pid, std::slice::from_ref(&dir))
            .unwrap();
        main.kill().unwrap();
        main.wait().unwrap();

        assert_eq!(finish(&wait, &holder, pid, None), Finished::Leftovers);
        assert_eq!(ledger.records().unwrap().len(), 1, "still held");
        assert_eq!(
            std::fs::read_to_string(dir.join("cgroup.kill")).unwrap(),
            ""
        );
        assert_eq!(finish(&kill, &holder, pid, None), Finished::Leftovers);
        assert_eq!(
            std::fs::read_to_string(dir.join("cgroup.kill")).unwrap(),
            "1",
            "killed"
        );
        assert_eq!(ledger.records().unwrap().len(), 1, "held until gone");

        set_populated(&dir, false);
        assert_eq!(finish(&wait, &holder, pid, None), Finished::Released);
        assert!(ledger.records().unwrap().is_empty());
    }

    /// Issue 31, finding 8: a leftover job keeps `exec-<pid>` after the `gpupin exec` of
    /// that pid is gone; the next unnamed job whose asker got the same pid is named
    /// `exec-<pid>-2`, not refused as "holder exec-<pid> exists already".
    #[test]
    fn an_unnamed_job_beside_a_leftover_of_its_name_gets_a_name_of_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config {
            inventory: "sim:nvswitch8".parse().unwrap(),
            ..config(tmp.path(), Leftovers::Wait)
        };
        let me = std::process::id() as i32;
        let generated = HolderId::new(&format!("exec-{me}")).unwrap();
        let mut leftover = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let ledger = crate::state::open_ledger(&config).unwrap();
        let inv = machine(8);
        let meta = HolderMeta {
            source: "test".into(),
            pid: Some(leftover.id() as i32),
            kind: HolderKind::Exec,
            ..HolderMeta::default()
        };
        let request = GpuRequest::new(Selection::Count(1), Origin::Cli);
        let machine = Machine::new(&inv, PolicyName::Pack);
        ledger
            .allocate(&generated, &request, &machine, meta)
            .unwrap();

        let root = Owner {
            uid: 0,
            user: "root".into(),
            groups: vec![],
        };
        let second = grant(
            &config,
            generated.clone(),
            &request,
            root.clone(),
            me,
            "cli",
        )
        .unwrap();
        assert_eq!(second.holder.as_str(), format!("exec-{me}-2"));
        assert_eq!(second.record.id, format!("exec-{me}-2"));
        let third = grant(&config, generated.clone(), &request, root, me, "cli").unwrap();
        assert_eq!(third.holder.as_str(), format!("exec-{me}-3"));
        // A name only ever given out anew: a named job is never renamed.
        let named = unused_job_id(&config, HolderId::new("train").unwrap(), me).unwrap();
        assert_eq!(named.as_str(), "train");
        leftover.kill().unwrap();
        leftover.wait().unwrap();
        // Once the leftover is gone, its name is free again.
        let again = unused_job_id(&config, generated, me).unwrap();
        assert_eq!(again.as_str(), format!("exec-{me}"));
    }
}
