use super::*;
use crate::inventory::{InventorySource, load};

fn sim(name: &str) -> Inventory {
    load(
        &InventorySource::Sim(name.into()),
        std::path::Path::new("/nonexistent"),
        &crate::inventory::NvmlAccess::InProcess,
    )
    .unwrap()
}

fn choose(inv: &Inventory, free: &[bool], count: usize) -> Option<Vec<usize>> {
    Topology.choose(&PolicyInput {
        inventory: inv,
        free,
        count,
        cursor: 0,
        live: None,
    })
}

fn free_except(n: usize, held: &[usize]) -> Vec<bool> {
    (0..n).map(|p| !held.contains(&p)).collect()
}

#[test]
fn nvswitch_ties_go_to_the_lowest_positions() {
    let inv = sim("nvswitch8");
    assert_eq!(choose(&inv, &[true; 8], 3), Some(vec![0, 1, 2]));
    assert_eq!(choose(&inv, &free_except(8, &[1]), 2), Some(vec![0, 2]));
}

#[test]
fn pcie8_pairs_share_a_switch() {
    let inv = sim("pcie8");
    assert_eq!(choose(&inv, &[true; 8], 2), Some(vec![0, 1]));
    // With GPU 0 held, GPU 1 is alone on its switch: a pair still gets a whole switch.
    assert_eq!(choose(&inv, &free_except(8, &[0]), 2), Some(vec![2, 3]));
}

#[test]
fn pcie8_single_gpu_breaks_no_pair() {
    let inv = sim("pcie8");
    assert_eq!(choose(&inv, &free_except(8, &[0]), 1), Some(vec![1]));
}

#[test]
fn pcie8_quad_fills_one_socket() {
    let inv = sim("pcie8");
    assert_eq!(choose(&inv, &[true; 8], 4), Some(vec![0, 1, 2, 3]));
    assert_eq!(
        choose(&inv, &free_except(8, &[1]), 4),
        Some(vec![4, 5, 6, 7])
    );
}

#[test]
fn pcie8_without_a_whole_socket_takes_the_best_split() {
    let inv = sim("pcie8");
    // Each socket has one whole switch and one lone GPU left. Two whole switches
    // (PIX + PIX + 4 x SYS = 80) beat a socket's three GPUs plus one from the other
    // (PIX + 2 x NODE = 60); of the 2+2 splits only whole switches score 80.
    let free = free_except(8, &[0, 4]);
    let got = choose(&inv, &free, 4).unwrap();
    assert_eq!(got, vec![2, 3, 6, 7]);
    assert_eq!(set_score(&inv, &got), 80);
}

#[test]
fn cubemesh8_pair_is_double_linked_and_quad_is_fully_linked() {
    let inv = sim("cubemesh8");
    let pair = choose(&inv, &[true; 8], 2).unwrap();
    assert_eq!(
        inv.link(pair[0], pair[1]),
        Some(Link::NvLink(2)),
        "{pair:?}"
    );
    let quad = choose(&inv, &[true; 8], 4).unwrap();
    assert_eq!(quad, vec![0, 1, 2, 3]);
    for &a in &quad {
        for &b in &quad {
            assert!(a == b || matches!(inv.link(a, b), Some(Link::NvLink(_))));
        }
    }
    // With GPU 0 held, the other quad is the only fully linked one.
    assert_eq!(
        choose(&inv, &free_except(8, &[0]), 4),
        Some(vec![4, 5, 6, 7])
    );
}

#[test]
fn without_links_it_is_pack() {
    let inv = crate::policy::testing::machine(4);
    assert_eq!(
        choose(&inv, &[false, true, true, true], 2),
        Some(vec![1, 2])
    );
}

#[test]
fn zero_and_too_many() {
    let inv = sim("pcie8");
    assert_eq!(choose(&inv, &[true; 8], 0), Some(vec![]));
    assert_eq!(choose(&inv, &free_except(8, &[3]), 8), None);
}

#[test]
fn nvswitch_beats_every_direct_link() {
    assert!(pair_score(Link::NvSwitch) >= pair_score(Link::NvLink(u8::MAX)));
    assert!(pair_score(Link::NvLink(1)) > pair_score(Link::PcieSwitch));
}

#[test]
fn out_of_budget_still_answers() {
    let inv = sim("cubemesh8");
    let input = PolicyInput {
        inventory: &inv,
        free: &[true; 8],
        count: 4,
        cursor: 0,
        live: None,
    };
    let out = search_with_budget(&input, 1).unwrap();
    assert!(!out.exact);
    assert_eq!(out.chosen.len(), 4);
    assert!(search(&input).unwrap().exact);
}

mod agrees_with_brute_force {
    use super::*;
    use crate::policy::reference;
    use crate::policy::testing::machine;
    use proptest::prelude::*;

    fn any_link() -> impl Strategy<Value = Link> {
        prop_oneof![
            Just(Link::NvSwitch),
            (1u8..=18).prop_map(Link::NvLink),
            Just(Link::PcieSwitch),
            Just(Link::PcieMultiSwitch),
            Just(Link::HostBridge),
            Just(Link::SameNuma),
            Just(Link::CrossSocket),
        ]
    }

    /// A machine of `n` GPUs whose links are drawn from `pool`, symmetric; drawing from
    /// a small pool makes ties and twin groups, which the search treats specially.
    fn topology() -> impl Strategy<Value = (Inventory, Vec<bool>, usize)> {
        (1usize..=12, proptest::collection::vec(any_link(), 1..4))
            .prop_flat_map(|(n, pool)| {
                let pairs = n * (n - 1) / 2;
                (
                    Just(n),
                    proptest::collection::vec(proptest::sample::select(pool), pairs),
                    proptest::collection::vec(any::<bool>(), n),
                    0..=n,
                )
            })
            .prop_map(|(n, drawn, free, count)| {
                let mut inv = machine(n as u32);
                // drawn[i] is the i-th pair (a < b) in row order.
                let pair = |a: usize, b: usize| a * n - a * (a + 1) / 2 + (b - a - 1);
                let links = (0..n)
                    .map(|a| {
                        (0..n)
                            .map(|b| match a.cmp(&b) {
                                std::cmp::Ordering::Equal => Link::SelfLink,
                                std::cmp::Ordering::Less => drawn[pair(a, b)],
                                std::cmp::Ordering::Greater => drawn[pair(b, a)],
                            })
                            .collect()
                    })
                    .collect();
                inv.links = Some(links);
                (inv, free, count)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn same_set_as_exhaustive_search((inv, free, count) in topology()) {
            let input = PolicyInput { inventory: &inv, free: &free, count, cursor: 0, live: None };
            let want = reference::best(&input);
            let got = search(&input);
            prop_assert_eq!(got.is_some(), want.is_some());
            if let (Some(got), Some(want)) = (got, want) {
                prop_assert!(got.exact);
                prop_assert_eq!(set_score(&inv, &got.chosen), set_score(&inv, &want));
                prop_assert_eq!(got.chosen, want);
            }
        }
    }
}
