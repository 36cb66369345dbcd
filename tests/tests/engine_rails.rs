//! The transfer engine over several rails (the testbed's `--nics 4`: rxe0..rxe3 on four
//! links between the two nodes): one batch is striped over the rails both agents use (rail i
//! to the peer's rail i), every byte lands, and each rail carries its share of the bytes,
//! read from the kernel's own counters of the links (the netdevs' `tx_bytes`), not from the
//! engine. Needs the two-node testbed with four NICs (`cargo xtask test` runs the module
//! `two_node_rails` there).

use gpu_rdma_engine::{Agent, Batch, Error, Memory, Settings};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use rdma_dmabuf::HostBuffer;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PORT: u16 = 18_760;
/// The bytes of each batch: many chunks per rail at the engine's default chunk size, so that
/// a rail's share of them is within a chunk of exact.
const BYTES: u64 = 32 << 20;
const BLOCK: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(300);

/// An agent on the first `rails` devices of this node, bound to `bind`.
fn agent(tb: &Testbed, name: &str, rails: usize, bind: SocketAddr) -> Agent {
    let settings = Settings {
        devices: Some(tb.devices[..rails].to_vec()),
        bind,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

/// Bytes each netdev of this node has sent so far.
fn sent(tb: &Testbed) -> Vec<u64> {
    tb.netdevs
        .iter()
        .map(|d| {
            std::fs::read_to_string(format!("/sys/class/net/{d}/statistics/tx_bytes"))
                .expect("tx_bytes")
                .trim()
                .parse()
                .expect("a count")
        })
        .collect()
}

/// Tests of the two-node testbed with four NICs per node: `cargo xtask test` runs this
/// module on both nodes.
mod two_node_rails {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rails_stripe_a_batch_evenly_and_every_byte_lands() {
        let tb = Testbed::get();
        assert_eq!(
            tb.devices.len(),
            4,
            "the testbed's --nics 4: {:?}",
            tb.devices
        );
        assert_eq!(tb.netdevs.len(), 4, "{:?}", tb.netdevs);
        for rails in [1usize, 2, 4] {
            let src = pattern(BYTES as usize, rails as u8);
            let port = PORT + rails as u16;
            if tb.is_server() {
                let a = agent(
                    &tb,
                    "a",
                    rails,
                    format!("{}:{port}", tb.local_addr).parse().unwrap(),
                );
                a.register("dst", HostBuffer::new(BYTES as usize).unwrap())
                    .unwrap();
                let note = a.wait_notification(WAIT).expect("b's notification");
                assert_eq!(&note.message[..], b"landed");
                let Memory::Host(dst) = a.unregister("dst").unwrap() else {
                    panic!("host memory back")
                };
                assert!(dst.as_slice() == &src[..], "{rails} rails: bytes differ");
            } else {
                let b = agent(
                    &tb,
                    "b",
                    rails,
                    format!("{}:0", tb.local_addr).parse().unwrap(),
                );
                b.add_peer("a", format!("{}:{port}", tb.peer_addr).parse().unwrap());
                let mut h = HostBuffer::new(BYTES as usize).unwrap();
                h.as_mut_slice().copy_from_slice(&src);
                b.register("src", h).unwrap();
                // Blocks written in a scattered order, in one batch.
                let blocks = BYTES / BLOCK;
                let batch = (0..blocks).fold(Batch::new(), |batch, j| {
                    let k = (j * 7) % blocks;
                    batch.write("src", k * BLOCK, "a", "dst", k * BLOCK, BLOCK)
                });
                let batch = batch.notify(b"landed".to_vec());
                let before = sent(&tb);
                let start = Instant::now();
                let t = loop {
                    // Node a may still be starting: retry while its listener is not there.
                    match b.transfer(&batch) {
                        Err(Error::Io { .. } | Error::UnknownSegment { .. })
                            if start.elapsed() < Duration::from_secs(120) =>
                        {
                            std::thread::sleep(Duration::from_millis(200));
                        }
                        other => break other.expect("batch accepted"),
                    }
                };
                t.wait(WAIT).expect("every block written");
                let took = start.elapsed();
                let after = sent(&tb);
                let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
                let total: u64 = moved.iter().sum();
                eprintln!(
                    "RESULT rails={rails} bytes_per_rail={moved:?} secs={:.2} MiBps={:.1}",
                    took.as_secs_f64(),
                    BYTES as f64 / took.as_secs_f64() / f64::from(1 << 20)
                );
                assert!(total >= BYTES, "{rails} rails: only {total} bytes sent");
                let share = total as f64 / rails as f64;
                for (i, &m) in moved.iter().enumerate() {
                    if i < rails {
                        assert!(
                            (m as f64 - share).abs() <= 0.10 * share,
                            "{rails} rails: rail {i} sent {m} bytes, its share is {share:.0}: \
                             {moved:?}"
                        );
                    } else {
                        // Control traffic (the TCP of the metadata channel) goes over rail 0;
                        // an unused rail carries next to nothing.
                        assert!(
                            m < BYTES / 100,
                            "{rails} rails: unused rail {i} sent {m} bytes: {moved:?}"
                        );
                    }
                }
            }
        }
    }
}
