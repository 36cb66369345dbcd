//! The transfer engine across the wire: node a's agent serves a segment, node b's writes
//! scattered blocks into it, reads them back, and notifies a. Needs the two-node testbed.

use gpu_rdma_engine::{Agent, Batch, Error, Memory, Settings};
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use rdma_dmabuf::HostBuffer;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PORT: u16 = 18_700;
const BLOCK: u64 = 64 << 10;
const BLOCKS: u64 = 64;
const SRC: u64 = 4 << 20;

fn agent(tb: &Testbed, name: &str, bind: SocketAddr) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

fn bytes(m: Memory) -> Vec<u8> {
    match m {
        Memory::Host(h) => h.as_slice().to_vec(),
        Memory::DmaBuf(mut d) => Exporter::read(&mut d),
        other => panic!("no bytes to read in {other:?}"),
    }
}

/// Where block `j` goes in a's segment, and where it comes from in b's source.
fn slot(j: u64) -> u64 {
    ((j * 37) % BLOCKS) * BLOCK
}
fn src_off(j: u64) -> u64 {
    ((j * 7) % (SRC / BLOCK)) * BLOCK
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_engine_scattered_writes_read_back_and_notify() {
        let tb = Testbed::get();
        let src = pattern(SRC as usize, 21);
        if tb.is_server() {
            let a = agent(
                &tb,
                "a",
                format!("{}:{PORT}", tb.local_addr).parse().unwrap(),
            );
            a.register("dst", Exporter::Vgem.allocate(BLOCKS * BLOCK))
                .unwrap();
            let note = a
                .wait_notification(Duration::from_secs(240))
                .expect("b's notification");
            assert_eq!(
                (note.from.as_str(), &note.message[..]),
                ("b", &b"all landed"[..])
            );
            let dst = bytes(a.unregister("dst").unwrap());
            for j in 0..BLOCKS {
                let want = &src[src_off(j) as usize..(src_off(j) + BLOCK) as usize];
                assert!(
                    dst[slot(j) as usize..(slot(j) + BLOCK) as usize] == *want,
                    "block {j}"
                );
            }
        } else {
            let b = agent(&tb, "b", format!("{}:0", tb.local_addr).parse().unwrap());
            b.add_peer("a", format!("{}:{PORT}", tb.peer_addr).parse().unwrap());
            let mut d = Exporter::Udmabuf.allocate(SRC);
            Exporter::fill(&mut d, 0, &src);
            b.register("src", d).unwrap();
            b.register("back", HostBuffer::new((BLOCKS * BLOCK) as usize).unwrap())
                .unwrap();
            let mut write = Batch::new();
            let mut read = Batch::new();
            for j in 0..BLOCKS {
                write = write.write("src", src_off(j), "a", "dst", slot(j), BLOCK);
                read = read.read("back", j * BLOCK, "a", "dst", slot(j), BLOCK);
            }
            // Node a may still be starting: retry while its listener is not there.
            let start = Instant::now();
            let t = loop {
                match b.transfer(&write) {
                    Err(Error::Io { .. } | Error::UnknownSegment { .. })
                        if start.elapsed() < Duration::from_secs(120) =>
                    {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                    other => break other.expect("write accepted"),
                }
            };
            t.wait(Duration::from_secs(120)).expect("written");
            let t0 = Instant::now();
            b.transfer(&read.notify(b"all landed".to_vec()))
                .unwrap()
                .wait(Duration::from_secs(120))
                .expect("read back and notified");
            eprintln!(
                "{BLOCKS} blocks read back across the wire in {:?}",
                t0.elapsed()
            );
            let back = bytes(b.unregister("back").unwrap());
            for j in 0..BLOCKS {
                let want = &src[src_off(j) as usize..(src_off(j) + BLOCK) as usize];
                assert!(
                    back[(j * BLOCK) as usize..((j + 1) * BLOCK) as usize] == *want,
                    "block {j}"
                );
            }
        }
    }
}
