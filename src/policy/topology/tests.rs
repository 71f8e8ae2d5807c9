use super::*;
use crate::model::gpu::Inventory;
use crate::model::link::Link;
use crate::policy::testing::{input, sim};

fn choose(inv: &Inventory, free: &[bool], count: usize) -> Option<Vec<usize>> {
    Topology.choose(&input(inv, free, count))
}

fn nvlinked(inv: &Inventory, a: usize, b: usize) -> bool {
    matches!(inv.link(a, b), Some(Link::NvLink(_) | Link::NvSwitch))
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
    // Each socket has one whole switch and one lone GPU left: every set of four crosses
    // the sockets, so worst path, ring and slowest pair tie at SYS. Two whole switches
    // (2 PIX + 4 SYS) beat a socket's three GPUs plus one from the other
    // (PIX + 2 NODE + 3 SYS) on total bandwidth.
    let free = free_except(8, &[0, 4]);
    let got = choose(&inv, &free, 4).unwrap();
    assert_eq!(got, vec![2, 3, 6, 7]);
    let input = input(&inv, &free, 4);
    assert_eq!(terms(&input, &got).unwrap().worst_path, Path::Sys);
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
    use bandwidth::{family, pair};
    for name in [
        "NVIDIA H100 80GB HBM3",
        "Tesla V100-SXM2-32GB",
        "NVIDIA A100-SXM4-80GB",
        "x",
    ] {
        let f = family(name);
        assert!(pair(Link::NvSwitch, f, f).0 >= pair(Link::NvLink(u8::MAX), f, f).0);
    }
}

#[test]
fn out_of_budget_still_answers() {
    let inv = sim("cubemesh8");
    let input = input(&inv, &[true; 8], 4);
    let out = search_with_budget(&input, 1).unwrap();
    assert!(!out.exact);
    assert_eq!(out.chosen.len(), 4);
    assert!(search(&input).unwrap().exact);
}

/// The first case of issue 13: with GPUs 2, 6, 7 held, three GPUs used to be 0, 3, 4,
/// where 3 and 4 meet only across the sockets, though 0, 1, 3 is free and all NVLink.
#[test]
fn cubemesh8_three_of_five_stays_on_nvlink() {
    let inv = sim("cubemesh8");
    let free = free_except(8, &[2, 6, 7]);
    let got = choose(&inv, &free, 3).unwrap();
    assert_eq!(got, vec![0, 1, 3]);
    for (x, &a) in got.iter().enumerate() {
        for &b in &got[x + 1..] {
            assert!(nvlinked(&inv, a, b), "{a}-{b} in {got:?}");
        }
    }
}

/// The second case: five of the empty machine. Every five include a SYS pair, but some
/// have a ring over NVLink only; 0, 1, 2, 3, 4 has none (GPU 4 links only to 0).
#[test]
fn cubemesh8_five_have_an_nvlink_ring() {
    let inv = sim("cubemesh8");
    let free = [true; 8];
    let got = choose(&inv, &free, 5).unwrap();
    let t = terms(&input(&inv, &free, 5), &got).unwrap();
    // NV1 on a V100: 25 GB/s per direction.
    assert_eq!(t.ring, 25_000, "{got:?}");
    let old = terms(&input(&inv, &free, 5), &[0, 1, 2, 3, 4]).unwrap();
    assert!(old.ring < 25_000);
    assert!(has_nvlink_ring(&inv, &got), "{got:?}");
}

/// Whether some order of `set` closes a ring of NVLinked pairs.
fn has_nvlink_ring(inv: &Inventory, set: &[usize]) -> bool {
    fn go(inv: &Inventory, order: &mut Vec<usize>, rest: &[usize]) -> bool {
        if rest.is_empty() {
            return nvlinked(inv, order[0], *order.last().unwrap());
        }
        rest.iter().any(|&v| {
            if !nvlinked(inv, *order.last().unwrap(), v) {
                return false;
            }
            order.push(v);
            let others: Vec<usize> = rest.iter().copied().filter(|&x| x != v).collect();
            let found = go(inv, order, &others);
            order.pop();
            found
        })
    }
    go(inv, &mut vec![set[0]], &set[1..])
}

