//! The NIC the engine chooses for a GPU, in the testbed's PCIe topology (`--topology`: a
//! virtio-gpu behind a PCIe switch, NIC i at tier i from it: same switch, same host bridge,
//! same NUMA node, the other node; `testbed/src/vm/topology.rs`): each rxe is placed at its
//! virtio-net's PCI function, a segment near the GPU gets the NIC behind its switch as tier 0
//! and every NIC the tier the testbed placed it at, host memory ranks by its NUMA node, the
//! override (settings or `GPU_RDMA_NICS`) moves tier 0, and the doctor names the same NIC.
//! Needs the two-node testbed with four NICs and the topology (`cargo xtask test` runs the
//! module `two_node_rails` there); each node checks its own machine.

use gpu_rdma_engine::{Agent, Near, NicOverride, Proximity, SegmentDescriptor, Settings};
use gpu_rdma_topology::{endpoint, memory_numa_node, NICS_ENV};
use integration_tests::engine::host;
use integration_tests::exporters::Exporter;
use integration_tests::process::doctor;
use integration_tests::testbed::Testbed;
use std::path::Path;
use std::sync::Arc;

/// The words of the testbed's variable `name` (space- or comma-separated).
fn words(name: &str) -> Vec<String> {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("the testbed did not set {name}"))
        .split([' ', ','])
        .filter(|w| !w.is_empty())
        .map(str::to_string)
        .collect()
}

