//! The transfer engine's transfer path on one node (rxe loopback): a batch awaited on a
//! tokio runtime, chunks spread over several queue pairs, a batch to a dead peer that does
//! not hold up a batch to a healthy one, batches that read one segment side by side and a
//! read into it that waits for them, and a forged rkey refused by the NIC. Needs the
//! testbed VM.

use gpu_rdma_engine::{
    Agent, AgentDescriptor, Auth, Batch, EmbeddedMetadata, EntryStatus, Error, MetadataService,
    PeerRecord, Settings, Transfer,
};
use integration_tests::engine::{bytes, host, loopback_settings};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);

fn settings(tb: &Testbed, chunk: u64) -> Settings {
    loopback_settings(tb, chunk)
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_batches_awaited_on_tokio_over_three_queue_pairs() {
    let tb = Testbed::get();
    let three = Settings {
        queue_pairs: 3,
        ..settings(&tb, 16 << 10)
    };
    let a = Agent::new("a", three.clone()).unwrap();
    let b = Agent::new("b", three).unwrap();
    a.add_peer("b", b.address());
    const LEN: usize = 8 << 20;
    a.register("src", host(&pattern(LEN, 11), LEN)).unwrap();
    b.register("dst", host(&[], LEN)).unwrap();
    // Two batches of 256 chunks each (odd-sized last chunks too), over 3 queue pairs.
    let half = (LEN / 2) as u64;
    let first = Batch::new().write("src", 0, "b", "dst", 0, half - 1000);
    let second = Batch::new()
        .write("src", half - 1000, "b", "dst", half - 1000, half + 1000)
        .notify(b"awaited".to_vec());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let t0 = Instant::now();
    let (one, two) = rt.block_on(async {
        let (t1, t2) = (a.transfer(&first).unwrap(), a.transfer(&second).unwrap());
        tokio::join!(t1.finished(WAIT), t2.finished(WAIT))
    });
    one.expect("first batch");
    two.expect("second batch");
    eprintln!("two batches of 4 MiB awaited in {:?}", t0.elapsed());
    // An awaited batch that cannot finish in time reports the timeout.
    let slow = a
        .transfer(&Batch::new().write("src", 0, "b", "dst", 0, LEN as u64))
        .unwrap();
    let short = rt.block_on(slow.finished(Duration::from_micros(1)));
    assert!(
        matches!(short, Err(Error::Timeout(_))) || slow.is_finished(),
        "{short:?}"
    );
    slow.wait(WAIT).unwrap();
    let note = b.wait_notification(Duration::from_secs(10)).expect("note");
    assert_eq!(&note.message[..], b"awaited");
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(LEN, 11));
}

