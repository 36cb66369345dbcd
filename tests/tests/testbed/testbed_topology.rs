//! The testbed's PCIe topology (`--topology`, which the `two_node_rails` phase boots): the
//! guest kernel sees each NIC and the GPU where the testbed placed them (the PCIe path from
//! sysfs, the host bridge, the NUMA node, the link speed), and the GPU, a `virtio-gpu-pci`
//! behind a PCIe switch, exports a dumb buffer that rxe registers as a dma-buf region and the
//! peer RDMA-writes into, every byte checked through drm-export's CPU mapping.

use integration_tests::testbed::Testbed;

/// What `--topology` tells the command (docs/testbed.md, "PCIe topology").
struct Topology {
    /// The GPU's DRM card (`card1`).
    gpu_card: String,
    /// The GPU's PCI function (`0000:23:00.0`).
    gpu_pci: String,
    /// The GPU's NUMA node as placed.
    gpu_numa: i32,
    /// Each NIC's PCI function, in `RDMA_DEVICES` order.
    nic_pci: Vec<String>,
    /// Each NIC's tier relative to the GPU as placed.
    nic_tiers: Vec<String>,
    /// Each NIC's NUMA node as placed.
    nic_numa: Vec<i32>,
    /// Each NIC's link speed, Mb/s.
    nic_speeds: Vec<u32>,
}

impl Topology {
    /// Reads the environment; panics (fails the test) when the testbed did not boot with
    /// `--topology`.
    fn get() -> Topology {
        let var = |k: &str| {
            std::env::var(k)
                .unwrap_or_else(|_| panic!("the testbed did not set {k}: no --topology"))
        };
        assert_eq!(var("TESTBED_TOPOLOGY"), "1", "booted without --topology");
        let words =
            |k: &str| -> Vec<String> { var(k).split_whitespace().map(str::to_string).collect() };
        let numbers = |k: &str| -> Vec<i32> {
            words(k)
                .iter()
                .map(|w| w.parse().unwrap_or_else(|_| panic!("{k}: {w:?}")))
                .collect()
        };
        Topology {
            gpu_card: var("TESTBED_GPU_CARD"),
            gpu_pci: var("TESTBED_GPU_PCI"),
            gpu_numa: var("TESTBED_GPU_NUMA").parse().expect("TESTBED_GPU_NUMA"),
            nic_pci: words("TESTBED_NIC_PCI"),
            nic_tiers: words("TESTBED_NIC_TIERS"),
            nic_numa: numbers("TESTBED_NIC_NUMA"),
            nic_speeds: numbers("TESTBED_NIC_SPEEDS")
                .into_iter()
                .map(|s| u32::try_from(s).expect("a speed"))
                .collect(),
        }
    }
}

/// A PCI function's place, from sysfs.
#[derive(Debug)]
struct Place {
    /// Its host bridge (`pci0000:20`).
    host_bridge: String,
    /// The PCI functions from the root port down to it (the root port first, itself last).
    chain: Vec<String>,
    /// Its `numa_node` (-1: none).
    numa: i32,
}

/// A sysfs file's text, trimmed.
fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .trim()
        .to_string()
}

/// Where the PCI function `pci` sits: its canonical sysfs path is
/// `/sys/devices/<host bridge>/<root port>/.../<pci>`.
fn place(pci: &str) -> Place {
    let link = format!("/sys/bus/pci/devices/{pci}");
    let path = std::fs::canonicalize(&link).unwrap_or_else(|e| panic!("{link}: {e}"));
    let parts: Vec<String> = path
        .strip_prefix("/sys/devices")
        .unwrap_or_else(|_| panic!("{} is not under /sys/devices", path.display()))
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let (host_bridge, chain) = parts.split_first().expect("a path");
    assert!(host_bridge.starts_with("pci"), "{}", path.display());
    assert_eq!(chain.last().map(String::as_str), Some(pci));
    Place {
        host_bridge: host_bridge.clone(),
        chain: chain.to_vec(),
        numa: read(&format!("{link}/numa_node"))
            .parse()
            .expect("numa_node"),
    }
}

/// `vendor:device` of a PCI function, as sysfs spells them (`0x1af4:0x1041`).
fn ids(pci: &str) -> String {
    let f = |k: &str| read(&format!("/sys/bus/pci/devices/{pci}/{k}"));
    format!("{}:{}", f("vendor"), f("device"))
}

/// The PCI function under a sysfs device link: virtio drivers bind to a `virtioN` below it.
fn pci_function(device_link: &str) -> String {
    let p = std::fs::canonicalize(device_link).unwrap_or_else(|e| panic!("{device_link}: {e}"));
    let name = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().into_owned();
    if name(&p).starts_with("virtio") {
        name(p.parent().unwrap())
    } else {
        name(&p)
    }
}

