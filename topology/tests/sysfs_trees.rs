//! Places, rankings and the NIC override on a recorded sysfs tree (`tests/fixtures/`): every
//! tier, rxe devices over virtio-net, a virtio-gpu, NUMA nodes, unknown places.

use gpu_rdma_topology::{
    endpoint, gpus, nics, pair, pci_device, rank, Endpoint, Near, NicOverride, Proximity,
};
use std::path::{Path, PathBuf};

fn tree() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-sockets")
}

/// (nic, tier, proximity) of a ranking, in its order.
fn tiers(r: &[gpu_rdma_topology::Ranked]) -> Vec<(&str, u8, Proximity)> {
    r.iter()
        .map(|r| (r.nic.as_str(), r.tier, r.proximity))
        .collect()
}

fn ranked(near: Near, over: Option<&str>) -> Vec<gpu_rdma_topology::Ranked> {
    let root = tree();
    let over: Option<NicOverride> = over.map(|t| t.parse().expect("a valid override"));
    rank(&root, &near, &nics(&root), over.as_ref())
}

#[test]
fn rxe_devices_are_placed_through_their_netdev_at_the_pci_function_above_virtio() {
    let root = tree();
    let all = nics(&root);
    let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["mlx5_0", "mlx5_1", "rxe0", "rxe1", "rxe2"]);
    let rxe0 = endpoint(&root, "infiniband", "rxe0");
    assert_eq!(rxe0.chain, ["pci0000:40", "0000:40:01.0", "0000:41:00.0"]);
    assert_eq!(rxe0.driver.as_deref(), Some("virtio-pci"));
    assert_eq!(
        rxe0.dir,
        Path::new("devices/pci0000:40/0000:40:01.0/0000:41:00.0")
    );
    assert_eq!(rxe0.numa_node(&root), Some(0));
    assert_eq!(
        endpoint(&root, "infiniband", "rxe1").numa_node(&root),
        Some(1)
    );
    let rxe2 = endpoint(&root, "infiniband", "rxe2");
    assert_eq!(
        (rxe2.address(), rxe2.numa_node(&root)),
        (None, None),
        "dummy0 is off PCI"
    );
    // A virtio-gpu's card is below its virtio device too.
    let g = gpus(&root);
    let cards: Vec<(&str, Option<&str>)> =
        g.iter().map(|e| (e.name.as_str(), e.address())).collect();
    assert_eq!(
        cards,
        [
            ("card0", None),
            ("card1", Some("0000:03:00.0")),
            ("card2", Some("0000:82:00.0"))
        ]
    );
    assert_eq!(g[2].numa_node(&root), Some(1));
    assert_eq!(g[1].host_bridge(), Some("pci0000:00"));
}

#[test]
fn a_pci_function_is_found_by_its_address_and_met_at_its_switch() {
    let root = tree();
    let gpu: Endpoint = pci_device(&root, "0000:03:00.0").expect("the GPU's function");
    assert_eq!(
        gpu.chain,
        [
            "pci0000:00",
            "0000:00:01.0",
            "0000:01:00.0",
            "0000:02:00.0",
            "0000:03:00.0"
        ]
    );
    assert_eq!(gpu.driver.as_deref(), Some("amdgpu"));
    assert_eq!(
        pci_device(&root, "0000:03:00.0".to_uppercase().as_str()),
        Some(gpu.clone())
    );
    assert_eq!(pci_device(&root, "0000:99:00.0"), None);
    assert_eq!(pci_device(&root, "not an address"), None);
    let m = pair(&root, &gpu, &endpoint(&root, "infiniband", "mlx5_0"));
    assert_eq!(
        (m.shared, m.common_bridge.as_deref()),
        (3, Some("0000:01:00.0"))
    );
    let bridges: Vec<&str> = m.bridges.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(bridges, ["0000:02:00.0", "0000:02:01.0"]);
    let m = pair(&root, &gpu, &endpoint(&root, "infiniband", "rxe1"));
    assert_eq!((m.shared, m.common_bridge), (0, None));
}

