//! What the plugin advertises: every GPU by UUID, Healthy unless a holder outside
//! Kubernetes (a Docker or podman container, an exec'd job, a hold, a Slurm job) has it,
//! so that the node's allocatable count drops by the GPUs others took and the scheduler
//! sends no pod for them. GPUs held by the plugin's own holders stay Healthy: the kubelet
//! counts them as allocated already.

use super::{KubeError, inside_kubernetes};
use crate::model::fence::Fences;
use crate::model::gpu::Inventory;
use crate::state::ledger::{Record, holders_of};

/// One GPU as the kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    pub uuid: String,
    pub healthy: bool,
    pub numa_node: Option<u32>,
}

/// How MIG instances are advertised, as NVIDIA's device plugin names its strategies:
/// `none` (whole GPUs only; a GPU in MIG mode is not advertised), `single` (every GPU in
/// MIG mode with one profile: the instances under the one resource), `mixed` (whole GPUs
/// under the resource, each profile's instances under `<domain>/mig-<profile>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigStrategy {
    #[default]
    None,
    Single,
    Mixed,
}

/// What one resource advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unit {
    /// Whole GPUs, not in MIG mode.
    Whole,
    /// Every MIG instance (`single`).
    AllInstances,
    /// The instances of one profile (`mixed`).
    Profile(String),
}

/// One resource the plugin registers: its name and what it advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub name: String,
    pub unit: Unit,
}

/// The resources for `strategy` on `inventory`, `base` (`nvidia.com/gpu`) first.
pub fn resources(
    inventory: &Inventory,
    strategy: MigStrategy,
    base: &str,
) -> Result<Vec<Resource>, KubeError> {
    let whole = Resource {
        name: base.to_string(),
        unit: Unit::Whole,
    };
    match strategy {
        MigStrategy::None => Ok(vec![whole]),
        MigStrategy::Single => {
            let single = |reason: String| KubeError::MigSingle { reason };
            if let Some(g) = inventory.gpus.iter().find(|g| !g.in_mig_mode()) {
                return Err(single(format!("GPU {} is not in MIG mode", g.index)));
            }
            let mut profiles: Vec<&str> = inventory
                .mig_instances()
                .map(|m| m.profile_name())
                .collect();
            profiles.sort_unstable();
            profiles.dedup();
            if profiles.len() != 1 {
                return Err(single(format!(
                    "expected every instance of one profile, found {}",
                    match profiles.is_empty() {
                        true => "none".to_string(),
                        false => profiles.join(", "),
                    }
                )));
            }
            Ok(vec![Resource {
                name: base.to_string(),
                unit: Unit::AllInstances,
            }])
        }
        MigStrategy::Mixed => {
            let domain = base.split_once('/').map_or(base, |(d, _)| d);
            let mut profiles: Vec<&str> = inventory
                .mig_instances()
                .filter_map(|m| m.profile.as_deref())
                .collect();
            profiles.sort_unstable();
            profiles.dedup();
            let mut list = vec![whole];
            list.extend(profiles.into_iter().map(|p| Resource {
                name: format!("{domain}/mig-{p}"),
                unit: Unit::Profile(p.to_string()),
            }));
            Ok(list)
        }
    }
}

/// The devices of one resource, in inventory order: an instance's NUMA node is its GPU's.
/// Unhealthy: held outside Kubernetes, or out of allocation (`fences`: drained, or its
/// health took it out), a MIG instance where its GPU is or its health took it out alone.
pub fn states_of(
    inventory: &Inventory,
    live: &[Record],
    fences: &Fences,
    unit: &Unit,
) -> Vec<DeviceState> {
    let state = |uuid: &str, numa_node: Option<u32>| DeviceState {
        uuid: uuid.to_string(),
        healthy: !held_outside(uuid, live),
        numa_node,
    };
    let mut out = Vec::new();
    for g in &inventory.gpus {
        let fenced = fences.of(&g.uuid).is_some();
        if *unit == Unit::Whole && !g.in_mig_mode() {
            let mut s = state(&g.uuid, g.numa_node);
            s.healthy &= !fenced;
            out.push(s);
        }
        for m in g.mig_instances().iter().filter(|m| match unit {
            Unit::Whole => false,
            Unit::AllInstances => true,
            Unit::Profile(p) => m.profile.as_deref() == Some(p.as_str()),
        }) {
            // A GPU held whole (from before its geometry) keeps its instances from pods.
            let mut s = state(&m.uuid, g.numa_node);
            s.healthy &= !held_outside(&g.uuid, live) && fences.of_instance(m).is_none();
            out.push(s);
        }
    }
    out
}

