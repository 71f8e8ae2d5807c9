//! Bare-metal jobs in the same ledger as containers (`gpupin exec`): the GPUs a job gets,
//! the environment that tells CUDA about them, a child that runs only once its GPUs are
//! recorded under its own pid (`gate`), and a parent that passes signals on and returns
//! the job's status (`wait`). `gpupin serve` uses the same pieces for users who are not
//! root.

mod env;
mod gate;
mod job;
mod wait;

pub(crate) use env::job_env;
pub use gate::{Gated, pass_gate, spawn_gated};
pub use job::{Finished, LEFTOVERS_POLL, abandon, finish, grant, start};
pub(crate) use job::{JobError, JobGrant, grant_while};
pub use wait::{
    block_signals, exit_code, forward_signals_and_wait, next_signal, unblock_all_signals,
};

use crate::admission::edits::ContainerEdits;
use crate::admission::grant::{self, GrantError};
use crate::host::confine::DeviceRules;
use crate::input::config::Config;
use crate::input::request::{self, GpuRequest, Origin, RequestError};
use crate::model::gpu::{DeviceNode, Inventory};
use crate::model::holder::{HolderId, HolderKind, Owner};
use crate::model::mig::CAPS_DIR;
use crate::state::ledger::{HolderMeta, Record, StillWanted};

/// Allocates `request` for a job of `owner`'s, recorded under `pid` (the process that
/// asks, until the job it starts takes the record over with `Ledger::adopt`). Limits apply
/// unless the owner is root.
/// `still_wanted`: polled while the request waits in the queue (`gpupin serve`: whether
/// the caller's connection is still open).
pub(crate) fn allocate(
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
/// holding it is kept from (`ContainerEdits::withheld`), every other GPU's and every other
/// MIG instance's capability nodes, as the rules the job's cgroup gets.
pub(crate) fn denied_nodes(inventory: &Inventory, record: &Record) -> DeviceRules {
    let withheld = ContainerEdits::gpus_of(inventory, record).withheld;
    let is_cap = |n: &&DeviceNode| n.path.starts_with(CAPS_DIR);
    let gpus = withheld
        .iter()
        .filter(|n| !is_cap(n) && n.major == inventory.gpu_major)
        .map(|n| n.minor);
    let rules = DeviceRules::deny(inventory.gpu_major, gpus);
    match inventory.caps_major {
        Some(major) => rules.with_caps(
            major,
            withheld
                .iter()
                .filter(|n| is_cap(n) && n.major == major)
                .map(|n| n.minor),
        ),
        None => rules,
    }
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
        None => HolderId::new(&format!("{}{asker}", crate::model::holder::EXEC_PREFIX))?,
    };
    Ok((request, holder))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU minors of `denied_nodes`.
    fn denied_minors(inventory: &Inventory, record: &Record) -> Vec<u32> {
        denied_nodes(inventory, record).denied_minors
    }

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

    /// A job on a MIG instance keeps its GPU's node and its own capability nodes; every
    /// other GPU and every other instance's capability nodes are denied, each under its
    /// own major, so a capability minor never denies a GPU minor of the same number.
    #[test]
    fn a_job_on_a_mig_instance_is_denied_the_other_instances() {
        let inv = crate::host::inventory::sim::machine("nvswitch8mig").unwrap();
        let own = inv.find_mig("0:0").unwrap();
        let record = crate::state::ledger::testing::record("j1", &[own.uuid.as_str()]);
        let rules = denied_nodes(&inv, &record);
        assert_eq!(rules.denied_minors, [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(rules.caps_major, 511);
        let own_caps = own.cap_paths().unwrap();
        assert_eq!(own_caps[0], "/dev/nvidia-caps/nvidia-cap66");
        assert!(!rules.denied_caps.contains(&66) && !rules.denied_caps.contains(&67));
        // 13 other instances, two nodes each.
        assert_eq!(rules.denied_caps.len(), 26, "{:?}", rules.denied_caps);
        let other = inv.find_mig("1:6").unwrap().access.unwrap();
        assert!(rules.denied_caps.contains(&other.ci_minor));
    }
}
