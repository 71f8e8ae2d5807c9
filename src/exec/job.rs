//! One job's way through the ledger, the same for `gpupin exec` as root and for
//! `gpupin serve`: GPUs for the process that asks, then, once the job waits at its gate,
//! the record moved to the job and the job confined; at its end, the release.

use crate::config::Config;
use crate::confine::{self, ConfineError, DeviceRules, JobCgroup};
use crate::grant::GrantError;
use crate::inventory::Inventory;
use crate::ledger::{HolderId, Ledger, LedgerError, Owner, Record, StillWanted};
use crate::request::GpuRequest;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Grant(#[from] GrantError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("{0}; the job was not started")]
    Confine(#[source] ConfineError),
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
pub fn grant_while(
    config: &Config,
    holder: HolderId,
    request: &GpuRequest,
    owner: Owner,
    asker: i32,
    source: &str,
    still_wanted: Option<StillWanted>,
) -> Result<JobGrant, JobError> {
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

/// The job `job` (waiting at its gate) takes the record over from `asker` and is put in a
/// device cgroup of its own. On error nothing is held any more and the job must not run.
pub fn start(
    config: &Config,
    grant: &JobGrant,
    asker: i32,
    job: i32,
) -> Result<Option<JobCgroup>, JobError> {
    let ledger = Ledger::for_config(config)?;
    let started = ledger
        .adopt(&grant.holder, asker, job)
        .map_err(JobError::from)
        .and_then(|record| {
            let own: Vec<u32> = grant
                .inventory
                .gpus
                .iter()
                .filter(|g| record.gpus.contains(&g.uuid))
                .map(|g| g.minor)
                .collect();
            let rules = DeviceRules::all_but(
                grant.inventory.gpu_major,
                grant.inventory.gpus.iter().map(|g| g.minor),
                &own,
            );
            confine::confine(job, grant.holder.as_str(), config.confine, &rules)
                .map_err(JobError::Confine)
        });
    if started.is_err() {
        let _ = ledger.release(&grant.holder);
    }
    started
}

/// Releases a job's GPUs once it has ended, and removes its cgroup (best effort: a
/// process it left behind keeps the cgroup, and its rules, until it ends too). Only the
/// record of this job is released: its holder id may have been released by hand and
/// given to another job meanwhile.
pub fn finish(config: &Config, holder: &HolderId, job: i32, cgroup: Option<&JobCgroup>) {
    if let Ok(ledger) = Ledger::for_config(config)
        && let Err(err) = ledger.release_job(holder, job)
    {
        tracing::warn!(holder = %holder, error = %crate::message::one_line(&err), "releasing a finished job");
    }
    if let Some(cgroup) = cgroup
        && let Err(err) = cgroup.remove()
    {
        tracing::info!(holder = %holder, error = %crate::message::one_line(&err), "the job's cgroup stays");
    }
}

/// Releases what `grant` holds, for a job that never started.
pub fn abandon(config: &Config, grant: &JobGrant) {
    if let Ok(ledger) = Ledger::for_config(config) {
        let _ = ledger.release(&grant.holder);
    }
}
