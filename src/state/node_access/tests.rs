use super::*;
use crate::host::inventory::sim;
use crate::model::holder::Owner;
use crate::state::ledger::testing::record;

fn owned(id: &str, gpus: &[&str], kind: HolderKind, uid: u32) -> Record {
    let mut r = record(id, gpus);
    r.kind = kind;
    r.owner = Some(Owner {
        uid,
        user: format!("u{uid}"),
        groups: Vec::new(),
    });
    r
}

/// The uids wanted on each node that has any, by path.
fn entries(inventory: &Inventory, records: &[Record]) -> BTreeMap<String, Vec<u32>> {
    wanted(
        inventory,
        records,
        |r| r.id != "gone",
        Path::new("/test/dev"),
    )
    .into_iter()
    .filter(|n| !n.uids.is_empty())
    .map(|n| (n.path.display().to_string(), n.uids.into_iter().collect()))
    .collect()
}

#[test]
fn jobs_and_holds_for_a_process_give_their_owners_their_gpus_nodes_only() {
    let inv = sim::machine("nvswitch8").unwrap();
    let uuid = |i: usize| inv.gpus[i].uuid.clone();
    let (g0, g1, g2, g3) = (uuid(0), uuid(1), uuid(2), uuid(3));
    let mut hold_no_pid = owned("park", &[&g3], HolderKind::Hold, 1003);
    hold_no_pid.pid = None;
    let records = [
        owned("job", &[&g0], HolderKind::Exec, 1001),
        owned("acquire", &[&g1], HolderKind::Hold, 1002),
        owned("box", &[&g2], HolderKind::Container, 1004),
        hold_no_pid,
        owned("roots", &[&g3], HolderKind::Exec, 0),
    ];
    let got = entries(&inv, &records);
    let minor = |i: usize| format!("/test/dev/nvidia{}", inv.gpus[i].minor);
    let expected = BTreeMap::from([(minor(0), vec![1001]), (minor(1), vec![1002])]);
    assert_eq!(got, expected);
    let all = wanted(&inv, &records, |_| true, Path::new("/test/dev"));
    assert_eq!(
        all.len(),
        8,
        "every GPU node is managed, none of the control nodes"
    );
    assert!(all.iter().all(|n| n.major == inv.gpu_major));
}

#[test]
fn a_shared_gpu_keeps_every_live_owner_and_a_stale_one_goes() {
    let inv = sim::machine("nvswitch8").unwrap();
    let g0 = inv.gpus[0].uuid.clone();
    let records = [
        owned("a", &[&g0], HolderKind::Exec, 1001),
        owned("b", &[&g0], HolderKind::Exec, 1002),
        owned("gone", &[&g0], HolderKind::Exec, 1003),
    ];
    let got = entries(&inv, &records);
    let node = format!("/test/dev/nvidia{}", inv.gpus[0].minor);
    assert_eq!(got, BTreeMap::from([(node, vec![1001, 1002])]));
}

#[test]
fn a_mig_instance_gives_its_gpus_node_and_its_two_capability_nodes() {
    let inv = sim::machine("nvswitch8mig").unwrap();
    let instance = inv.mig_instances().next().unwrap().clone();
    let records = [owned("m", &[&instance.uuid], HolderKind::Exec, 1001)];
    let got = entries(&inv, &records);
    let mut expected: Vec<String> = inv
        .mig_nodes(&instance)
        .iter()
        .map(|n| {
            host_path(Path::new("/test/dev"), &n.path)
                .display()
                .to_string()
        })
        .collect();
    expected.sort();
    assert_eq!(expected.len(), 3, "{expected:?}");
    assert_eq!(got.keys().cloned().collect::<Vec<_>>(), expected);
    let managed = wanted(&inv, &records, |_| true, Path::new("/test/dev")).len();
    let caps: usize = inv
        .mig_instances()
        .map(|m| inv.mig_cap_nodes(m).len())
        .sum();
    assert!(
        managed > 8 && managed <= 8 + caps,
        "GPU nodes and capability nodes"
    );
}
