//! `node_access = "acl"`: the named-user entries of every GPU node's ACL follow the
//! ledger. Not a grant at allocation and a revoke at release, which a kill -9, a crashed
//! daemon or a reboot would leave half done, but a reconcile after every change, under
//! the ledger's lock: each GPU node and MIG capability node gets exactly the owners of the
//! live holders on it whose processes run on the host. A release, a reap after kill -9
//! (gc, the next allocation) and `gpupin serve`'s start all converge on it.
//!
//! Whose entries: jobs (`gpupin exec`) and holds for a process (`gpupin hold --pid`,
//! Python's `acquire`). Not containers, which get their nodes inside their own /dev from
//! the spec, and not holds without a process: nothing of theirs runs on the host, and
//! a job within one gets an entry of its own. Not root, who needs none.

use crate::host::inventory;
use crate::host::node_acl::{self, NodeAclError, NodeUsers};
use crate::input::config::{Config, InventorySettings};
use crate::model::gpu::Inventory;
use crate::model::holder::HolderKind;
use crate::state::ledger::{ChangeObserver, Ledger, LedgerError, Record};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum NodeAccessError {
    #[error("loading the inventory for node ACLs")]
    Inventory(#[source] inventory::InventoryError),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

/// Whether `record`'s owner runs processes on the host that open its GPUs' nodes.
fn on_host(record: &Record) -> bool {
    match record.kind {
        HolderKind::Exec => true,
        HolderKind::Hold => record.pid.is_some(),
        HolderKind::Container => false,
    }
}

/// Every GPU node and MIG capability node of `inventory`, under `node_dir`, each with the
/// uids that should have entries on it: the owners (root aside) of `records` that are
/// `live` and `on_host`. Pure: records and inventory in, the ACLs wanted out.
pub(crate) fn wanted(
    inventory: &Inventory,
    records: &[Record],
    live: impl Fn(&Record) -> bool,
    node_dir: &Path,
) -> Vec<NodeUsers> {
    let mut nodes: BTreeMap<String, NodeUsers> = BTreeMap::new();
    let managed = inventory.gpus.iter().map(|g| inventory.gpu_node(g)).chain(
        inventory
            .mig_instances()
            .flat_map(|m| inventory.mig_cap_nodes(m)),
    );
    for node in managed {
        nodes.entry(node.path.clone()).or_insert_with(|| NodeUsers {
            path: host_path(node_dir, &node.path),
            major: node.major,
            minor: node.minor,
            uids: BTreeSet::new(),
        });
    }
    for record in records.iter().filter(|r| on_host(r) && live(r)) {
        let Some(uid) = record.owner.as_ref().map(|o| o.uid).filter(|&u| u != 0) else {
            continue;
        };
        // The control nodes (nvidiactl, uvm) are no one's: they are not in `nodes`.
        for node in inventory.nodes_for(&record.gpus) {
            if let Some(wanted) = nodes.get_mut(&node.path) {
                wanted.uids.insert(uid);
            }
        }
    }
    nodes.into_values().collect()
}

/// `/dev/nvidia3` under `node_dir`.
fn host_path(node_dir: &Path, dev_path: &str) -> PathBuf {
    node_dir.join(dev_path.strip_prefix("/dev/").unwrap_or(dev_path))
}

/// What a reconcile did: nodes rewritten, and the nodes it could not set (each error
/// names its node); the others were set all the same.
#[derive(Debug, Default)]
pub(crate) struct Reconciled {
    pub rewritten: Vec<PathBuf>,
    pub failed: Vec<NodeAclError>,
}

/// Brings every GPU node's ACL in line with `ledger` now. The caller holds the ledger's
/// lock (an observer's call), or accepts that a change meanwhile reconciles again.
pub(crate) fn reconcile(sync: &AclSync, ledger: &Ledger) -> Result<Reconciled, NodeAccessError> {
    let inventory = sync.inventory.load().map_err(NodeAccessError::Inventory)?;
    let records = ledger.records()?;
    let stale = ledger.stale_ids(&records);
    let mut done = Reconciled::default();
    for node in wanted(
        &inventory,
        &records,
        |r| !stale.contains(r.id.as_str()),
        &sync.node_dir,
    ) {
        match node_acl::set_users(&node) {
            Ok(true) => done.rewritten.push(node.path),
            Ok(false) => {}
            Err(err) => done.failed.push(err),
        }
    }
    Ok(done)
}

/// The ledger's observer under `node_access = "acl"`, and what it reads besides the
/// ledger: the inventory, and where the GPU nodes are.
#[derive(Debug, Clone)]
pub(crate) struct AclSync {
    pub inventory: InventorySettings,
    /// The directory the GPU nodes are in (`node_dir`).
    pub node_dir: PathBuf,
}

impl AclSync {
    /// The observer `config` names.
    pub(crate) fn new(config: &Config) -> AclSync {
        AclSync {
            inventory: config.inventory_settings(),
            node_dir: config.node_dir.clone(),
        }
    }
}

impl ChangeObserver for AclSync {
    /// Best effort, as the metrics file: a node that cannot be set must not undo the
    /// change (the release stands); it is a warning, and `gpupin doctor` shows the nodes.
    fn changed(&self, ledger: &Ledger) {
        match reconcile(self, ledger) {
            Ok(done) => {
                for err in &done.failed {
                    let error = crate::base::message::one_line(err);
                    tracing::warn!(error, "could not set a GPU node's ACL");
                }
                if !done.rewritten.is_empty() {
                    tracing::debug!(nodes = ?done.rewritten, "GPU node ACLs rewritten");
                }
            }
            Err(err) => {
                let error = crate::base::message::one_line(&err);
                tracing::warn!(error, "could not bring the GPU nodes' ACLs in line");
            }
        }
    }
}

#[cfg(test)]
mod tests;
