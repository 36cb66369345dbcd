//! The transfer engine over several rails (the testbed's `--nics 4`: rxe0..rxe3 on four
//! links between the two nodes): one batch is striped over the rails both agents use (rail i
//! to the peer's rail i), every byte lands, and each rail carries its share of the bytes,
//! read from the kernel's own counters of the links (the netdevs' `tx_bytes`), not from the
//! engine. Needs the two-node testbed with four NICs (`cargo xtask test` runs the module
//! `two_node_rails` there).

use gpu_rdma_engine::{Agent, Batch, EntryStatus, Error, ErrorKind, Memory, Settings};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use rdma_dmabuf::HostBuffer;
use std::net::SocketAddr;
use std::process::Command;
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

/// Bytes each netdev of this node has sent since `before` (a [`sent`] reading).
fn sent_since(tb: &Testbed, before: &[u64]) -> Vec<u64> {
    sent(tb).iter().zip(before).map(|(a, b)| a - b).collect()
}

/// Takes `netdev` down or up (`ip link set`), as a cut cable or a dead switch port would.
fn link(netdev: &str, up: bool) {
    let state = if up { "up" } else { "down" };
    let ok = Command::new("ip")
        .args(["link", "set", netdev, state])
        .status()
        .expect("ip")
        .success();
    assert!(ok, "ip link set {netdev} {state}");
}

/// Waits (bounded) until `device`'s port is ACTIVE again.
fn active(device: &str) {
    let state = format!("/sys/class/infiniband/{device}/ports/1/state");
    let start = Instant::now();
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{device} stays down"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A batch of `bytes` in blocks of [`BLOCK`], written in a scattered order.
fn scattered(bytes: u64) -> Batch {
    let blocks = bytes / BLOCK;
    (0..blocks).fold(Batch::new(), |batch, j| {
        let k = (j * 7) % blocks;
        batch.write("src", k * BLOCK, "a", "dst", k * BLOCK, BLOCK)
    })
}

/// `b.transfer(batch)`, retried while node a is still starting.
fn submit(b: &Agent, batch: &Batch) -> gpu_rdma_engine::Transfer {
    let start = Instant::now();
    loop {
        match b.transfer(batch) {
            Err(Error::Io { .. } | Error::UnknownSegment { .. })
                if start.elapsed() < Duration::from_secs(120) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other.expect("batch accepted"),
        }
    }
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
                let batch = scattered(BYTES).notify(b"landed".to_vec());
                let before = sent(&tb);
                let start = Instant::now();
                let t = submit(&b, &batch);
                t.wait(WAIT).expect("every block written");
                let took = start.elapsed();
                let moved = sent_since(&tb, &before);
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

    /// A rail cut under a batch (its link taken down on the sending node after the
    /// connections are made, before the batch is submitted, so that the rail's chunks meet
    /// the cut whatever the timing: a worker runs a batch's rails one after another, so a
    /// cut timed "in the middle" may fall after the rail's chunks are done): the batch is
    /// never reported done for bytes that did not land; it ends with a typed error within
    /// the engine's stated bound ([`Settings::peer_failure_bound`]). With the link back, the
    /// next batch is striped over every rail again, the cut one included, and every byte
    /// lands. (Failing over to the other rails within the batch is issue 39's next step;
    /// this pins what holds until then.)
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rails_a_cut_rail_fails_its_batch_typed_within_the_bound_and_is_taken_back() {
        const CUT_BYTES: u64 = 64 << 20;
        let tb = Testbed::get();
        let port = PORT + 10;
        let src = pattern(CUT_BYTES as usize, 77);
        if tb.is_server() {
            let a = agent(
                &tb,
                "a",
                4,
                format!("{}:{port}", tb.local_addr).parse().unwrap(),
            );
            a.register("dst", HostBuffer::new(CUT_BYTES as usize).unwrap())
                .unwrap();
            let note = a.wait_notification(WAIT).expect("b's notification");
            assert_eq!(&note.message[..], b"back");
            let Memory::Host(dst) = a.unregister("dst").unwrap() else {
                panic!("host memory back")
            };
            assert!(
                dst.as_slice() == &src[..],
                "bytes differ after the rail came back"
            );
            return;
        }
        let b = agent(&tb, "b", 4, format!("{}:0", tb.local_addr).parse().unwrap());
        let bound = Settings::default().peer_failure_bound();
        b.add_peer("a", format!("{}:{port}", tb.peer_addr).parse().unwrap());
        let mut h = HostBuffer::new(CUT_BYTES as usize).unwrap();
        h.as_mut_slice().copy_from_slice(&src);
        b.register("src", h).unwrap();
        let batch = scattered(CUT_BYTES);
        // Connections made first, so that the cut falls in the middle of the data.
        submit(&b, &scattered(4 * BLOCK))
            .wait(WAIT)
            .expect("warm-up");
        let cut_at = Instant::now();
        link(&tb.netdevs[1], false);
        let t = b.transfer(&batch).expect("batch accepted");
        let ended = t.wait(bound + Duration::from_secs(10));
        let took = cut_at.elapsed();
        let status = t.status();
        let done = status.iter().filter(|s| **s == EntryStatus::Done).count();
        eprintln!(
            "RESULT cut: ended after {:.1} s (bound {:.1} s), {done} of {} blocks done: {ended:?}",
            took.as_secs_f64(),
            bound.as_secs_f64(),
            status.len()
        );
        link(&tb.netdevs[1], true);
        let err = ended.expect_err("a batch with a cut rail is not done");
        assert!(
            matches!(err.kind(), ErrorKind::PeerDown),
            "typed as the peer's rail being down: {err}"
        );
        assert!(t.is_finished(), "finished (failed), not pending");
        assert!(
            done < status.len(),
            "some blocks cannot have landed: {status:?}"
        );
        assert!(
            took <= bound + Duration::from_secs(5),
            "ended after {took:?}, bound {bound:?}"
        );
        active(&tb.devices[1]);
        // The rail is taken back: the next batch uses all four again.
        let before = sent(&tb);
        let start = Instant::now();
        let back = batch.notify(b"back".to_vec());
        loop {
            match b.transfer(&back).and_then(|t| t.wait(WAIT)) {
                Ok(()) => break,
                Err(e) if start.elapsed() < Duration::from_secs(60) => {
                    eprintln!("again: {e}");
                    std::thread::sleep(Duration::from_secs(1));
                }
                Err(e) => panic!("the batch after the rail came back: {e}"),
            }
        }
        let moved = sent_since(&tb, &before);
        eprintln!("RESULT back: bytes_per_rail={moved:?}");
        assert!(
            moved[1] >= CUT_BYTES / 8,
            "the cut rail carried {} bytes after it came back: {moved:?}",
            moved[1]
        );
    }
}
