//! Bare-metal jobs in the same ledger as containers (`gpupin exec`): the GPUs a job gets,
//! the environment that tells CUDA about them, a child that runs only once its GPUs are
//! recorded under its own pid (`gate`), and a parent that passes signals on and returns
//! the job's status (`wait`). `gpupin serve` uses the same pieces for users who are not
//! root.

mod env;
mod gate;
mod job;
mod wait;

pub use env::{HOLDER_ENV, job_env};
pub use gate::{GATE_FD_ARG, Gated, pass_gate, spawn_gated};
pub use job::{
    Finished, JobError, JobGrant, LEFTOVERS_POLL, abandon, finish, grant, grant_while, start,
};
pub use wait::{
    block_signals, exit_code, forward_signals_and_wait, next_signal, unblock_all_signals,
};

use crate::admission::edits::ContainerEdits;
use crate::admission::grant::{self, GrantError};
use crate::host::inventory::Inventory;
use crate::input::config::Config;
use crate::input::request::{self, GpuRequest, Origin, RequestError};
use crate::model::holder::{HolderId, HolderKind, Owner};
use crate::state::ledger::{HolderMeta, Record, StillWanted};

/// Allocates `request` for a job of `owner`'s, recorded under `pid` (the process that
/// asks, until the job it starts takes the record over with `Ledger::adopt`). Limits apply
/// unless the owner is root.
/// `still_wanted`: polled while the request waits in the queue (`gpupin serve`: whether
/// the caller's connection is still open).
pub fn allocate(
    config: &Config,
    holder: &HolderId,
    request: &GpuRequest,
    owner: Owner,
    pid: i32,
    source: &str,
    still_wanted: Option<StillWanted>,
) -> Result<(Inventory, Record), GrantError> {
    let meta = HolderMeta {
        source: source.to_string(),
        pid: Some(pid),
        still_wanted,
        kind: HolderKind::Exec,
        limited: owner.uid != 0,
        owner: Some(owner),
        ..HolderMeta::default()
    };
    grant::allocate(config, holder, request, meta)
}

/// The device numbers a job holding `record` must not open: the nodes a container
/// holding it is kept from (`ContainerEdits::withheld`, every other GPU's).
pub fn denied_minors(inventory: &Inventory, record: &Record) -> Vec<u32> {
    ContainerEdits::gpus_of(inventory, record)
        .withheld
        .iter()
        .map(|node| node.minor)
        .collect()
}

#[derive(Debug, thiserror::Error)]
pub enum JobRequestError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error("give --count, --devices or --within")]
    Nothing,
    #[error(transparent)]
    Id(#[from] crate::model::holder::BadHolderId),
}

/// A job's request, from `gpupin exec`'s options as annotation-named pairs, and its holder
/// id: `name`, else `exec-<asker>`. The one reading of a job's request, for root's
/// `gpupin exec` and `gpupin serve` alike.
pub fn job_request(
    pairs: &[(String, String)],
    name: Option<&str>,
    asker: i32,
) -> Result<(GpuRequest, HolderId), JobRequestError> {
    let pairs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let request = request::from_pairs(&pairs, Origin::Cli)?.ok_or(JobRequestError::Nothing)?;
    let holder = match name {
        Some(name) => HolderId::new(name)?,
        None => HolderId::new(&format!("exec-{asker}"))?,
    };
    Ok((request, holder))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job is kept from exactly the nodes a container holding the same GPUs is kept from.
    #[test]
    fn a_job_is_denied_what_a_container_is_withheld() {
        let inv = crate::policy::testing::machine(8);
        let record = crate::state::ledger::testing::record("j1", &["GPU-test-5", "GPU-test-2"]);
        assert_eq!(denied_minors(&inv, &record), [0, 1, 3, 4, 6, 7]);
        let edits = ContainerEdits::for_record(&inv, &record).unwrap();
        let withheld: Vec<u32> = edits.withheld.iter().map(|n| n.minor).collect();
        assert_eq!(denied_minors(&inv, &record), withheld);
    }
}
