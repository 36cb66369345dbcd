//! A peer agent in another process, killed with SIGKILL while a batch to it is in flight:
//! the kernel tears its queue pairs and its control socket down with no word from the
//! agent, as a crash does. The batch to it fails `PeerDown` within the stated bound, a batch
//! to a healthy peer meanwhile finishes first, and a new process under the same name (a new
//! incarnation, another address) is reconnected and written, never with the dead one's keys.
//! Needs the testbed VM (one node).
//!
//! The peer is this test binary again, started with `ENGINE_PEER_ROLE` set: the one test
//! then plays the peer (an agent with one segment, its address printed on stdout) until it
//! is killed, or a limit passes.

use gpu_rdma_engine::{Agent, Batch, EntryStatus, Error, ErrorKind, Settings};
use integration_tests::engine::{bytes, host, loopback_settings};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);
const ROLE: &str = "ENGINE_PEER_ROLE";
const TEST: &str = "loopback_a_peer_process_killed_mid_batch_fails_typed_and_a_new_one_is_served";
const LEN: usize = 32 << 20;
const PIECE: u64 = 64 << 10;

fn settings(tb: &Testbed) -> Settings {
    loopback_settings(tb, 16 << 10)
}

/// The peer's side: agent "c" with a zeroed segment "dst" of `LEN` bytes; prints its control
/// address and stays until killed (at most five minutes, so that no process outlives a
/// failed test for long).
fn play_peer() {
    let tb = Testbed::get();
    let c = Agent::new("c", settings(&tb)).expect("the peer's agent");
    c.register("dst", host(&[], LEN))
        .expect("the peer's segment");
    println!("ADDRESS {}", c.address());
    std::thread::sleep(Duration::from_secs(300));
}

/// Starts the peer process and reads its control address.
fn start_peer() -> (Child, SocketAddr) {
    // This test binary (built by this workspace) again, as the peer.
    let mut child = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            &integration_tests::process::test_name(module_path!(), TEST),
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, "peer")
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the peer process");
    let out = BufReader::new(child.stdout.take().expect("the peer's stdout"));
    for line in out.lines() {
        let line = line.expect("read the peer's stdout");
        // libtest's "test <name> ... " precedes it on the same line.
        if let Some((_, addr)) = line.split_once("ADDRESS ") {
            return (child, addr.trim().parse().expect("the peer's address"));
        }
    }
    let status = child.wait();
    panic!("the peer process ended without an address ({status:?})");
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_a_peer_process_killed_mid_batch_fails_typed_and_a_new_one_is_served() {
    if std::env::var_os(ROLE).is_some() {
        return play_peer();
    }
    let tb = Testbed::get();
    let a = Agent::new("a", settings(&tb)).unwrap();
    let b = Agent::new("b", settings(&tb)).unwrap();
    a.add_peer("b", b.address());
    a.register("to-c", host(&pattern(LEN, 3), LEN)).unwrap();
    a.register("to-b", host(&pattern(1 << 20, 4), 1 << 20))
        .unwrap();
    b.register("dst", host(&[], 1 << 20)).unwrap();
    let (mut peer, addr) = start_peer();
    a.add_peer("c", addr);
    let bound = Settings::default().peer_failure_bound();
    // 512 entries of 64 KiB; the process dies once the first has landed.
    let to_c = (0..LEN as u64 / PIECE).fold(Batch::new(), |b, j| {
        b.write("to-c", j * PIECE, "c", "dst", j * PIECE, PIECE)
    });
    let stuck = a.transfer(&to_c).unwrap();
    let started = Instant::now();
    while !stuck.status().contains(&EntryStatus::Done) {
        assert!(
            started.elapsed() < WAIT,
            "nothing landed at the peer process"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    peer.kill().expect("SIGKILL the peer process");
    let died = Instant::now();
    peer.wait().expect("reap the peer process");
    let healthy = a
        .transfer(&Batch::new().write("to-b", 0, "b", "dst", 0, 1 << 20))
        .unwrap();
    healthy.wait(WAIT).expect("the batch to b");
    let b_took = died.elapsed();
    let c_result = stuck.wait(WAIT);
    let c_took = died.elapsed();
    eprintln!("b's batch done {b_took:?} after the kill; c's ended after {c_took:?}");
    match &c_result {
        Err(Error::EntryFailed { error, .. }) => {
            assert!(matches!(**error, Error::PeerDown { .. }), "{error:?}");
            assert_eq!(error.kind(), ErrorKind::PeerDown);
        }
        other => panic!("a batch to a killed peer gave {other:?}"),
    }
    assert!(
        c_took < bound,
        "c's batch failed after {c_took:?} (bound {bound:?})"
    );
    assert!(
        b_took < bound,
        "b's batch took {b_took:?} (bound {bound:?})"
    );
    // Entries reported done landed; no entry after the kill reports done without landing:
    // every status is Done or Failed, none pending.
    let statuses = stuck.status();
    assert!(
        statuses.iter().all(|s| !matches!(s, EntryStatus::Pending)),
        "{statuses:?}"
    );
    assert!(statuses.iter().any(|s| matches!(s, EntryStatus::Failed(_))));
    // A new process under the same name: a new incarnation at another address. Its
    // segment is written and read back whole.
    let (mut again, addr) = start_peer();
    a.add_peer("c", addr);
    let back = host(&[], LEN);
    a.register("back", back).unwrap();
    a.transfer(&Batch::new().write("to-c", 0, "c", "dst", 0, LEN as u64))
        .unwrap()
        .wait(WAIT)
        .expect("a write to the new process");
    a.transfer(&Batch::new().read("back", 0, "c", "dst", 0, LEN as u64))
        .unwrap()
        .wait(WAIT)
        .expect("a read from the new process");
    assert!(bytes(a.unregister("back").unwrap()) == pattern(LEN, 3));
    again.kill().expect("stop the second peer process");
    again.wait().expect("reap it");
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(1 << 20, 4));
}
