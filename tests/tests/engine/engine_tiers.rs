//! The tiers an agent publishes for each region of a segment, from where the memory is and
//! the NIC override, in one node: the testbed's `rxe0` and a second soft-RoCE device made
//! for the test over a veth pair of its own (removed at the end), so that the override has
//! two devices to order. Needs the testbed VM.

use gpu_rdma_engine::{
    Agent, ErrorKind, Near, NicOverride, Proximity, SegmentDescriptor, Settings,
};
use gpu_rdma_topology::{memory_numa_node, NICS_ENV};
use integration_tests::engine::host;
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use std::process::Command;

/// The second device: `rxe_tiers` over `vtiers0`, whose peer is `vtiers1`.
const DEVICE: &str = "rxe_tiers";
const NETDEV: &str = "vtiers0";

fn sh(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", cmd])
        .status()
        .is_ok_and(|s| s.success())
}

/// A soft-RoCE device over a veth pair, deleted (with the pair) when dropped.
struct ExtraRxe;

impl ExtraRxe {
    fn add() -> ExtraRxe {
        let made = sh(&format!(
            "ip link add {NETDEV} type veth peer name vtiers1 && ip link set vtiers1 up && \
             ip addr add 169.254.99.1/24 dev {NETDEV} && ip link set {NETDEV} up && \
             rdma link add {DEVICE} type rxe netdev {NETDEV}"
        ));
        let guard = ExtraRxe;
        assert!(made, "could not add {DEVICE} over {NETDEV}");
        let state = format!("/sys/class/infiniband/{DEVICE}/ports/1/state");
        for _ in 0..200 {
            if std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
                return guard;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("{DEVICE} did not become ACTIVE");
    }
}

impl Drop for ExtraRxe {
    fn drop(&mut self) {
        sh(&format!(
            "rdma link delete {DEVICE}; ip link delete {NETDEV}"
        ));
    }
}

fn agent(name: &str, devices: &[String], nics: Option<&str>) -> gpu_rdma_engine::Result<Agent> {
    Agent::new(
        name,
        Settings {
            devices: Some(devices.to_vec()),
            bind: "127.0.0.1:0".parse().unwrap(),
            nics: nics.map(|t| t.parse::<NicOverride>().expect("a valid override")),
            ..Settings::default()
        },
    )
}

/// Each device's tier in `desc`, by device index.
fn tiers(desc: &SegmentDescriptor) -> Vec<u8> {
    let mut r: Vec<(u16, u8)> = desc.regions.iter().map(|r| (r.device, r.tier)).collect();
    r.sort();
    r.into_iter().map(|(_, t)| t).collect()
}

/// The place `register` finds for host memory: the NUMA node of its first page.
fn host_near(desc: &SegmentDescriptor) -> Near {
    let addr = desc.regions[0].addr as usize;
    memory_numa_node(addr)
        .expect("get_mempolicy")
        .map_or(Near::Unknown, Near::Numa)
}

#[test]
#[ignore = "needs the testbed VM"]
fn host_segments_publish_their_ranking_and_the_override_moves_tier_0() {
    let tb = Testbed::get();
    let _extra = ExtraRxe::add();
    let devices = vec![tb.device.clone(), DEVICE.to_string()];
    // Both devices run over veth netdevs, off PCI: nothing places either nearer to host
    // memory, so both are tier 0, and the ranking says why.
    let a = agent("tiers-plain", &devices, None).expect("agent");
    let desc = a.register("host", host(&[], 1 << 20)).expect("registered");
    let near = host_near(&desc);
    let ranking = a.nic_ranking(&near);
    assert_eq!(ranking.len(), 2);
    for r in &ranking {
        assert_eq!(
            (r.tier, r.proximity),
            (
                0,
                if near == Near::Unknown {
                    Proximity::Unknown
                } else {
                    Proximity::Other
                }
            ),
            "{r:?}"
        );
        assert!(
            r.reason.starts_with(&format!("{}: ", devices[r.index])),
            "{r:?}"
        );
    }
    assert_eq!(tiers(&desc), [0, 0], "published as ranked ({near})");
    eprintln!("host memory at {near}: {ranking:#?}");
    // A dma-buf registered with a place: the same ranking for it.
    let vgem =
        drm_export::DrmDevice::open_driver("vgem", drm_export::NodeKind::Card).expect("vgem");
    assert_eq!(vgem.pci_address(), None, "vgem is a platform device");
    let d = a
        .register_near("gpu", Exporter::Udmabuf.allocate(64 << 10), Near::Unknown)
        .expect("registered near");
    assert_eq!(tiers(&d), [0, 0]);
    drop(a);

    // The settings' override: the extra device first for every place.
    let a = agent("tiers-set", &devices, Some(&format!("*={DEVICE}"))).expect("agent");
    let desc = a.register("host", host(&[], 1 << 20)).expect("registered");
    assert_eq!(tiers(&desc), [1, 0], "{DEVICE} listed first");
    let ranking = a.nic_ranking(&host_near(&desc));
    assert_eq!(
        (ranking[0].nic.as_str(), ranking[0].proximity),
        (DEVICE, Proximity::Listed)
    );
    assert!(
        ranking[0].reason.contains("by the NIC override"),
        "{ranking:?}"
    );
    let d = a
        .register_near(
            "dmabuf",
            Exporter::Udmabuf.allocate(64 << 10),
            Near::Pci("0000:00:00.0".into()),
        )
        .expect("registered near");
    assert_eq!(tiers(&d), [1, 0], "`*` covers every place");
    drop(a);

    // The environment's override, read when the agent starts, when the settings have none.
    std::env::set_var(NICS_ENV, format!("*={}", tb.device));
    let from_env = agent("tiers-env", &devices, None);
    let over_env = agent("tiers-both", &devices, Some(&format!("*={DEVICE}")));
    std::env::set_var(NICS_ENV, "gpu0=rxe0");
    let bad = agent("tiers-bad", &devices, None);
    std::env::remove_var(NICS_ENV);
    let a = from_env.expect("agent with GPU_RDMA_NICS");
    let desc = a.register("host", host(&[], 1 << 20)).expect("registered");
    assert_eq!(
        tiers(&desc),
        [0, 1],
        "{} listed first by {NICS_ENV}",
        tb.device
    );
    let b = over_env.expect("agent with both");
    let desc = b.register("host", host(&[], 1 << 20)).expect("registered");
    assert_eq!(
        tiers(&desc),
        [1, 0],
        "the settings' override wins over {NICS_ENV}"
    );
    let e = bad.expect_err("a bad GPU_RDMA_NICS refused");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let text = e.to_string();
    assert!(
        text.contains(NICS_ENV) && text.contains("\"gpu0\""),
        "{text}"
    );
}