#[test]
fn never_a_worse_pcie_path_when_a_better_set_is_free() {
    // pcie8: sockets 0-3 and 4-7, switches of two. Three GPUs fit on socket 1 only if
    // it has three free; with 5 held it has 4, 6, 7: NODE pairs, no SYS.
    let inv = sim("pcie8");
    let free = free_except(8, &[1, 2, 5]);
    let got = choose(&inv, &free, 3).unwrap();
    assert_eq!(got, vec![4, 6, 7]);
    let t = terms(&input(&inv, &free, 3), &got).unwrap();
    assert_eq!(t.worst_path, Path::Node);
}

#[test]
fn count_one_keeps_the_best_connected_groups_whole() {
    let inv = sim("cubemesh8");
    // With 0, 1, 2 held, GPU 3 is the last free GPU of its quad: taking it leaves the
    // quad 4-7 whole.
    let got = choose(&inv, &free_except(8, &[0, 1, 2]), 1).unwrap();
    assert_eq!(got, vec![3]);
}

#[test]
fn explain_names_the_deciding_term() {
    let inv = sim("cubemesh8");
    let free = free_except(8, &[2, 6, 7]);
    let e = explain(&input(&inv, &free, 3)).unwrap();
    assert_eq!(e.chosen.positions, vec![0, 1, 3]);
    assert_eq!(e.chosen.terms.worst_path, Path::NvLink);
    let runner = e.runner_up.unwrap();
    assert_ne!(runner.positions, e.chosen.positions);
    assert_eq!(e.decided_by, Some(Term::WorstPath));
    assert!(runner.terms.worst_path < Path::NvLink);
    assert!(e.exact);
}

#[test]
fn explain_without_another_set_has_no_runner_up() {
    let inv = sim("nvswitch8");
    let e = explain(&input(&inv, &free_except(8, &[0, 1, 2]), 5)).unwrap();
    assert_eq!(e.chosen.positions, vec![3, 4, 5, 6, 7]);
    assert_eq!(e.runner_up, None);
    // On an NVSwitch every set of two is the same but for positions: no runner-up either.
    let e = explain(&input(&inv, &[true; 8], 2)).unwrap();
    assert_eq!(e.runner_up, None);
}

#[test]
fn bridged_pairs_stay_pairs() {
    let inv = sim("nvbridge4");
    assert_eq!(choose(&inv, &[true; 4], 2), Some(vec![0, 1]));
    // One GPU of the first bridge held: the other bridge, not a SYS pair.
    assert_eq!(choose(&inv, &free_except(4, &[0]), 2), Some(vec![2, 3]));
    // And one GPU alone takes the lone GPU 1, leaving the bridge whole.
    assert_eq!(choose(&inv, &free_except(4, &[0]), 1), Some(vec![1]));
}

#[test]
fn pxb_box_fills_a_socket_before_crossing() {
    let inv = sim("pcie8pxb");
    assert_eq!(choose(&inv, &[true; 8], 4), Some(vec![0, 1, 2, 3]));
    // GPU 0 held: a pair under one switch (2, 3), not 1 with a PXB partner.
    assert_eq!(choose(&inv, &free_except(8, &[0]), 2), Some(vec![2, 3]));
    // Three with 0 and 4 held: one socket's three (PXB at worst), never across.
    let got = choose(&inv, &free_except(8, &[0, 4]), 3).unwrap();
    assert_eq!(got, vec![1, 2, 3]);
}

