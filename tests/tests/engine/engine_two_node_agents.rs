//! The transfer engine across the wire with several agents per node: four agents (two per
//! node) writing to each other all to all, and a peer killed mid-batch (node a's agent
//! dropped while node b's writes to it are in flight: node b's entries fail typed within
//! the bound, and node a's second agent keeps working). Needs the two-node testbed.

use gpu_rdma_engine::{Agent, Batch, Error, Settings, Transfer};
use integration_tests::engine::{bytes, host};
use integration_tests::oob;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(240);
const BLOCK: u64 = 256 << 10;
/// The agents: (name, node, control port).
const AGENTS: [(&str, char, u16); 4] = [
    ("a1", 'a', 18_720),
    ("a2", 'a', 18_721),
    ("b1", 'b', 18_722),
    ("b2", 'b', 18_723),
];

fn agent(tb: &Testbed, name: &str, port: u16) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: format!("{}:{port}", tb.local_addr).parse().unwrap(),
        chunk_size: 64 << 10,
        ..Settings::default()
    };
    Agent::new(name, settings).expect("agent")
}

/// Names every other agent of `AGENTS` to `a`.
fn add_peers(tb: &Testbed, a: &Agent) {
    for (name, node, port) in AGENTS {
        if name != a.name() {
            let host = if node == tb.node {
                &tb.local_addr
            } else {
                &tb.peer_addr
            };
            a.add_peer(name, format!("{host}:{port}").parse().unwrap());
        }
    }
}

/// Transfers `batch`, retrying while a peer's listener or segment is not there yet (the
/// other node may still be starting).
fn transfer(a: &Agent, batch: &Batch) -> Transfer {
    let start = Instant::now();
    loop {
        match a.transfer(batch) {
            Err(Error::Io { .. } | Error::UnknownSegment { .. })
                if start.elapsed() < Duration::from_secs(120) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => break other.expect("accepted"),
        }
    }
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_engine_four_agents_write_all_to_all() {
        let tb = Testbed::get();
        let mine: Vec<(usize, Agent)> = AGENTS
            .iter()
            .enumerate()
            .filter(|(_, (_, node, _))| *node == tb.node)
            .map(|(i, (name, _, port))| (i, agent(&tb, name, *port)))
            .collect();
        for (i, a) in &mine {
            a.register(
                "src",
                host(&pattern(BLOCK as usize, *i as u8), BLOCK as usize),
            )
            .unwrap();
            a.register("dst", host(&[], (BLOCK * 4) as usize)).unwrap();
            add_peers(&tb, a);
        }
        // Each agent writes its block into slot i of every other agent's dst, and notifies.
        let t0 = Instant::now();
        let running: Vec<Transfer> = mine
            .iter()
            .map(|(i, a)| {
                let batch = AGENTS
                    .iter()
                    .filter(|(name, _, _)| *name != a.name())
                    .fold(Batch::new(), |b, (name, _, _)| {
                        b.write("src", 0, name, "dst", *i as u64 * BLOCK, BLOCK)
                    })
                    .notify(a.name().as_bytes().to_vec());
                transfer(a, &batch)
            })
            .collect();
        for t in &running {
            t.wait(WAIT).expect("written to the three others");
        }
        eprintln!(
            "node {}: both agents' batches done in {:?}",
            tb.node,
            t0.elapsed()
        );
        for (i, a) in &mine {
            let mut from: Vec<String> = (0..3)
                .map(|_| a.wait_notification(WAIT).expect("a notification").from)
                .collect();
            from.sort();
            let others: Vec<&str> = AGENTS
                .iter()
                .map(|x| x.0)
                .filter(|n| *n != a.name())
                .collect();
            assert_eq!(from, others, "{}'s notifications", a.name());
            let dst = bytes(a.unregister("dst").unwrap());
            for j in (0..4).filter(|j| j != i) {
                let at = j * BLOCK as usize..(j + 1) * BLOCK as usize;
                assert!(
                    dst[at] == pattern(BLOCK as usize, j as u8),
                    "{}'s slot {j}",
                    a.name()
                );
            }
        }
        // Neither node's agents go away before the other node has checked its own.
        let end = 18_725;
        if tb.is_server() {
            oob::serve(&tb.local_addr, end, b"a checked");
        } else {
            oob::connect(&tb.peer_addr, end, b"b checked");
        }
    }

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_engine_peer_killed_mid_batch() {
        let tb = Testbed::get();
        const BIG: usize = 64 << 20;
        let (sync, end) = (18_726, 18_727);
        if tb.is_server() {
            let k = agent(&tb, "a1", AGENTS[0].2);
            let s = agent(&tb, "a2", AGENTS[1].2);
            k.register("dst", host(&[], BIG)).unwrap();
            s.register("dst", host(&[], 1 << 20)).unwrap();
            // b says when its batch to a1 is in flight; a1 dies 100 ms later.
            oob::serve(&tb.local_addr, sync, b"ready");
            std::thread::sleep(Duration::from_millis(100));
            drop(k);
            eprintln!("node a: a1 dropped mid-batch");
            let note = s.wait_notification(WAIT).expect("b1's note to a2");
            assert_eq!(note.from, "b1");
            assert_eq!(bytes(s.unregister("dst").unwrap()), pattern(1 << 20, 3));
            oob::serve(&tb.local_addr, end, b"a done");
        } else {
            let b = agent(&tb, "b1", AGENTS[2].2);
            add_peers(&tb, &b);
            b.register("big", host(&pattern(BIG, 2), BIG)).unwrap();
            b.register("small", host(&pattern(1 << 20, 3), 1 << 20))
                .unwrap();
            let t = transfer(
                &b,
                &Batch::new().write("big", 0, "a1", "dst", 0, BIG as u64),
            );
            oob::connect(&tb.peer_addr, sync, b"in flight");
            let told = Instant::now();
            let bound = Settings::default().peer_failure_bound();
            let r = t.wait(WAIT);
            let took = told.elapsed();
            eprintln!("node b: the batch to a1 ended {took:?} after a1 was told to die: {r:?}");
            match r {
                Err(Error::EntryFailed { error, .. }) => {
                    assert!(matches!(*error, Error::PeerDown { .. }), "{error:?}")
                }
                other => panic!("a batch to a killed peer gave {other:?}"),
            }
            // Told + 100 ms + the bound, with slack for a starved guest.
            assert!(
                took < bound + Duration::from_secs(10),
                "{took:?} (bound {bound:?})"
            );
            // a2, in the same process as the dead a1, keeps working.
            transfer(
                &b,
                &Batch::new()
                    .write("small", 0, "a2", "dst", 0, 1 << 20)
                    .notify(b"after".to_vec()),
            )
            .wait(WAIT)
            .expect("a2 still works");
            oob::connect(&tb.peer_addr, end, b"b done");
        }
    }
}
