use super::{Policy, PolicyInput};

/// Free positions in rotation order, starting at the cursor (just after the last GPU
/// handed out), so that successive jobs land on successive GPUs instead of always GPU 0.
/// The result is in rotation order: the ledger moves the cursor past its last element.
pub(crate) struct Spread;

impl Policy for Spread {
    fn choose(&self, input: &PolicyInput) -> Option<Vec<usize>> {
        let n = input.free.len();
        if n == 0 {
            return (input.count == 0).then(Vec::new);
        }
        let start = input.cursor % n;
        let chosen: Vec<usize> = (0..n)
            .map(|k| (start + k) % n)
            .filter(|&p| input.free[p])
            .take(input.count)
            .collect();
        if chosen.len() < input.count {
            return None;
        }
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testing::machine;

    #[test]
    fn starts_at_the_cursor_and_wraps() {
        let inv = machine(4);
        let free = [true; 4];
        let input = PolicyInput {
            inventory: &inv,
            free: &free,
            count: 2,
            cursor: 3,
            live: None,
        };
        assert_eq!(Spread.choose(&input), Some(vec![3, 0]));
    }

    #[test]
    fn skips_held_gpus() {
        let inv = machine(4);
        let free = [true, false, false, true];
        let input = PolicyInput {
            inventory: &inv,
            free: &free,
            count: 1,
            cursor: 1,
            live: None,
        };
        assert_eq!(Spread.choose(&input), Some(vec![3]));
    }

    #[test]
    fn too_few_free_is_none() {
        let inv = machine(2);
        let free = [true, false];
        let input = PolicyInput {
            inventory: &inv,
            free: &free,
            count: 2,
            cursor: 0,
            live: None,
        };
        assert_eq!(Spread.choose(&input), None);
    }
}
