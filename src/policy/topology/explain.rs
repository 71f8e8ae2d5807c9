//! Why the policy chose what it chose: the ranking terms of the chosen set beside those
//! of the runner-up, the best set that differs by more than swapping interchangeable
//! GPUs, and the first term that tells them apart.

use super::problem::Problem;
use super::{EXACT_UP_TO, NODE_BUDGET, Terms, WHOLE_TREE, greedy, search};
use crate::policy::PolicyInput;

/// A set of positions (ascending) with its terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranked {
    pub positions: Vec<usize>,
    pub terms: Terms,
}

/// The ranking terms, in their order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    WorstPath,
    Ring,
    Slowest,
    Total,
    Left,
    /// Every term ties: the lower positions win.
    Position,
}

impl Term {
    /// A name for JSON and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Term::WorstPath => "worst_path",
            Term::Ring => "ring",
            Term::Slowest => "slowest",
            Term::Total => "total",
            Term::Left => "left",
            Term::Position => "position",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub chosen: Ranked,
    /// `None` when no other set can be formed (the request takes every free GPU, or
    /// every other set is the chosen one with interchangeable GPUs swapped).
    pub runner_up: Option<Ranked>,
    /// The first term where the two differ; `None` without a runner-up.
    pub decided_by: Option<Term>,
    /// False when either search ran out of its node budget.
    pub exact: bool,
}

/// The explanation of the topology choice; `None` without link data, for a count of 0,
/// or when too few GPUs are free.
pub(crate) fn explain(input: &PolicyInput) -> Option<Explanation> {
    let p = Problem::new(input.inventory, input.free)?;
    let k = input.count;
    if k == 0 || p.len() < k {
        return None;
    }
    let budget = if p.len() <= EXACT_UP_TO {
        WHOLE_TREE
    } else {
        NODE_BUDGET
    };
    let classes = p.classes();
    let start = greedy::incumbent(&p, &classes, k);
    let first = search::run(
        &p,
        &classes,
        search::Goal {
            k,
            start: Some(start),
            budget,
            exclude: None,
        },
    );
    let (chosen, _) = first.best.expect("the search starts from an answer");
    let take: Vec<usize> = classes
        .members
        .iter()
        .map(|m| m.iter().filter(|a| chosen.contains(a)).count())
        .collect();
    let second = search::run(
        &p,
        &classes,
        search::Goal {
            k,
            start: None,
            budget,
            exclude: Some(&take),
        },
    );
    let ranked = |set: &[usize]| Ranked {
        positions: set.iter().map(|&a| p.positions[a]).collect(),
        terms: p.terms(set),
    };
    let chosen = ranked(&chosen);
    let runner_up = second.best.map(|(set, _)| ranked(&set));
    let decided_by = runner_up
        .as_ref()
        .map(|r| first_difference(&chosen.terms, &r.terms));
    Some(Explanation {
        chosen,
        runner_up,
        decided_by,
        exact: first.exact && second.exact,
    })
}

fn first_difference(a: &Terms, b: &Terms) -> Term {
    if a.worst_path != b.worst_path {
        Term::WorstPath
    } else if a.ring != b.ring {
        Term::Ring
    } else if a.slowest != b.slowest {
        Term::Slowest
    } else if a.total != b.total {
        Term::Total
    } else if a.left != b.left {
        Term::Left
    } else {
        Term::Position
    }
}