#[test]
fn a_gpus_nics_come_in_four_tiers_switch_host_bridge_numa_other() {
    let r = ranked(Near::Pci("0000:03:00.0".into()), None);
    assert_eq!(
        tiers(&r),
        [
            ("mlx5_0", 0, Proximity::Switch),
            ("mlx5_1", 1, Proximity::HostBridge),
            ("rxe0", 2, Proximity::Numa),
            ("rxe1", 3, Proximity::Other),
            ("rxe2", 3, Proximity::Other),
        ]
    );
    assert_eq!(
        r[0].reason,
        "mlx5_0: behind the same PCIe switch as 0000:03:00.0 (bridge 0000:01:00.0)"
    );
    assert!(
        r[1].reason
            .contains("same host bridge as 0000:03:00.0 (pci0000:00)"),
        "{}",
        r[1].reason
    );
    assert!(
        r[2].reason.contains("on NUMA node 0, as 0000:03:00.0"),
        "{}",
        r[2].reason
    );
    assert!(
        r[3].reason.contains("on NUMA node 1, the memory on 0"),
        "{}",
        r[3].reason
    );
    assert!(r[4].reason.contains("not on PCI"), "{}", r[4].reason);
    let index: Vec<usize> = r.iter().map(|r| r.index).collect();
    assert_eq!(index, [0, 1, 2, 3, 4], "positions in the list ranked");
}

#[test]
fn tiers_are_dense_the_nearest_present_is_tier_0() {
    // The virtio-gpu on node 1 has no NIC behind a switch with it: rxe1, under its host
    // bridge, is tier 0.
    let r = ranked(Near::Pci("0000:82:00.0".into()), None);
    assert_eq!(
        tiers(&r),
        [
            ("rxe1", 0, Proximity::HostBridge),
            ("mlx5_0", 1, Proximity::Other),
            ("mlx5_1", 1, Proximity::Other),
            ("rxe0", 1, Proximity::Other),
            ("rxe2", 1, Proximity::Other),
        ]
    );
    // A NIC's own function: the same function, tier 0.
    let r = ranked(Near::Pci("0000:41:00.0".into()), None);
    assert_eq!(tiers(&r)[0], ("rxe0", 0, Proximity::Switch));
    assert!(
        r[0].reason.contains("the same PCI function"),
        "{}",
        r[0].reason
    );
}

#[test]
fn host_memory_is_ranked_by_its_numa_node() {
    let r = ranked(Near::Numa(1), None);
    assert_eq!(tiers(&r)[0], ("rxe1", 0, Proximity::Numa));
    assert!(r[1..]
        .iter()
        .all(|r| r.tier == 1 && r.proximity == Proximity::Other));
    assert_eq!(r[0].reason, "rxe1: on NUMA node 1, as the memory");
    let r = ranked(Near::Numa(0), None);
    let near: Vec<&str> = r
        .iter()
        .filter(|r| r.tier == 0)
        .map(|r| r.nic.as_str())
        .collect();
    assert_eq!(near, ["mlx5_0", "mlx5_1", "rxe0"]);
    let off_pci = &r.iter().find(|r| r.nic == "rxe2").unwrap().reason;
    assert_eq!(
        off_pci,
        "rxe2: not on PCI, so not known to be on NUMA node 0"
    );
}

#[test]
fn unknown_places_put_every_nic_in_tier_0() {
    for near in [Near::Unknown, Near::Pci("0000:99:00.0".into())] {
        let r = ranked(near.clone(), None);
        assert_eq!(r.len(), 5);
        assert!(
            r.iter()
                .all(|r| r.tier == 0 && r.proximity == Proximity::Unknown),
            "{near}: {r:#?}"
        );
    }
    let r = ranked(Near::Pci("0000:99:00.0".into()), None);
    assert!(
        r[0].reason
            .contains("0000:99:00.0 is not a PCI function here"),
        "{}",
        r[0].reason
    );
    // Nothing to rank.
    assert!(rank(&tree(), &Near::Numa(0), &[], None).is_empty());
}