#[test]
fn nvswitch_generations_all_pick_the_lowest() {
    for name in ["dgxa100", "hgxh200", "nvswitch8"] {
        let inv = sim(name);
        assert_eq!(
            choose(&inv, &free_except(8, &[1]), 3),
            Some(vec![0, 2, 3]),
            "{name}"
        );
    }
    let pair = sim("gh200pair");
    assert_eq!(choose(&pair, &[true; 2], 1), Some(vec![0]));
}

/// Every held set and every count on the real machines with up to 8 GPUs, against the
/// brute force.
#[test]
fn every_held_set_on_the_built_in_machines() {
    use crate::host::inventory::sim;
    for name in sim::names() {
        let inv = self::sim(name);
        let n = inv.gpus.len();
        if n > 8 {
            continue;
        }
        for mask in 0u32..1 << n {
            let free: Vec<bool> = (0..n).map(|p| mask & 1 << p != 0).collect();
            for count in 1..=mask.count_ones() as usize {
                let input = input(&inv, &free, count);
                let got = search(&input).unwrap();
                assert!(got.exact);
                assert_eq!(
                    Some(got.chosen),
                    crate::policy::reference::best(&input),
                    "{name} free {mask:#b} count {count}"
                );
            }
        }
    }
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

    /// Mostly one generation, as machines are, sometimes mixed.
    const NAMES: [&str; 5] = [
        "Tesla V100-SXM2-32GB",
        "Tesla V100-SXM2-32GB",
        "Tesla V100-SXM2-32GB",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA RTX A6000",
    ];

    /// A machine of `n` GPUs whose links are drawn from `pool`, symmetric; drawing from
    /// a small pool makes ties and twin groups, which the search treats specially.
    fn topology() -> impl Strategy<Value = (Inventory, Vec<bool>, usize)> {
        (1usize..=16, proptest::collection::vec(any_link(), 1..5))
            .prop_flat_map(|(n, pool)| {
                let pairs = n * (n - 1) / 2;
                (
                    Just(n),
                    proptest::collection::vec(proptest::sample::select(pool), pairs),
                    proptest::collection::vec(any::<bool>(), n),
                    0..=n,
                    proptest::collection::vec(proptest::sample::select(NAMES.to_vec()), n),
                )
            })
            .prop_map(|(n, drawn, free, count, names)| {
                let mut inv = machine(n as u32);
                for (gpu, name) in inv.gpus.iter_mut().zip(names) {
                    gpu.name = name.to_string();
                }
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
                prop_assert_eq!(terms(&input, &got.chosen), terms(&input, &want));
                prop_assert_eq!(got.chosen, want);
            }
        }
    }
}

/// A regression: GPUs 2 and 5 are twins joined only through GPUs 0 and 3, and the
/// component bound once left such twins out, hiding the ring 0-2-3-5 over PIX.
#[test]
fn twins_joined_through_a_neighbour_keep_their_ring() {
    let mut inv = crate::policy::testing::machine(7);
    for (g, h100) in inv
        .gpus
        .iter_mut()
        .zip([true, true, false, false, false, false, false])
    {
        g.name = if h100 {
            "NVIDIA H100 80GB HBM3"
        } else {
            "Tesla V100-SXM2-32GB"
        }
        .into();
    }
    let rows = [
        "X PIX PIX PIX NODE PIX NODE",
        "PIX X NODE NODE NODE NODE NODE",
        "PIX NODE X PIX NODE NODE NODE",
        "PIX NODE PIX X NODE PIX NODE",
        "NODE NODE NODE NODE X NODE NODE",
        "PIX NODE NODE PIX NODE X NODE",
        "NODE NODE NODE NODE NODE NODE X",
    ];
    let matrix = rows
        .iter()
        .map(|r| r.split(' ').map(|c| c.parse().unwrap()).collect());
    inv.links = Some(matrix.collect());
    let free = [true, true, true, true, false, true, false];
    let input = input(&inv, &free, 4);
    let got = search(&input).unwrap().chosen;
    assert_eq!(got, vec![0, 2, 3, 5]);
    assert_eq!(Some(got), crate::policy::reference::best(&input));
}
