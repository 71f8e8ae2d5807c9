//! What the plugin advertises: every GPU by UUID, Healthy unless a holder outside
//! Kubernetes (a Docker or podman container, an exec'd job, a hold, a Slurm job) has it,
//! so that the node's allocatable count drops by the GPUs others took and the scheduler
//! sends no pod for them. GPUs held by the plugin's own holders stay Healthy: the kubelet
//! counts them as allocated already.

use super::inside_kubernetes;
use crate::host::inventory::Inventory;
use crate::state::ledger::{Record, holders_of};

/// One GPU as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    pub uuid: String,
    pub healthy: bool,
    pub numa_node: Option<u32>,
}

/// Every GPU of `inventory`, in its order, given the `live` (not stale) records.
pub fn states(inventory: &Inventory, live: &[Record]) -> Vec<DeviceState> {
    inventory
        .gpus
        .iter()
        .map(|g| DeviceState {
            uuid: g.uuid.clone(),
            healthy: !held_outside(&g.uuid, live),
            numa_node: g.numa_node,
        })
        .collect()
}

/// Whether a holder outside Kubernetes holds GPU `uuid`.
pub fn held_outside(uuid: &str, live: &[Record]) -> bool {
    holders_of(uuid, live).any(|r| !inside_kubernetes(r, live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::kube::testing::{nested, record};
    use crate::policy::testing::machine;

    fn health(live: &[Record]) -> Vec<bool> {
        states(&machine(4), live)
            .iter()
            .map(|d| d.healthy)
            .collect()
    }

    #[test]
    fn gpus_of_holders_outside_kubernetes_are_unhealthy() {
        assert_eq!(health(&[]), [true; 4]);
        let live = [
            record("docker-c1", &["GPU-test-1"]),
            record("k8s-a", &["GPU-test-2"]),
            nested("pod-c", &["GPU-test-2"], "k8s-a"),
            record("slurm-7", &["GPU-test-3"]),
        ];
        assert_eq!(health(&live), [true, false, true, false]);
    }

    #[test]
    fn devices_are_named_by_uuid_in_inventory_order() {
        let uuids: Vec<String> = states(&machine(3), &[])
            .into_iter()
            .map(|d| d.uuid)
            .collect();
        assert_eq!(uuids, ["GPU-test-0", "GPU-test-1", "GPU-test-2"]);
    }
}
