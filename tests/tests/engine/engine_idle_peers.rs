//! The connections to peers at rest: the workers share them (sequential batches to one peer,
//! whichever worker runs each, use one connection's queue pairs), and one left unused for
//! `Settings::release_idle_after` is closed on both sides, after which the next batch makes
//! new ones. Two agents over rxe loopback; needs the testbed VM.

use gpu_rdma_engine::{Agent, Batch, Settings};
use integration_tests::engine::host;
use integration_tests::testbed::Testbed;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);

fn settings(tb: &Testbed, release_idle_after: Duration) -> Settings {
    Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        workers: 4,
        release_idle_after,
        ..Settings::default()
    }
}

/// Waits until `f` holds (or 10 s pass); whether it does.
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

#[test]
#[ignore = "needs the testbed VM"]
fn sequential_batches_share_one_connection_and_an_idle_one_is_released_on_both_sides() {
    let tb = Testbed::get();
    let release = Duration::from_millis(1500);
    let a = Agent::new("ia", settings(&tb, release)).expect("agent a");
    let b = Agent::new("ib", settings(&tb, Duration::MAX)).expect("agent b");
    a.add_peer("ib", b.address());
    b.add_peer("ia", a.address());
    a.register("src", host(&[5; 4096], 1 << 20)).unwrap();
    b.register("dst", host(&[], 1 << 20)).unwrap();
    let per_connection = u64::from(Settings::default().queue_pairs);
    let write = |k: u64| Batch::new().write("src", k * 4096, "ib", "dst", k * 4096, 4096);
    // Eight batches one after the other, over four workers: one connection's queue pairs.
    // A worker puts its connections back just after its batch ends (the batch's end is
    // what wakes the caller): the pause lets it, so the next batch finds them.
    for k in 0..8 {
        a.transfer(&write(k)).unwrap().wait(WAIT).expect("written");
        std::thread::sleep(Duration::from_millis(100));
    }
    let m = a.metrics();
    assert_eq!(
        m.queue_pairs, per_connection,
        "one connection to ib, shared by the workers: {m:#?}"
    );
    assert_eq!(b.metrics().control.queue_pairs, per_connection);
    // Left alone past the release time: closed, its queue pairs gone on both sides.
    let released = eventually(|| {
        a.metrics().queue_pairs == 0
            && b.metrics().control.queue_pairs == 0
            && b.control_stats().open_connections == 0
    });
    assert!(
        released,
        "still held after {release:?} unused: a {} queue pairs, b {} queue pairs, {} \
         connections",
        a.metrics().queue_pairs,
        b.metrics().control.queue_pairs,
        b.control_stats().open_connections
    );
    // The peer is still there: the next batch makes new ones.
    a.transfer(&write(9))
        .unwrap()
        .wait(WAIT)
        .expect("written after the release");
    assert_eq!(a.metrics().queue_pairs, per_connection);
    assert_eq!(b.metrics().control.queue_pairs, per_connection);
}