fn agent(name: &str, devices: &[String], nics: Option<String>) -> Agent {
    let settings = Settings {
        devices: Some(devices.to_vec()),
        bind: "127.0.0.1:0".parse().unwrap(),
        nics: nics.map(|t| t.parse::<NicOverride>().expect("a valid override")),
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

/// Each device's tier in `desc`, by device index.
fn tiers(desc: &SegmentDescriptor) -> Vec<u8> {
    let mut r: Vec<(u16, u8)> = desc.regions.iter().map(|r| (r.device, r.tier)).collect();
    r.sort();
    r.into_iter().map(|(_, t)| t).collect()
}

/// The tiers a ranking gives NICs at these places: the rank of each one's place among those
/// present (`switch`, `host-bridge`, `numa`, `other`), nearest 0.
fn dense(places: &[String]) -> Vec<u8> {
    const ORDER: [&str; 4] = ["switch", "host-bridge", "numa", "other"];
    let class = |p: &String| {
        ORDER
            .iter()
            .position(|o| o == p)
            .unwrap_or_else(|| panic!("unknown tier {p}"))
    };
    let mut present: Vec<usize> = places.iter().map(class).collect();
    present.sort();
    present.dedup();
    places
        .iter()
        .map(|p| present.iter().position(|&c| c == class(p)).unwrap() as u8)
        .collect()
}

mod two_node_rails {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rails_the_nic_behind_the_gpus_switch_is_tier_0_and_the_override_moves_it() {
        let tb = Testbed::get();
        assert_eq!(
            std::env::var("TESTBED_TOPOLOGY").as_deref(),
            Ok("1"),
            "this phase boots the testbed's PCIe topology (dmabuf-testbed --topology)"
        );
        let gpu_pci = std::env::var("TESTBED_GPU_PCI").expect("TESTBED_GPU_PCI");
        let card = std::env::var("TESTBED_GPU_CARD").expect("TESTBED_GPU_CARD");
        let nic_pci = words("TESTBED_NIC_PCI");
        let placed = words("TESTBED_NIC_TIERS");
        let devices = tb.devices.clone();
        assert_eq!(devices.len(), 4, "{devices:?}");
        assert_eq!((nic_pci.len(), placed.len()), (4, 4));

        // Each rxe sits at its virtio-net's PCI function, found through its parent netdev.
        for (d, pci) in devices.iter().zip(&nic_pci) {
            let e = endpoint(Path::new("/sys"), "infiniband", d);
            assert_eq!(e.address(), Some(pci.as_str()), "{d}: {e:?}");
        }
        // The GPU's buffers can be placed: its DRM node names its PCI function.
        let node = Arc::new(
            drm_export::DrmDevice::open(Path::new("/dev/dri").join(&card)).expect("the GPU"),
        );
        let gpu_place = node.pci_address().expect("the GPU's PCI address");
        assert_eq!(gpu_place, gpu_pci);

        // A buffer of the GPU, registered where its DRM device says it is: the NIC behind the
        // GPU's switch is tier 0, and every NIC is at the tier the testbed placed it at.
        let a = agent("topo", &devices, None);
        let near = Near::Pci(gpu_place);
        let buffer = drm_export::DumbBuffer::new(&node, 64 << 10).expect("a virtio-gpu buffer");
        let dmabuf = buffer.export().expect("PRIME export");
        let d = a
            .register_near("gpu", dmabuf, near.clone())
            .expect("registered near the GPU");
        let want = dense(&placed);
        assert_eq!(tiers(&d), want, "published tiers vs {placed:?}");
        let ranking = a.nic_ranking(&near);
        eprintln!("near {gpu_pci}: {ranking:#?}");
        let switch = placed
            .iter()
            .position(|p| p == "switch")
            .expect("a NIC behind the switch");
        assert_eq!((ranking[0].index, ranking[0].tier), (switch, 0));
        assert_eq!(ranking[0].proximity, Proximity::Switch);
        assert!(
            ranking[0].reason.starts_with(&format!(
                "{}: behind the same PCIe switch as {gpu_pci}",
                devices[switch]
            )),
            "{}",
            ranking[0].reason
        );
        for r in &ranking {
            assert_eq!(r.proximity.as_str(), placed[r.index], "{r:?}");
        }

        // Host memory ranks by its NUMA node: the NICs on that node first.
        let h = a
            .register("host", host(&[], 1 << 20))
            .expect("host segment");
        let numa = memory_numa_node(h.regions[0].addr as usize).expect("get_mempolicy");
        let nic_numa = words("TESTBED_NIC_NUMA");
        if let Some(n) = numa {
            let same: Vec<u8> = nic_numa
                .iter()
                .map(|x| u8::from(*x != n.to_string()))
                .collect();
            assert_eq!(
                tiers(&h),
                same,
                "host memory on node {n}, NICs on {nic_numa:?}"
            );
        }
        drop(a);

        // The override moves tier 0: the farthest NIC first for the GPU, in the settings...
        let far = placed.iter().position(|p| p == "other").unwrap_or(3);
        let a = agent(
            "topo-set",
            &devices,
            Some(format!("{gpu_pci}={}", devices[far])),
        );
        let d = a
            .register_near("gpu", Exporter::Udmabuf.allocate(64 << 10), near.clone())
            .expect("registered");
        let t = tiers(&d);
        assert_eq!(t[far], 0, "{t:?}");
        assert_eq!(t.iter().filter(|&&x| x == 0).count(), 1, "{t:?}");
        assert_eq!(t[switch], 1, "the switch's NIC next: {t:?}");
        drop(a);
        // ... and in the environment.
        std::env::set_var(NICS_ENV, format!("{gpu_pci}={}", devices[far]));
        let a = agent("topo-env", &devices, None);
        std::env::remove_var(NICS_ENV);
        let ranking = a.nic_ranking(&near);
        assert_eq!(
            (ranking[0].index, ranking[0].proximity),
            (far, Proximity::Listed)
        );
        drop(a);

        // The doctor names the same NIC for the GPU, and why.
        let out = doctor()
            .args(["--json", "--no-probe"])
            .output()
            .expect("the doctor");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let check = report["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == format!("{card} NIC"))
            .unwrap_or_else(|| panic!("no `{card} NIC` check: {report:#}"));
        let found = check["found"].as_str().unwrap();
        assert!(
            found.starts_with(&format!(
                "the transfer engine would use {} for {card}",
                devices[switch]
            )) && found.contains("behind the same PCIe switch"),
            "{found}"
        );
    }
}
