//! Policies over live figures: `least-loaded` and `most-free`.
//!
//! Both read `PolicyInput::live`. Without it (no live source configured, or figures that
//! do not cover every GPU) they behave exactly like `pack`: a request must not fail just
//! because NVML is missing, and `pack` is the most predictable fallback.

use super::pack::Pack;
use super::{Live, Policy, PolicyInput};
use std::cmp::{Ordering, Reverse};

/// Lowest utilization first, GPUs whose utilization the source does not tell (NVML on a
/// GPU in MIG mode) after every known one, then most free memory, then lowest position.
pub(crate) struct LeastLoaded;

/// Most free memory first, then lowest position.
pub(crate) struct MostFree;

impl Policy for LeastLoaded {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        best_by(input, |a, b| {
            let key = |l: &Live| {
                (
                    l.utilization.is_none(),
                    l.utilization,
                    Reverse(l.memory_free),
                )
            };
            key(a).cmp(&key(b))
        })
    }
}

impl Policy for MostFree {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        best_by(input, |a, b| b.memory_free.cmp(&a.memory_free))
    }
}

/// The first `count` free positions in `order`, ties by position; `pack` without live figures.
fn best_by(input: &PolicyInput, order: impl Fn(&Live, &Live) -> Ordering) -> Option<Vec<usize>> {
    let Some(live) = input.live.filter(|l| l.len() == input.free.len()) else {
        return Pack.choose(input);
    };
    let mut free: Vec<usize> = input.free_positions().collect();
    if free.len() < input.count {
        return None;
    }
    // Stable sort over ascending positions: equal figures keep the lowest position first.
    free.sort_by(|&a, &b| order(&live[a], &live[b]));
    free.truncate(input.count);
    Some(free)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    const GIB: u64 = 1 << 30;

    fn live(figures: &[(u32, u64)]) -> Vec<Live> {
        figures
            .iter()
            .map(|&(utilization, gib)| Live {
                utilization: Some(utilization),
                memory_free: gib * GIB,
                ..Live::default()
            })
            .collect()
    }

    fn choose(
        policy: &dyn Policy,
        free: &[bool],
        count: usize,
        live: Option<&[Live]>,
    ) -> Option<Vec<usize>> {
        let inv = machine(free.len() as u32);
        policy.choose(&PolicyInput {
            inventory: &inv,
            free,
            count,
            cursor: 0,
            live,
        })
    }

    #[test]
    fn least_loaded_takes_lowest_utilization_then_most_memory() {
        let l = live(&[(90, 70), (10, 20), (10, 60), (0, 5), (50, 80)]);
        let free = [true; 5];
        assert_eq!(
            choose(&LeastLoaded, &free, 3, Some(&l)),
            Some(vec![3, 2, 1])
        );
    }

    #[test]
    fn least_loaded_ties_go_to_the_lowest_position() {
        let l = live(&[(5, 40), (5, 40), (5, 40)]);
        assert_eq!(
            choose(&LeastLoaded, &[true; 3], 2, Some(&l)),
            Some(vec![0, 1])
        );
    }

    #[test]
    fn least_loaded_skips_held_gpus() {
        let l = live(&[(0, 80), (30, 80), (20, 80), (99, 80)]);
        let free = [false, true, true, true];
        assert_eq!(choose(&LeastLoaded, &free, 2, Some(&l)), Some(vec![2, 1]));
    }

    #[test]
    fn least_loaded_takes_unknown_utilization_after_every_known_one() {
        let mut l = live(&[(0, 80), (90, 10), (0, 80), (20, 5)]);
        // GPUs 0 and 2 in MIG mode: NVML does not tell their utilization.
        l[0].utilization = None;
        l[2].utilization = None;
        assert_eq!(
            choose(&LeastLoaded, &[true; 4], 3, Some(&l)),
            Some(vec![3, 1, 0])
        );
    }

    #[test]
    fn most_free_takes_most_memory_then_lowest_position() {
        let l = live(&[(0, 10), (99, 70), (50, 30), (0, 70)]);
        assert_eq!(
            choose(&MostFree, &[true; 4], 3, Some(&l)),
            Some(vec![1, 3, 2])
        );
        let free = [true, false, true, true];
        assert_eq!(choose(&MostFree, &free, 1, Some(&l)), Some(vec![3]));
    }

    #[test]
    fn without_live_figures_both_behave_like_pack() {
        let free = [false, true, true, true];
        let short = live(&[(0, 80)]);
        for policy in [&LeastLoaded as &dyn Policy, &MostFree] {
            assert_eq!(choose(policy, &free, 2, None), Some(vec![1, 2]));
            assert_eq!(choose(policy, &free, 2, Some(&short)), Some(vec![1, 2]));
        }
    }

    #[test]
    fn too_few_free_is_none() {
        let l = live(&[(0, 1), (0, 1)]);
        assert_eq!(choose(&MostFree, &[true, false], 2, Some(&l)), None);
        assert_eq!(choose(&LeastLoaded, &[true, false], 2, Some(&l)), None);
    }
}