/// Tests of the two-node testbed with four NICs and `--topology`: `cargo xtask test` runs
/// this module there, on both nodes.
mod two_node_rails {
    use super::*;
    use drm_export::{DrmDevice, DumbBuffer};
    use integration_tests::oob;
    use integration_tests::verbs::{host_region, pattern};
    use rdma_dmabuf::{
        Access, Context, Endpoint, Local, MemoryRegion, ProtectionDomain, QueuePairBuilder,
        RemoteRegion,
    };
    use std::sync::Arc;
    use std::time::Duration;

    /// TI X3130's upstream and downstream switch ports, as QEMU emulates them.
    const SWITCH_UP: &str = "0x104c:0x8232";
    const SWITCH_DOWN: &str = "0x104c:0x8233";
    /// virtio-net and virtio-gpu (modern virtio PCI ids).
    const VIRTIO_NET: &str = "0x1af4:0x1041";
    const VIRTIO_GPU: &str = "0x1af4:0x1050";

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rails_each_nic_and_the_gpu_sit_where_the_testbed_placed_them() {
        let tb = Testbed::get();
        let topo = Topology::get();
        let n = tb.devices.len();
        assert_eq!(n, 4, "the rails phase has four NICs: {:?}", tb.devices);
        for (what, len) in [
            ("TESTBED_NIC_PCI", topo.nic_pci.len()),
            ("TESTBED_NIC_TIERS", topo.nic_tiers.len()),
            ("TESTBED_NIC_NUMA", topo.nic_numa.len()),
            ("TESTBED_NIC_SPEEDS", topo.nic_speeds.len()),
        ] {
            assert_eq!(len, n, "{what}: one word per device of RDMA_DEVICES");
        }
        assert_eq!(
            topo.nic_tiers,
            ["switch", "host-bridge", "numa", "other"],
            "one NIC per tier, nearest first"
        );

        // The GPU: behind a switch's downstream port, under a root port of its host bridge.
        let gpu = place(&topo.gpu_pci);
        assert_eq!(ids(&topo.gpu_pci), VIRTIO_GPU, "{gpu:?}");
        assert_eq!(
            gpu.chain.len(),
            4,
            "root port, switch up, switch down, GPU: {gpu:?}"
        );
        assert_eq!(ids(&gpu.chain[1]), SWITCH_UP, "{gpu:?}");
        assert_eq!(ids(&gpu.chain[2]), SWITCH_DOWN, "{gpu:?}");
        assert_eq!(gpu.numa, topo.gpu_numa, "the GPU's numa_node: {gpu:?}");
        let card = format!("/sys/class/drm/{}/device", topo.gpu_card);
        assert_eq!(pci_function(&card), topo.gpu_pci, "{card}");
        let online = read("/sys/devices/system/node/online");
        assert_eq!(online, "0-1", "two NUMA nodes");

        for (i, device) in tb.devices.iter().enumerate() {
            // Found from the RDMA device itself: rxe's parent is its netdev, whose device is
            // a virtioN below the PCI function.
            let netdev = read(&format!("/sys/class/infiniband/{device}/parent"));
            assert_eq!(netdev, tb.netdevs[i], "{device}'s netdev");
            let pci = pci_function(&format!("/sys/class/net/{netdev}/device"));
            assert_eq!(pci, topo.nic_pci[i], "{device}'s PCI function");
            assert_eq!(ids(&pci), VIRTIO_NET, "{device} at {pci}");
            let nic = place(&pci);
            let what = format!(
                "{device} ({}) at {nic:?}, GPU at {gpu:?}",
                topo.nic_tiers[i]
            );
            assert_eq!(nic.numa, topo.nic_numa[i], "numa_node of {what}");
            let same_bridge = nic.host_bridge == gpu.host_bridge;
            let same_root_port = nic.chain[0] == gpu.chain[0];
            let same_switch = nic.chain.len() == 4 && nic.chain[..2] == gpu.chain[..2];
            match topo.nic_tiers[i].as_str() {
                "switch" => {
                    assert!(same_switch, "{what}");
                    assert_ne!(nic.chain[2], gpu.chain[2], "its own switch port: {what}");
                }
                "host-bridge" => {
                    assert!(same_bridge && !same_root_port, "{what}");
                    assert_eq!(nic.chain.len(), 2, "right below a root port: {what}");
                }
                "numa" => assert!(!same_bridge && nic.numa == gpu.numa, "{what}"),
                "other" => assert!(!same_bridge && nic.numa != gpu.numa, "{what}"),
                t => panic!("unknown tier {t}"),
            }

            // The link speed the testbed gave the NIC, as the netdev and rxe report it.
            let speed = read(&format!("/sys/class/net/{netdev}/speed"));
            assert_eq!(speed, topo.nic_speeds[i].to_string(), "{netdev}'s speed");
            let rate = read(&format!("/sys/class/infiniband/{device}/ports/1/rate"));
            let gbps = format!("{} Gb/sec", topo.nic_speeds[i] / 1000);
            assert!(
                rate.starts_with(&gbps),
                "{device}'s rate {rate:?}, not {gbps}"
            );
            eprintln!(
                "{device}: {netdev} at {pci} on {}, {what}; {rate}",
                nic.host_bridge
            );
        }
    }

