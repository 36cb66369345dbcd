//! `--topology`: a PCIe tree with two NUMA nodes around a GPU, and the NICs placed at every
//! distance from it, so that code which ranks NICs by their PCIe path sees a real tree.
//!
//! Each VM gets two NUMA nodes (half its memory each, its vCPU on node 0; QEMU describes them
//! to the guest in ACPI's SRAT), three PCIe expander bridges (`pxb-pcie`, each a host bridge
//! of its own with a `numa_node`), root ports below them, and a PCIe switch (QEMU's TI X3130,
//! `x3130-upstream` with `xio3130-downstream` ports) below the first root port. The GPU is a
//! `virtio-gpu-pci` behind the switch. NIC i (rail i) sits at [`NICS`]`[i]`:
//!
//! | rail | tier | host bridge (NUMA node) | port | speed |
//! | --- | --- | --- | --- | --- |
//! | GPU | - | `pxb0` (0) | switch port `swp0` under root port `rp0` | - |
//! | 0 | `switch` | `pxb0` (0) | switch port `swp1` under root port `rp0` | 25000 Mb/s |
//! | 1 | `host-bridge` | `pxb0` (0) | root port `rp1` | 25000 Mb/s |
//! | 2 | `numa` | `pxb1` (0) | root port `rp2` | 10000 Mb/s |
//! | 3 | `other` | `pxb2` (1) | root port `rp3` | 10000 Mb/s |

/// Where a NIC sits relative to the GPU: the tiers a NIC ranking tells apart, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// Behind the same PCIe switch as the GPU.
    Switch,
    /// Behind another root port of the GPU's host bridge (root complex).
    HostBridge,
    /// Behind another host bridge on the GPU's NUMA node.
    Numa,
    /// On the other NUMA node.
    Other,
}

impl Tier {
    /// The tier's name in `TESTBED_NIC_TIERS`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Switch => "switch",
            Tier::HostBridge => "host-bridge",
            Tier::Numa => "numa",
            Tier::Other => "other",
        }
    }
}

/// A host bridge: a PCIe expander bridge on the root complex's bus.
#[derive(Debug)]
pub struct Bridge {
    /// Its QEMU id.
    pub id: &'static str,
    /// The first bus number below it (the guest names its root bus so: `pci0000:<bus>`).
    pub bus_nr: u8,
    /// Its NUMA node.
    pub numa: u8,
}

/// The host bridges, in the order QEMU creates them.
pub const BRIDGES: [Bridge; 3] = [
    Bridge {
        id: "pxb0",
        bus_nr: 0x20,
        numa: 0,
    },
    Bridge {
        id: "pxb1",
        bus_nr: 0x40,
        numa: 0,
    },
    Bridge {
        id: "pxb2",
        bus_nr: 0x60,
        numa: 1,
    },
];

/// Where one NIC is placed.
#[derive(Debug)]
pub struct Slot {
    /// Its tier relative to the GPU.
    pub tier: Tier,
    /// The QEMU id of the port it is plugged into.
    pub port: &'static str,
    /// Its host bridge (an index into [`BRIDGES`]).
    pub bridge: usize,
    /// Its link speed, Mb/s (full duplex), which rxe reports as the port's speed and width.
    pub speed_mbps: u32,
}

/// NIC i's place (rail i): one NIC at each tier, nearest first.
pub const NICS: [Slot; 4] = [
    Slot {
        tier: Tier::Switch,
        port: "swp1",
        bridge: 0,
        speed_mbps: 25_000,
    },
    Slot {
        tier: Tier::HostBridge,
        port: "rp1",
        bridge: 0,
        speed_mbps: 25_000,
    },
    Slot {
        tier: Tier::Numa,
        port: "rp2",
        bridge: 1,
        speed_mbps: 10_000,
    },
    Slot {
        tier: Tier::Other,
        port: "rp3",
        bridge: 2,
        speed_mbps: 10_000,
    },
];

/// The GPU's host bridge (an index into [`BRIDGES`]) and port.
pub const GPU_BRIDGE: usize = 0;
/// The switch port the GPU is plugged into.
pub const GPU_PORT: &str = "swp0";

/// The NUMA nodes each VM has.
pub const NUMA_NODES: u8 = 2;