#[test]
fn the_override_lists_tier_0_in_its_order_and_the_rest_follow() {
    let text = "0000:03:00.0=rxe1,mlx5_1; numa0=rxe0; *=rxe2";
    let r = ranked(Near::Pci("0000:03:00.0".into()), Some(text));
    assert_eq!(
        tiers(&r),
        [
            ("rxe1", 0, Proximity::Listed),
            ("mlx5_1", 0, Proximity::Listed),
            ("mlx5_0", 1, Proximity::Switch),
            ("rxe0", 2, Proximity::Numa),
            ("rxe2", 3, Proximity::Other),
        ]
    );
    assert!(
        r[0].reason
            .starts_with("rxe1: listed 1st for 0000:03:00.0 by the NIC override"),
        "{}",
        r[0].reason
    );
    assert!(r[1].reason.contains("listed 2nd"), "{}", r[1].reason);
    // No rule of its own: the function's NUMA node's rule (mlx5_1's function, node 0).
    let r = ranked(Near::Pci("0000:05:00.0".into()), Some(text));
    assert_eq!(tiers(&r)[0], ("rxe0", 0, Proximity::Listed));
    assert!(r[0].reason.contains("for numa0"), "{}", r[0].reason);
    // Host memory on node 0: its node's rule; on node 1 and unknown places: `*`.
    assert_eq!(tiers(&ranked(Near::Numa(0), Some(text)))[0].0, "rxe0");
    for near in [
        Near::Numa(1),
        Near::Unknown,
        Near::Pci("0000:82:00.0".into()),
    ] {
        let r = ranked(near.clone(), Some(text));
        assert_eq!(tiers(&r)[0], ("rxe2", 0, Proximity::Listed), "{near}");
        assert!(r[1..].iter().all(|r| r.tier >= 1), "{near}: {r:#?}");
    }
    // A rule naming only NICs not ranked changes nothing.
    let plain = ranked(Near::Pci("0000:03:00.0".into()), None);
    assert_eq!(
        ranked(Near::Pci("0000:03:00.0".into()), Some("*=mlx5_9")),
        plain
    );
}

#[test]
fn override_text_parses_and_prints_back() {
    let o: NicOverride = " 0000:22:00.0 = rxe1 , rxe3 ;numa0=rxe0;*=rxe2;"
        .parse()
        .unwrap();
    assert_eq!(o.to_string(), "0000:22:00.0=rxe1,rxe3;numa0=rxe0;*=rxe2");
    let short: NicOverride = "22:00.0=rxe1;0000:AF:00.1=mlx5_0".parse().unwrap();
    assert_eq!(short.to_string(), "0000:22:00.0=rxe1;0000:af:00.1=mlx5_0");
    let (key, nics) = short
        .rule_for(&Near::Pci("0000:AF:00.1".into()), None)
        .unwrap();
    assert_eq!(
        (key.as_str(), nics),
        ("0000:af:00.1", &["mlx5_0".to_string()][..])
    );
    assert_eq!(short.rule_for(&Near::Unknown, None), None);
    assert!("".parse::<NicOverride>().unwrap().is_empty());
}

#[test]
fn bad_override_text_is_refused_naming_the_part() {
    for (text, part, why) in [
        ("rxe0", "rxe0", "a rule is"),
        ("gpu0=rxe0", "gpu0", "not a place"),
        ("numa=rxe0", "numa", "a NUMA node"),
        ("numa-1=rxe0", "numa-1", "a NUMA node"),
        ("0000:22:00=rxe0", "0000:22:00", "not a place"),
        ("*=rxe0;*=rxe1", "*=rxe1", "a second rule for *"),
        ("*=", "*=", "a NIC name"),
        ("*=rxe0,,rxe1", "*=rxe0,,rxe1", "a NIC name"),
        ("*=rxe 0", "*=rxe 0", "a NIC name"),
        ("*=rxe0=rxe1", "*=rxe0=rxe1", "a NIC name"),
        ("*=rxe0,rxe0", "rxe0", "listed twice"),
    ] {
        let e = text.parse::<NicOverride>().expect_err(text);
        assert_eq!(e.part, part, "{text}");
        assert!(e.why.contains(why), "{text}: {e}");
        assert!(e.to_string().contains(&format!("{part:?}")), "{e}");
    }
}
