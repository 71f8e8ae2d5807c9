use super::{Policy, PolicyInput};

/// Lowest free positions first.
pub(crate) struct Pack;

impl Policy for Pack {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        let chosen: Vec<usize> = input.free_positions().take(input.count).collect();
        (chosen.len() == input.count).then_some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    #[test]
    fn takes_the_lowest_free() {
        let inv = machine(4);
        let free = [false, true, true, true];
        let input = PolicyInput {
            inventory: &inv,
            free: &free,
            count: 2,
            cursor: 3,
            live: None,
        };
        assert_eq!(Pack.choose(&input), Some(vec![1, 2]));
    }

    #[test]
    fn too_few_free_is_none() {
        let inv = machine(4);
        let free = [false, true, false, false];
        let input = PolicyInput {
            inventory: &inv,
            free: &free,
            count: 2,
            cursor: 0,
            live: None,
        };
        assert_eq!(Pack.choose(&input), None);
    }
}