/// QEMU's options for the NUMA nodes (`mem_mib` split between them), the host bridges, the
/// ports, the switch and the GPU. The NICs are added by the caller with [`nic_props`].
pub fn qemu_args(mem_mib: u32) -> Vec<String> {
    let half = mem_mib / 2;
    let mut a = Vec::new();
    let mut arg = |k: &str, v: String| {
        a.push(k.to_string());
        a.push(v);
    };
    for n in 0..NUMA_NODES {
        let size = if n == 0 { mem_mib - half } else { half };
        arg(
            "-object",
            format!("memory-backend-ram,id=mem{n},size={size}M"),
        );
        let cpus = if n == 0 { ",cpus=0" } else { "" };
        arg("-numa", format!("node,nodeid={n}{cpus},memdev=mem{n}"));
    }
    for b in &BRIDGES {
        arg(
            "-device",
            format!(
                "pxb-pcie,id={},bus=pcie.0,bus_nr={},numa_node={}",
                b.id, b.bus_nr, b.numa
            ),
        );
    }
    // Root ports: rp0 (the switch's) and rp1 on pxb0, rp2 on pxb1, rp3 on pxb2; each port a
    // chassis of its own, so (chassis, slot) pairs never clash.
    for (i, bridge) in [0usize, 0, 1, 2].into_iter().enumerate() {
        arg(
            "-device",
            format!(
                "pcie-root-port,id=rp{i},bus={},chassis={},slot=0",
                BRIDGES[bridge].id,
                i + 1
            ),
        );
    }
    arg("-device", "x3130-upstream,id=sw0,bus=rp0".into());
    for p in 0..2 {
        arg(
            "-device",
            format!(
                "xio3130-downstream,id=swp{p},bus=sw0,chassis={},slot=0",
                10 + p
            ),
        );
    }
    arg("-device", format!("virtio-gpu-pci,bus={GPU_PORT},blob=off"));
    a
}

/// The `virtio-net-pci` properties that place rail `rail`'s NIC and set its link speed.
pub fn nic_props(rail: u8) -> String {
    let s = &NICS[usize::from(rail)];
    format!(",bus={},speed={},duplex=full", s.port, s.speed_mbps)
}

/// Space-separated words for the guest's environment, one per rail of `nics`.
pub fn per_nic(nics: u8, f: impl Fn(&Slot) -> String) -> String {
    NICS.iter()
        .take(nics.into())
        .map(f)
        .collect::<Vec<_>>()
        .join(" ")
}

/// The layout, one line per device, as the boot log and `dmabuf-testbed info` print it.
pub fn describe(nics: u8) -> Vec<String> {
    let bridge = |i: usize| {
        let b = &BRIDGES[i];
        format!(
            "host bridge {} (bus {:#04x}, NUMA node {})",
            b.id, b.bus_nr, b.numa
        )
    };
    let port = |p: &str| {
        if p.starts_with("swp") {
            format!("switch port {p} (switch sw0 under root port rp0)")
        } else {
            format!("root port {p}")
        }
    };
    let mut out = vec![format!(
        "GPU virtio-gpu-pci: {}, {}",
        port(GPU_PORT),
        bridge(GPU_BRIDGE)
    )];
    for (i, s) in NICS.iter().take(nics.into()).enumerate() {
        out.push(format!(
            "NIC {i} (rxe{i}): {}, {}, tier {}, {} Mb/s",
            port(s.port),
            bridge(s.bridge),
            s.tier.name(),
            s.speed_mbps
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four NICs cover every tier once, nearest first, and each tier's placement means it.
    #[test]
    fn the_nics_cover_every_tier_as_placed() {
        let tiers: Vec<_> = NICS.iter().map(|s| s.tier.name()).collect();
        assert_eq!(tiers, ["switch", "host-bridge", "numa", "other"]);
        let gpu = &BRIDGES[GPU_BRIDGE];
        for s in &NICS {
            let b = &BRIDGES[s.bridge];
            match s.tier {
                Tier::Switch => assert!(s.port.starts_with("swp") && s.port != GPU_PORT),
                Tier::HostBridge => assert!(s.bridge == GPU_BRIDGE && s.port.starts_with("rp")),
                Tier::Numa => assert!(s.bridge != GPU_BRIDGE && b.numa == gpu.numa),
                Tier::Other => assert_ne!(b.numa, gpu.numa),
            }
        }
    }

    #[test]
    fn memory_is_split_between_the_nodes_and_the_gpu_is_behind_the_switch() {
        let a = qemu_args(2048).join(" ");
        assert!(a.contains("memory-backend-ram,id=mem0,size=1024M"), "{a}");
        assert!(a.contains("node,nodeid=1,memdev=mem1"), "{a}");
        assert!(
            a.contains("pxb-pcie,id=pxb2,bus=pcie.0,bus_nr=96,numa_node=1"),
            "{a}"
        );
        assert!(a.contains("virtio-gpu-pci,bus=swp0,blob=off"), "{a}");
        assert_eq!(nic_props(3), ",bus=rp3,speed=10000,duplex=full");
        assert_eq!(per_nic(2, |s| s.tier.name().into()), "switch host-bridge");
    }
}
