//! The plumbing of the side-by-side with NVIDIA's go-gpuallocator (benches/policy.rs,
//! benches/policy/gpuallocator.rs): gpupin's inventory files reach the peer built by
//! tests/peers/build, its answers come back checked and compared by gpupin's ranking,
//! and a case past the time limit is reported as timed out. No figure is asserted: the
//! timings are the bench's business. Needs the peer; elsewhere the tests say why they
//! skip (under CI=true they fail instead).

#[path = "../benches/policy/gpuallocator.rs"]
mod gpuallocator;

use gpuallocator::{Answer, Case, Worth};
use gpupin::parts::{Inventory, InventorySource, NvmlAccess, from_json, load_inventory};
use gpupin_sandbox::harness::required;
use std::path::Path;
use std::time::Duration;

fn sim(name: &str) -> Inventory {
    load_inventory(
        &InventorySource::Sim(name.into()),
        Path::new("/nonexistent"),
        &NvmlAccess::InProcess,
    )
    .unwrap()
}

#[test]
fn both_policies_answer_the_same_requests_and_the_table_says_so() {
    let test = "both_policies_answer_the_same_requests_and_the_table_says_so";
    let Some(peer) = required(test, gpuallocator::peer()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (pcie8, cubemesh8) = (sim("pcie8"), sim("cubemesh8"));
    let mut held_some = vec![true; 8];
    held_some[0] = false;
    held_some[5] = false;
    let cases = [
        Case {
            machine: "pcie8",
            inventory: &pcie8,
            free: vec![true; 8],
            count: 2,
        },
        Case {
            machine: "cubemesh8",
            inventory: &cubemesh8,
            free: held_some,
            count: 3,
        },
    ];
    let mut seen = 0;
    let answers = gpuallocator::run(&peer, dir.path(), &cases, gpuallocator::TIMEOUT, |_, _| {
        seen += 1
    })
    .unwrap();
    assert_eq!(seen, 2, "one progress call per answer");
    let mut rows = Vec::new();
    for (case, answer) in cases.iter().zip(&answers) {
        let Answer::Chosen { chosen, .. } = answer else {
            panic!("{} count {}: {answer:?}", case.machine, case.count);
        };
        // run() has checked the set: `count` distinct GPUs, all of them free.
        assert_eq!(chosen.len(), case.count);
        assert!(chosen.iter().all(|&p| case.free[p]), "{chosen:?}");
        rows.push(gpuallocator::row(case, Some(1000.0), answer));
    }
    // The file the peer read is gpupin's own format, whole.
    let written = std::fs::read_to_string(dir.path().join("cubemesh8.json")).unwrap();
    let back = from_json(&written, Path::new("cubemesh8.json")).unwrap();
    assert_eq!(back.links, cubemesh8.links);

    let table = gpuallocator::table(&rows);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "{table}");
    for line in &lines {
        assert_eq!(line.matches('|').count(), 10, "{line}");
    }
    assert!(
        lines[3].starts_with("| cubemesh8 | 3 | 0,5 | 1.0 µs | "),
        "{table}"
    );
    let worth = rows[1].worth.as_ref().unwrap().to_string();
    assert!(lines[3].ends_with(&format!(" | {worth} |")), "{table}");
}

#[test]
fn worth_is_gpupin_ranking_of_each_set() {
    // No peer needed: two sets of pcie8 (PIX pairs 0-1, 2-3, ...; see sim.rs) side by side.
    let pcie8 = sim("pcie8");
    let case = Case {
        machine: "pcie8",
        inventory: &pcie8,
        free: vec![true; 8],
        count: 2,
    };
    let ours = gpuallocator::gpupin_choice(&case);
    assert_eq!(gpuallocator::worth(&case, &ours, &ours), Worth::Equal);
    let across = [0, 7];
    match gpuallocator::worth(&case, &ours, &across) {
        Worth::GpupinBetter(why) => assert!(why.starts_with("worst PCIe path"), "{why}"),
        other => panic!("{ours:?} against {across:?}: {other:?}"),
    }
    assert_eq!(gpuallocator::ranges(&pcie8, &[0, 1, 2, 5, 7]), "0-2,5,7");
}

#[test]
fn a_case_past_the_limit_is_reported_timed_out() {
    let test = "a_case_past_the_limit_is_reported_timed_out";
    let Some(peer) = required(test, gpuallocator::peer()) else {
        return;
    };
    // 2 of 48 free GPUs: BestEffort ranks every pairing of all 48 (47!!, about 1.2e30).
    let n = 48;
    let gpus: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"index": {i}, "uuid": "GPU-test-{i}", "name": "NVIDIA L40S", "pci_bus_id": "00000000:{i:02x}:00.0", "minor": {i}}}"#
            )
        })
        .collect();
    let rows: Vec<String> = (0..n)
        .map(|a| {
            let row: Vec<&str> = (0..n)
                .map(|b| match (a == b, a / 8 == b / 8) {
                    (true, _) => "\"X\"",
                    (false, true) => "\"PIX\"",
                    (false, false) => "\"SYS\"",
                })
                .collect();
            format!("[{}]", row.join(", "))
        })
        .collect();
    let text = format!(
        r#"{{"gpus": [{}], "topology": [{}]}}"#,
        gpus.join(", "),
        rows.join(", ")
    );
    let big = from_json(&text, Path::new("big48")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        Case {
            machine: "big48",
            inventory: &big,
            free: vec![true; n],
            count: 2,
        },
        // The case after a killed one still runs.
        Case {
            machine: "big48",
            inventory: &big,
            free: vec![true; n],
            count: 1,
        },
    ];
    let answers =
        gpuallocator::run(&peer, dir.path(), &cases, Duration::from_secs(2), |_, _| {}).unwrap();
    assert_eq!(answers[0], Answer::TimedOut { timeout_s: 2.0 });
    assert!(
        matches!(&answers[1], Answer::Chosen { chosen, .. } if chosen.len() == 1),
        "{answers:?}"
    );
    let rows: Vec<_> = cases
        .iter()
        .zip(&answers)
        .map(|(c, a)| gpuallocator::row(c, None, a))
        .collect();
    let table = gpuallocator::table(&rows);
    assert!(
        table.contains("| big48 | 2 | - | n/a | timed out (2 s) | n/a | "),
        "{table}"
    );
    assert_eq!(gpuallocator::tally(&rows).3, 1);
}
