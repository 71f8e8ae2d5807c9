//! `GetPreferredAllocation`: gpupin's policy (config `policy`, topology by default) over
//! the devices the kubelet may give a container, with the ones it must include, as many
//! as it asks. On the same machine and ledger, a container that may have any free GPU
//! gets what `gpupin pick --count N` shows.
//!
//! The kubelet's candidates are narrowed to the GPUs no holder outside Kubernetes has
//! (its view can be a second old); holders of the plugin's own do not count, since the
//! kubelet offers their GPUs only once it has taken them back from their pods (the
//! reconcile has not released them yet). Where too few remain, the answer holds what
//! there is: the kubelet adds the rest from its candidates, and `Allocate` then says
//! which GPU is taken by whom.

use super::devices::held_outside;
use crate::policy::{PolicyInput, choose_including};
use crate::state::ledger::{Machine, Record};

/// One container's request, as the kubelet sends it.
pub struct Ask<'a> {
    pub available: &'a [String],
    pub must_include: &'a [String],
    pub size: usize,
}

/// The preferred device ids (UUIDs) in inventory order, chosen on `machine` (the same as
/// an allocation's: the inventory, its live figures, the policy) by the ledger's
/// holders that are not stale (`live`) and its rotation cursor (`spread`). Ids the
/// inventory does not know are left out.
pub fn preferred(machine: &Machine, live: &[Record], cursor: usize, ask: &Ask) -> Vec<String> {
    let gpus = &machine.inventory.gpus;
    let listed = |ids: &[String], p: usize| ids.iter().any(|id| id == &gpus[p].uuid);
    let fixed: Vec<usize> = (0..gpus.len())
        .filter(|&p| listed(ask.must_include, p))
        .collect();
    let free: Vec<bool> = (0..gpus.len())
        .map(|p| listed(ask.available, p) && !held_outside(&gpus[p].uuid, live))
        .collect();
    let usable = free
        .iter()
        .enumerate()
        .filter(|(p, f)| **f || fixed.contains(p))
        .count();
    let input = PolicyInput {
        inventory: machine.inventory,
        free: &free,
        count: ask.size.min(usable).max(fixed.len()),
        cursor,
        live: machine.live,
    };
    let chosen = choose_including(machine.default_policy.policy(), &input, &fixed).unwrap_or(fixed);
    chosen.into_iter().map(|p| gpus[p].uuid.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::config::PolicyName;
    use crate::jobs::kube::testing::record;
    use crate::model::gpu::Inventory;
    use crate::policy::testing::sim;

    fn uuids(inv: &Inventory, indices: &[usize]) -> Vec<String> {
        indices.iter().map(|&i| inv.gpus[i].uuid.clone()).collect()
    }

    fn ask(
        inv: &Inventory,
        live: &[Record],
        available: &[usize],
        must: &[usize],
        size: usize,
    ) -> Vec<String> {
        let machine = Machine::new(inv, PolicyName::Topology);
        let (available, must_include) = (uuids(inv, available), uuids(inv, must));
        preferred(
            &machine,
            live,
            0,
            &Ask {
                available: &available,
                must_include: &must_include,
                size,
            },
        )
    }

    #[test]
    fn topology_over_every_gpu_picks_the_best_linked_pair() {
        let inv = sim("cubemesh8");
        let all: Vec<usize> = (0..8).collect();
        let got = ask(&inv, &[], &all, &[], 2);
        let policy = PolicyName::Topology.policy();
        let free = [true; 8];
        let want = policy
            .choose(&PolicyInput {
                inventory: &inv,
                free: &free,
                count: 2,
                cursor: 0,
                live: None,
            })
            .unwrap();
        assert_eq!(got, uuids(&inv, &want));
    }

    #[test]
    fn only_the_kubelets_candidates_are_chosen() {
        let inv = sim("cubemesh8");
        assert_eq!(ask(&inv, &[], &[1, 4, 5, 6], &[], 2), uuids(&inv, &[1, 5]));
    }

    #[test]
    fn must_include_is_kept_and_completed_by_topology() {
        let inv = sim("cubemesh8");
        let all: Vec<usize> = (0..8).collect();
        assert_eq!(ask(&inv, &[], &all, &[6], 4), uuids(&inv, &[4, 5, 6, 7]));
    }

    #[test]
    fn gpus_held_outside_kubernetes_are_not_preferred_even_if_offered() {
        let inv = sim("nvswitch8");
        let held = [
            record("docker-1", &[&inv.gpus[0].uuid]),
            record("k8s-x", &[&inv.gpus[1].uuid]),
        ];
        let all: Vec<usize> = (0..8).collect();
        // GPU 1's plugin holder does not count: the kubelet offers it, so it took it back.
        assert_eq!(ask(&inv, &held, &all, &[], 2), uuids(&inv, &[1, 2]));
    }

    #[test]
    fn too_few_candidates_give_what_there_is() {
        let inv = sim("nvswitch8");
        assert_eq!(ask(&inv, &[], &[3, 5], &[], 4), uuids(&inv, &[3, 5]));
        let unknown = Machine::new(&inv, PolicyName::Pack);
        let ids = vec!["GPU-nope".to_string()];
        assert!(
            preferred(
                &unknown,
                &[],
                0,
                &Ask {
                    available: &ids,
                    must_include: &[],
                    size: 1
                }
            )
            .is_empty()
        );
    }
}