/// Whether a holder outside Kubernetes holds GPU `uuid`.
pub(crate) fn held_outside(uuid: &str, live: &[Record]) -> bool {
    holders_of(uuid, live).any(|r| !inside_kubernetes(r, live))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::kube::testing::{nested, record};
    use crate::policy::testing::machine;

    /// Every whole GPU of `inventory` (none in MIG mode), in its order, given the `live`
    /// (not stale) records.
    fn states(inventory: &Inventory, live: &[Record]) -> Vec<DeviceState> {
        states_of(inventory, live, &Fences::default(), &Unit::Whole)
    }

    fn health(live: &[Record]) -> Vec<bool> {
        states(&machine(4), live)
            .iter()
            .map(|d| d.healthy)
            .collect()
    }

    /// A drained GPU (or one its health took out) is unhealthy to the kubelet, and so
    /// is every MIG instance of it; an instance its health took out alone is, and its
    /// GPU's other instances are not.
    #[test]
    fn a_gpu_out_of_allocation_is_unhealthy_with_its_instances() {
        use crate::model::fence::{FenceState, FenceTarget};
        let inv = machine(4);
        let mut fences = Fences::default();
        fences.set(FenceTarget::from(&inv.gpus[2]).fence(FenceState::Drained, "fan", "root", 1));
        let health: Vec<bool> = states_of(&inv, &[], &fences, &Unit::Whole)
            .iter()
            .map(|d| d.healthy)
            .collect();
        assert_eq!(health, [true, true, false, true]);
        let mig = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let parent = mig.gpus.iter().find(|g| g.in_mig_mode()).unwrap();
        let mut fences = Fences::default();
        fences.set(FenceTarget::from(parent).fence(
            FenceState::NeedsReset,
            "XID 79",
            "gpupin serve",
            u64::MAX,
        ));
        let instances = states_of(&mig, &[], &fences, &Unit::AllInstances);
        for d in &instances {
            let of_parent = parent.mig_instances().iter().any(|m| m.uuid == d.uuid);
            assert_eq!(d.healthy, !of_parent, "{}", d.uuid);
        }
        let alone = &parent.mig_instances()[1];
        let mut fences = Fences::default();
        fences.set(FenceTarget::from(alone).fence(
            FenceState::NeedsReset,
            "XID 48",
            "gpupin serve",
            u64::MAX,
        ));
        let instances = states_of(&mig, &[], &fences, &Unit::AllInstances);
        let unhealthy: Vec<&str> = instances
            .iter()
            .filter(|d| !d.healthy)
            .map(|d| d.uuid.as_str())
            .collect();
        assert_eq!(unhealthy, [alone.uuid.as_str()]);
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
    fn strategies_advertise_instances_under_their_resources() {
        let inv = crate::host::inventory::sim::machine("dgxa100mig").unwrap();
        let none = resources(&inv, MigStrategy::None, "nvidia.com/gpu").unwrap();
        assert_eq!(none.len(), 1);
        // GPUs 0 and 7 are in MIG mode: not advertised whole.
        assert_eq!(
            states_of(&inv, &[], &Fences::default(), &none[0].unit).len(),
            6
        );
        let mixed = resources(&inv, MigStrategy::Mixed, "nvidia.com/gpu").unwrap();
        let names: Vec<&str> = mixed.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb",
                "nvidia.com/mig-2g.20gb",
                "nvidia.com/mig-3g.40gb"
            ]
        );
        let small = states_of(&inv, &[], &Fences::default(), &mixed[1].unit);
        let want: Vec<String> = ["0:2", "0:3"]
            .iter()
            .map(|a| inv.find_mig(a).unwrap().uuid.clone())
            .collect();
        assert_eq!(
            small.iter().map(|d| d.uuid.clone()).collect::<Vec<_>>(),
            want
        );
        // An instance a container outside Kubernetes has is unhealthy.
        let live = [record("docker-c1", &[want[1].as_str()])];
        let health: Vec<bool> = states_of(&inv, &live, &Fences::default(), &mixed[1].unit)
            .iter()
            .map(|d| d.healthy)
            .collect();
        assert_eq!(health, [true, false]);
        let err = resources(&inv, MigStrategy::Single, "nvidia.com/gpu")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--mig-strategy single: GPU 1 is not in MIG mode; use --mig-strategy mixed"
        );
        let mut h100 = crate::host::inventory::sim::machine("nvswitch8mig").unwrap();
        h100.gpus.truncate(2);
        let single = resources(&h100, MigStrategy::Single, "nvidia.com/gpu").unwrap();
        assert_eq!(single[0].unit, Unit::AllInstances);
        assert_eq!(
            states_of(&h100, &[], &Fences::default(), &single[0].unit).len(),
            14
        );
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