/// A batch of writes of 64 KiB from `segment` (`len` bytes) to c's `dst`, in flight, with c
/// dropped once its first entry has landed: the batch, and when c died.
fn stuck_on_a_dying_peer(a: &Agent, c: Agent, segment: &str, len: usize) -> (Transfer, Instant) {
    const PIECE: u64 = 64 << 10;
    let to_c = (0..len as u64 / PIECE).fold(Batch::new(), |b, j| {
        b.write(segment, j * PIECE, "c", "dst", j * PIECE, PIECE)
    });
    let stuck = a.transfer(&to_c).unwrap();
    let started = Instant::now();
    while !stuck.status().contains(&EntryStatus::Done) {
        assert!(started.elapsed() < WAIT, "nothing landed at c");
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(c);
    (stuck, Instant::now())
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_a_dead_peer_does_not_hold_up_a_batch_to_a_healthy_one() {
    let tb = Testbed::get();
    let a = Agent::new("a", settings(&tb, 16 << 10)).unwrap();
    let b = Agent::new("b", settings(&tb, 16 << 10)).unwrap();
    let c = Agent::new("c", settings(&tb, 16 << 10)).unwrap();
    a.add_peer("b", b.address());
    a.add_peer("c", c.address());
    const LEN: usize = 32 << 20;
    a.register("to-c", host(&pattern(LEN, 1), LEN)).unwrap();
    a.register("to-b", host(&pattern(1 << 20, 2), 1 << 20))
        .unwrap();
    b.register("dst", host(&[], 1 << 20)).unwrap();
    c.register("dst", host(&[], LEN)).unwrap();
    let bound = Settings::default().peer_failure_bound();
    let (stuck, died) = stuck_on_a_dying_peer(&a, c, "to-c", LEN);
    let healthy = a
        .transfer(&Batch::new().write("to-b", 0, "b", "dst", 0, 1 << 20))
        .unwrap();
    healthy.wait(WAIT).expect("the batch to b");
    let b_took = died.elapsed();
    let c_result = stuck.wait(WAIT);
    let c_took = died.elapsed();
    eprintln!("b's batch done {b_took:?} after c died; c's ended after {c_took:?} ({c_result:?})");
    match c_result {
        Err(Error::EntryFailed { error, .. }) => {
            assert!(matches!(*error, Error::PeerDown { .. }), "{error:?}");
            // The batch to b ran beside the stuck one, not after it (c's lasts the queue
            // pairs' retry budget, about 1.9 s, past its death).
            assert!(
                b_took + Duration::from_millis(500) < c_took,
                "b's batch waited for c's ({b_took:?})"
            );
        }
        other => panic!("a batch to a dead peer gave {other:?}"),
    }
    assert!(
        b_took < bound,
        "b's batch took {b_took:?} (bound {bound:?})"
    );
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(1 << 20, 2));
}

/// A metadata service that hands out the embedded service's descriptors with every rkey
/// changed: a peer publishing wrong keys.
struct Forging(EmbeddedMetadata);

impl MetadataService for Forging {
    fn publish(&self, d: &AgentDescriptor, control: SocketAddr) -> gpu_rdma_engine::Result<()> {
        self.0.publish(d, control)
    }
    fn withdraw(&self, agent: &str) -> gpu_rdma_engine::Result<()> {
        self.0.withdraw(agent)
    }
    fn lookup(&self, agent: &str) -> gpu_rdma_engine::Result<PeerRecord> {
        let mut r = self.0.lookup(agent)?;
        for s in &mut r.descriptor.segments {
            for region in &mut s.regions {
                region.rkey ^= 0x5a5a_0000;
            }
        }
        Ok(r)
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_a_forged_rkey_is_refused_by_the_nic_and_reported_typed() {
    let tb = Testbed::get();
    let b = Agent::new("b", settings(&tb, 64 << 10)).unwrap();
    let embedded = EmbeddedMetadata::new("a", &Auth::FromEnvironment, Duration::from_secs(10));
    let forging = Forging(embedded.unwrap());
    forging.0.add_peer("b", b.address());
    let a = Agent::with_metadata("a", settings(&tb, 64 << 10), Arc::new(forging)).unwrap();
    const LEN: usize = 1 << 20;
    a.register("src", host(&pattern(LEN, 4), LEN)).unwrap();
    a.register("back", host(&[], LEN)).unwrap();
    b.register("dst", host(&pattern(LEN, 8), LEN)).unwrap();
    let bound = Settings::default().peer_failure_bound();
    for batch in [
        Batch::new().write("src", 0, "b", "dst", 0, LEN as u64),
        Batch::new().read("back", 0, "b", "dst", 0, LEN as u64),
    ] {
        let t0 = Instant::now();
        let t = a
            .transfer(&batch)
            .expect("accepted: the descriptor looks right");
        let r = t.wait(WAIT);
        eprintln!(
            "{:?} with a forged rkey: {r:?} after {:?}",
            batch.entries[0].op,
            t0.elapsed()
        );
        match r {
            Err(Error::EntryFailed { error, .. }) => {
                assert!(matches!(*error, Error::RemoteAccess { .. }), "{error:?}")
            }
            other => panic!("a forged rkey gave {other:?}"),
        }
        assert!(t
            .status()
            .iter()
            .all(|s| matches!(s, EntryStatus::Failed(_))));
        assert!(t0.elapsed() < bound + Duration::from_secs(10));
    }
    // Nothing landed on either side.
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(LEN, 8));
    assert!(bytes(a.unregister("back").unwrap()).iter().all(|&x| x == 0));
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_batches_that_read_one_segment_run_side_by_side() {
    let tb = Testbed::get();
    let a = Agent::new("a", settings(&tb, 16 << 10)).unwrap();
    let b = Agent::new("b", settings(&tb, 16 << 10)).unwrap();
    let c = Agent::new("c", settings(&tb, 16 << 10)).unwrap();
    a.add_peer("b", b.address());
    a.add_peer("c", c.address());
    // One pool that both batches send from: c's batch is stuck on c's death while b's runs.
    const LEN: usize = 32 << 20;
    a.register("pool", host(&pattern(LEN, 5), LEN)).unwrap();
    b.register("dst", host(&[], 1 << 20)).unwrap();
    c.register("dst", host(&[], LEN)).unwrap();
    let (stuck, died) = stuck_on_a_dying_peer(&a, c, "pool", LEN);
    // The same megabyte of the pool, overlapping c's batch's ranges, to b.
    let healthy = a
        .transfer(&Batch::new().write("pool", 3 << 20, "b", "dst", 0, 1 << 20))
        .unwrap();
    healthy.wait(WAIT).expect("the batch to b");
    let b_took = died.elapsed();
    // b's batch shared the pool with c's stuck one instead of waiting for it.
    assert!(
        !stuck.is_finished(),
        "b's batch ended after c's ({b_took:?}): it waited for the pool"
    );
    // The pool is in use: it cannot be unregistered while a batch reads it.
    assert!(matches!(
        a.unregister("pool"),
        Err(Error::SegmentBusy { .. })
    ));
    let c_result = stuck.wait(WAIT);
    let c_took = died.elapsed();
    eprintln!("b's batch done {b_took:?} after c died; c's ended after {c_took:?} ({c_result:?})");
    assert!(
        matches!(c_result, Err(Error::EntryFailed { .. })),
        "a batch to a dead peer gave {c_result:?}"
    );
    // b's batch shared the pool with c's stuck one instead of waiting for it (c's lasts the
    // queue pairs' retry budget, about 1.9 s, past its death).
    assert!(
        b_took + Duration::from_millis(500) < c_took,
        "b's batch waited for c's ({b_took:?}, c's {c_took:?})"
    );
    assert_eq!(
        bytes(b.unregister("dst").unwrap()),
        pattern(LEN, 5)[3 << 20..4 << 20]
    );
    // Once both are done the pool is whole again: a read into it takes it whole, and it
    // comes back unchanged but for what the read wrote.
    b.register("src", host(&pattern(1 << 20, 6), 1 << 20))
        .unwrap();
    a.transfer(&Batch::new().read("pool", 0, "b", "src", 0, 1 << 20))
        .unwrap()
        .wait(WAIT)
        .expect("a read into the pool");
    let mut expected = pattern(LEN, 5);
    expected[..1 << 20].copy_from_slice(&pattern(1 << 20, 6));
    assert_eq!(bytes(a.unregister("pool").unwrap()), expected);
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_a_read_into_a_segment_waits_for_the_batches_that_send_from_it() {
    let tb = Testbed::get();
    let settings = Settings {
        workers: 4,
        ..settings(&tb, 16 << 10)
    };
    let a = Agent::new("a", settings.clone()).unwrap();
    let b = Agent::new("b", settings).unwrap();
    a.add_peer("b", b.address());
    const LEN: usize = 8 << 20;
    let (old, new) = (pattern(LEN, 21), pattern(LEN, 22));
    a.register("pool", host(&old, LEN)).unwrap();
    for i in 0..3 {
        b.register(&format!("copy{i}"), host(&[], LEN)).unwrap();
    }
    b.register("fresh", host(&new, LEN)).unwrap();
    // Three batches send the pool (sharing it) while a fourth reads fresh bytes into it
    // (taking it whole): each copy is wholly old or wholly new, and the pool ends new.
    let senders: Vec<_> = (0..3)
        .map(|i| {
            a.transfer(&Batch::new().write("pool", 0, "b", &format!("copy{i}"), 0, LEN as u64))
                .unwrap()
        })
        .collect();
    let reader = a
        .transfer(&Batch::new().read("pool", 0, "b", "fresh", 0, LEN as u64))
        .unwrap();
    for s in senders {
        s.wait(WAIT).expect("a batch sending the pool");
    }
    reader.wait(WAIT).expect("the read into the pool");
    for i in 0..3 {
        let copy = bytes(b.unregister(&format!("copy{i}")).unwrap());
        // A round that sends the pool and one that reads into it never overlap.
        assert!(
            copy == old || copy == new,
            "copy {i} is a mix of old and new bytes"
        );
    }
    assert_eq!(bytes(a.unregister("pool").unwrap()), new);
}
