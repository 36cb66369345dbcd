//! The transfer engine across the wire with the etcd backend: node a runs etcd (Debian's
//! etcd-server) on its address, and one agent on each node finds the other through it
//! alone (no `add_peer`): each writes scattered blocks into the other's segment and notifies
//! it, and each checks every byte it received. Node b's agent withdraws on drop, and node a
//! sees its keys vanish through its watch before stopping etcd. Needs the two-node testbed.

use gpu_rdma_engine::{
    Agent, Batch, Error, EtcdMetadata, EtcdSettings, Memory, MetadataService, Settings,
};
use integration_tests::etcd::Etcd;
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::sync::Arc;
use std::time::{Duration, Instant};

const ETCD_PORT: u16 = 18_790;
const BLOCK: u64 = 64 << 10;
const BLOCKS: u64 = 32;
const WAIT: Duration = Duration::from_secs(240);

/// Node `node`'s source bytes.
fn source(node: char) -> Vec<u8> {
    pattern((BLOCKS * BLOCK) as usize, node as u8)
}

/// Where block `j` of a source goes in the other node's segment.
fn slot(j: u64) -> u64 {
    ((j * 13) % BLOCKS) * BLOCK
}

/// The etcd backend at node a's address; node b retries until node a's etcd answers.
fn backend(tb: &Testbed) -> Arc<EtcdMetadata> {
    let host = if tb.is_server() {
        &tb.local_addr
    } else {
        &tb.peer_addr
    };
    let settings = EtcdSettings {
        endpoints: vec![format!("http://{host}:{ETCD_PORT}")],
        // A guest under TCG answers slowly.
        timeout: Duration::from_secs(5),
        ..EtcdSettings::default()
    };
    let t0 = Instant::now();
    loop {
        match EtcdMetadata::new(settings.clone()) {
            Ok(m) => return Arc::new(m),
            Err(_) if t0.elapsed() < WAIT => std::thread::sleep(Duration::from_millis(500)),
            Err(e) => panic!("etcd at node a: {e}"),
        }
    }
}

/// The segment's bytes, handed back by `unregister`.
fn bytes(m: Memory) -> Vec<u8> {
    match m {
        Memory::DmaBuf(mut d) => Exporter::read(&mut d),
        Memory::Host(h) => h.as_slice().to_vec(),
        other => panic!("no bytes to read in {other:?}"),
    }
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_engine_agents_find_each_other_through_etcd_and_write_both_ways() {
        let tb = Testbed::get();
        let (me, other) = if tb.is_server() {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let etcd = tb
            .is_server()
            .then(|| Etcd::start_at("two-node", tb.local_addr.parse().unwrap(), ETCD_PORT));
        let m = backend(&tb);
        let settings = Settings {
            devices: Some(vec![tb.device.clone()]),
            // Published in etcd: an address the other node reaches.
            bind: format!("{}:0", tb.local_addr).parse().unwrap(),
            ..Settings::default()
        };
        let agent = Agent::with_metadata(me, settings, m.clone()).expect("agent");
        let mut src = Exporter::Udmabuf.allocate(BLOCKS * BLOCK);
        Exporter::fill(&mut src, 0, &source(me.chars().next().unwrap()));
        agent.register("src", src).unwrap();
        agent
            .register("dst", Exporter::Vgem.allocate(BLOCKS * BLOCK))
            .unwrap();
        let mut write = Batch::new();
        for j in 0..BLOCKS {
            write = write.write("src", j * BLOCK, other, "dst", slot(j), BLOCK);
        }
        let write = write.notify(format!("{me} wrote").into_bytes());
        // The other agent may not be published yet: look again while etcd does not know it
        // or its segment.
        let t0 = Instant::now();
        let t = loop {
            match agent.transfer(&write) {
                Err(Error::UnknownAgent(_) | Error::UnknownSegment { .. })
                    if t0.elapsed() < WAIT =>
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => break other.expect("write accepted"),
            }
        };
        t.wait(WAIT).expect("written and notified");
        let note = agent.wait_notification(WAIT).expect("the other's note");
        assert_eq!(note.from, other);
        assert_eq!(note.message, format!("{other} wrote").into_bytes());
        let dst = bytes(agent.unregister("dst").unwrap());
        let want = source(other.chars().next().unwrap());
        for j in 0..BLOCKS {
            let at = slot(j) as usize..(slot(j) + BLOCK) as usize;
            let from = (j * BLOCK) as usize..((j + 1) * BLOCK) as usize;
            assert!(dst[at] == want[from], "block {j} from {other}");
        }
        if tb.is_server() {
            // Node b withdraws when its agent drops: its record vanishes from etcd, and
            // this node's watch sees it, before etcd stops.
            let t0 = Instant::now();
            while !matches!(m.lookup("b"), Err(Error::UnknownAgent(_))) {
                assert!(t0.elapsed() < WAIT, "b's keys are still in etcd");
                std::thread::sleep(Duration::from_millis(200));
            }
            drop(agent);
            drop(etcd);
        } else {
            drop(agent);
        }
    }
}
