//! `gpupin pick --explain`: the ranking terms of the chosen GPUs beside those of the
//! runner-up, as a table for people and as JSON for scripts.

use crate::input::config::PolicyName;
use crate::input::request::{GpuRequest, Selection};
use crate::model::gpu::Inventory;
use crate::policy::PolicyInput;
use crate::policy::topology::{self, Explanation, Path, Ranked, Term, Terms};
use serde_json::{Value, json};

/// Why the request gets what it gets: the topology ranking, or why there is none.
pub enum Why {
    Ranked(Explanation),
    Unranked(String),
}

pub fn why(request: &GpuRequest, policy: PolicyName, inventory: &Inventory, free: &[bool]) -> Why {
    let Selection::Count(count) = request.selection else {
        return Why::Unranked("the GPUs were named, not counted: nothing was ranked".into());
    };
    if policy != PolicyName::Topology {
        return Why::Unranked(format!(
            "{policy} ranks GPUs one by one, not sets: only topology has terms to show"
        ));
    }
    let input = PolicyInput {
        inventory,
        free,
        count: count as usize,
        cursor: 0,
        live: None,
    };
    match topology::explain(&input) {
        Some(e) => Why::Ranked(e),
        None if inventory.links.is_none() => Why::Unranked(
            "the inventory has no link data: topology takes the lowest free indices, like pack"
                .into(),
        ),
        None => Why::Unranked("no set to rank".into()),
    }
}

const TERMS: [(Term, &str); 5] = [
    (Term::WorstPath, "worst PCIe path"),
    (Term::Ring, "ring bottleneck"),
    (Term::Slowest, "slowest pair"),
    (Term::Total, "total, all pairs"),
    (Term::Left, "to free GPUs (less wins)"),
];

/// The table under `gpupin pick`'s answer; at most 80 columns.
pub fn table(why: &Why, inventory: &Inventory) -> String {
    let e = match why {
        Why::Ranked(e) => e,
        Why::Unranked(reason) => return format!("Why: {reason}.\n"),
    };
    let pairs = e.chosen.positions.len() >= 2;
    let mut out = String::from(
        "Why, term by term (bandwidth per direction; each term counts only where\nthe ones above it tie):\n",
    );
    out += &format!("  chosen:    {}\n", indices(inventory, &e.chosen));
    match &e.runner_up {
        Some(r) => out += &format!("  runner-up: {}\n", indices(inventory, r)),
        None => out += "  runner-up: none (no other set but by swapping identically linked GPUs)\n",
    }
    out += &format!("  {:<26}{:<18}{}\n", "term", "chosen", "runner-up");
    for (term, label) in TERMS {
        // A single GPU has no pairs: their terms would be rows of dashes.
        if !pairs && term != Term::Left {
            continue;
        }
        let chosen = cell(term, &e.chosen.terms, pairs);
        let runner = e
            .runner_up
            .as_ref()
            .map_or(String::new(), |r| cell(term, &r.terms, pairs));
        let mark = if e.decided_by == Some(term) {
            "<- decides"
        } else {
            ""
        };
        out += format!("  {label:<26}{chosen:<18}{runner:<18}{mark}").trim_end();
        out += "\n";
    }
    if !pairs {
        out += "  (one GPU has no pairs: it is chosen for what it leaves the free GPUs)\n";
    }
    if e.decided_by == Some(Term::Position) {
        out += "  every term ties: the lower indices win\n";
    }
    if !e.exact {
        out += "  (the search ran out of its node budget: best found, not proven best)\n";
    }
    out
}

pub fn json(why: &Why, inventory: &Inventory) -> Value {
    match why {
        Why::Unranked(reason) => json!({ "note": reason }),
        Why::Ranked(e) => json!({
            "chosen": ranked_json(&e.chosen, inventory),
            "runner_up": e.runner_up.as_ref().map(|r| ranked_json(r, inventory)),
            "decided_by": e.decided_by.map(Term::as_str),
            "exact": e.exact,
        }),
    }
}

fn ranked_json(r: &Ranked, inventory: &Inventory) -> Value {
    let gpus: Vec<u32> = r
        .positions
        .iter()
        .map(|&p| inventory.gpus[p].index)
        .collect();
    json!({
        "gpus": gpus,
        "worst_path": r.terms.worst_path.as_str(),
        "ring_mb_s": r.terms.ring,
        "slowest_mb_s": r.terms.slowest,
        "total_mb_s": r.terms.total,
        "left_mb_s": r.terms.left,
    })
}

fn indices(inventory: &Inventory, r: &Ranked) -> String {
    let list: Vec<String> = r
        .positions
        .iter()
        .map(|&p| inventory.gpus[p].index.to_string())
        .collect();
    let s = if list.len() == 1 { "" } else { "s" };
    format!("GPU{s} {}", list.join(","))
}

/// One GPU has no pairs: its pair terms are shown as `-`.
fn cell(term: Term, t: &Terms, pairs: bool) -> String {
    match term {
        Term::WorstPath | Term::Ring | Term::Slowest | Term::Total if !pairs => "-".into(),
        Term::WorstPath if t.worst_path == Path::NvLink => "none (NVLink)".into(),
        Term::WorstPath => t.worst_path.as_str().into(),
        Term::Ring => gbs(t.ring),
        Term::Slowest => gbs(t.slowest),
        Term::Total => gbs(t.total),
        Term::Left | Term::Position => gbs(t.left),
    }
}

/// MB/s as GB/s with one decimal.
fn gbs(mb: u64) -> String {
    format!("{}.{} GB/s", mb / 1000, mb % 1000 / 100)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_reads_in_gb_per_second_with_one_decimal() {
        assert_eq!(gbs(25_000), "25.0 GB/s");
        assert_eq!(gbs(12_345), "12.3 GB/s");
        assert_eq!(gbs(999), "0.9 GB/s");
    }

    #[test]
    fn nothing_ranked_is_one_sentence_and_a_note() {
        let inventory = crate::policy::testing::machine(2);
        let why = Why::Unranked("no set to rank".into());
        assert_eq!(table(&why, &inventory), "Why: no set to rank.\n");
        assert_eq!(json(&why, &inventory), json!({"note": "no set to rank"}));
    }
}