    const PAGE: u64 = 4096;
    /// The GPU buffer: 16 MiB, a page of untouched guard at each end.
    const SIZE: u64 = 16 << 20;
    const PORT: u16 = 18_790;
    const RW: Access = Access::LOCAL_WRITE
        .union(Access::REMOTE_WRITE)
        .union(Access::REMOTE_READ);
    /// What the buffer holds before the peer writes.
    const FILL: u8 = 0xe7;

    /// Each node allocates a dumb buffer on the virtio-gpu card, exports it (PRIME),
    /// registers the dma-buf on rxe0 (the NIC behind the GPU's switch), and the peer writes
    /// into all but its first and last page over rail 0; the buffer is then read through
    /// drm-export's mapping.
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rails_a_virtio_gpu_dumb_buffer_takes_an_rdma_write_from_the_peer() {
        let tb = Testbed::get();
        let topo = Topology::get();
        let card = Arc::new(
            DrmDevice::open(format!("/dev/dri/{}", topo.gpu_card)).expect("the GPU's card"),
        );
        assert_eq!(card.driver().name, "virtio_gpu", "{}", topo.gpu_card);
        let buffer = DumbBuffer::new(&card, SIZE).expect("a dumb buffer on virtio-gpu");
        assert!(buffer.size() >= SIZE, "{} bytes", buffer.size());
        let mut dmabuf = buffer.export().expect("PRIME export of the dumb buffer");
        eprintln!(
            "dumb buffer of {} bytes exported by {:?}",
            dmabuf.size(),
            dmabuf.exporter()
        );
        dmabuf
            .map()
            .expect("map the dma-buf")
            .write()
            .expect("begin CPU write")
            .fill(FILL);

        // rxe0: the NIC behind the GPU's own switch.
        assert_eq!(topo.nic_tiers[0], "switch");
        let ctx = Context::open(&tb.devices[0]).expect("rxe0");
        let pd: Arc<ProtectionDomain> = ProtectionDomain::new(&ctx).expect("pd");
        let len = SIZE - 2 * PAGE;
        let region = MemoryRegion::register_dmabuf(&pd, dmabuf, PAGE, len, None, RW)
            .expect("register the GPU's dma-buf on rxe0");
        let qp = QueuePairBuilder::new(&pd).build().expect("qp");
        let mine = [
            qp.endpoint().to_bytes().as_slice(),
            &region.remote().expect("remote").to_bytes(),
        ]
        .concat();
        let theirs = if tb.is_server() {
            oob::serve(&tb.local_addr, PORT, &mine)
        } else {
            oob::connect(&tb.peer_addr, PORT, &mine)
        };
        let (ep, rr) = theirs.split_at(Endpoint::WIRE_LEN);
        let qp = qp
            .connect(&Endpoint::from_bytes(ep).expect("endpoint"))
            .expect("connect");
        let remote = RemoteRegion::from_bytes(rr).expect("the peer's region");
        assert_eq!(remote.len, len);
        let note = qp
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .expect("post the note's receive");

        // Write this node's pattern into the peer's GPU buffer, then tell it.
        let (me, peer) = if tb.is_server() { (1, 2) } else { (2, 1) };
        let n = usize::try_from(len).unwrap();
        let src = host_region(&pd, &pattern(n, me), n, Access::empty());
        let done = qp
            .post_write(Local::new(src, 0..len), remote, None)
            .expect("post the write")
            .spin()
            .unwrap_or_else(|e| panic!("RDMA write into the peer's GPU buffer: {}", e.error));
        drop(done);
        let sent = host_region(&pd, b"done", 64, Access::empty());
        qp.post_send(Local::new(sent, 0..4), Some(me.into()))
            .expect("post the note")
            .spin()
            .unwrap_or_else(|e| panic!("note: {}", e.error));
        let got = note
            .spin_timeout(Duration::from_secs(300))
            .expect("the peer's note arrives")
            .expect("the note");
        assert_eq!(got.wc.imm, Some(peer.into()), "the peer wrote first");

        // Every byte of this node's GPU buffer, through drm-export's CPU mapping.
        drop(qp);
        let mut dmabuf = region.into_inner().expect("deregister");
        let map = dmabuf.map().expect("map the dma-buf again");
        let seen = map.read().expect("begin CPU read").to_vec();
        let page = usize::try_from(PAGE).unwrap();
        assert_eq!(seen.len(), usize::try_from(SIZE).unwrap());
        assert!(
            seen[..page].iter().all(|&b| b == FILL),
            "the first page was written"
        );
        assert!(
            seen[page + n..].iter().all(|&b| b == FILL),
            "the last page was written"
        );
        let want = pattern(n, peer);
        if let Some(at) = (0..n).find(|&i| seen[page + i] != want[i]) {
            panic!(
                "byte {at} of the written range: {:#04x}, the peer wrote {:#04x}",
                seen[page + at],
                want[at]
            );
        }
        eprintln!("{n} bytes RDMA-written into the virtio-gpu buffer by the peer, all right");
    }
}
