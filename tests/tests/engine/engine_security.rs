//! The transfer engine against attackers on its control port: clients without the cluster
//! key, with another cluster's key, replaying a recorded handshake, agents of another CA
//! (mutual TLS), and floods of connections, half frames, queue pairs and notifications,
//! while honest agents keep transferring. Needs the testbed VM (agents over rxe loopback; the harness gives every
//! agent the cluster key through `GPU_RDMA_CLUSTER_KEY_FILE`).
//!
//! The raw clients speak the handshake of docs/engine.md ("Security") byte by byte, as an
//! attacker's own program would; the replay computes one honest proof with the key (as an
//! eavesdropper would have recorded it) and plays it again.

use gpu_rdma_engine::{
    Agent, Auth, Batch, ClusterKey, ControlStats, Error, ErrorKind, Limit, Limits, Settings,
    CLUSTER_KEY_ENV,
};
use hmac::{Hmac, Mac};
use integration_tests::engine::{host, loopback_settings};
use integration_tests::pki::Ca;
use integration_tests::process::alone;
use integration_tests::testbed::Testbed;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);
const LEN: u64 = 4 << 20;

/// The key the harness gave this run.
fn cluster_key() -> Vec<u8> {
    let path = std::env::var(CLUSTER_KEY_ENV).expect("the harness sets the cluster key file");
    let text = std::fs::read_to_string(path).expect("the key file");
    let text = text.trim();
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut b = (payload.len() as u32).to_le_bytes().to_vec();
    b.extend_from_slice(payload);
    b
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let mut b = vec![0; u32::from_le_bytes(n) as usize];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// A client hello of control protocol 3: `mode` 0 (no key) or 1 (cluster key).
fn hello(mode: u8, challenge: [u8; 32], name: &str) -> Vec<u8> {
    let mut b = b"GRC\0".to_vec();
    b.extend_from_slice(&3u16.to_le_bytes());
    b.push(mode);
    b.extend_from_slice(&challenge);
    b.extend_from_slice(&(name.len() as u32).to_le_bytes());
    b.extend_from_slice(name.as_bytes());
    b
}

fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

/// The client proof for `hello` and the server's `welcome` (its proof cut off), as the
/// engine computes it.
fn client_proof(key: &[u8], hello: &[u8], welcome: &[u8]) -> Vec<u8> {
    let head = &welcome[..welcome.len() - 32];
    let mut h = Sha256::new();
    h.update((hello.len() as u32).to_le_bytes());
    h.update(hello);
    h.update((head.len() as u32).to_le_bytes());
    h.update(head);
    let th: [u8; 32] = h.finalize().into();
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap();
    m.update(b"gpu-rdma control v3 client");
    m.update(&th);
    m.finalize().into_bytes().to_vec()
}

/// Whether `s` got a refusal (a reject frame, tag 2) or was closed, and nothing else.
fn refused(s: &mut TcpStream) -> bool {
    match read_frame(s) {
        Ok(f) => f.first() == Some(&2),
        Err(_) => true,
    }
}

/// Honest traffic: `a` writes `LEN` bytes to `b` and reads them back until `stop`, and
/// says how many round trips it made and whether all succeeded.
fn honest(a: Arc<Agent>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u32, bool)> {
    std::thread::spawn(move || {
        let (mut n, mut ok) = (0, true);
        while !stop.load(Ordering::SeqCst) {
            let w = Batch::new().write("src", 0, "b", "dst", 0, LEN);
            let r = Batch::new().read("src", 0, "b", "dst", 0, LEN);
            for batch in [w, r] {
                ok &= a.transfer(&batch).and_then(|t| t.wait(WAIT)).is_ok();
            }
            n += 1;
        }
        (n, ok)
    })
}

fn pair(tb: &Testbed, limits: Limits) -> (Arc<Agent>, Agent) {
    let b = Agent::new(
        "b",
        Settings {
            limits,
            ..loopback_settings(tb, 256 << 10)
        },
    )
    .expect("b");
    let a = Agent::new("a", loopback_settings(tb, 256 << 10)).expect("a");
    a.add_peer("b", b.address());
    a.register("src", host(&[7; 64], LEN as usize)).unwrap();
    b.register("dst", host(&[], LEN as usize)).unwrap();
    (Arc::new(a), b)
}

fn stats_delta(after: ControlStats, before: ControlStats) -> [u64; 5] {
    [
        after.unauthenticated - before.unauthenticated,
        after.bad_proofs - before.bad_proofs,
        after.failed_handshakes - before.failed_handshakes,
        after.queue_pairs_refused - before.queue_pairs_refused,
        after.notifications_refused - before.notifications_refused,
    ]
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_clients_without_the_key_another_key_or_a_replay_are_refused_typed_and_counted() {
    let _alone = alone();
    let tb = Testbed::get();
    let (a, b) = pair(&tb, Limits::default());
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = honest(a.clone(), stop.clone());
    let before = b.control_stats();

    // 1. A client of the old protocol asks for the descriptor straight away.
    let mut s = raw(b.address());
    s.write_all(&frame(&[1])).unwrap();
    assert!(
        refused(&mut s),
        "a request before any handshake was answered"
    );
    // 2. A client that offers no key.
    let mut s = raw(b.address());
    s.write_all(&frame(&hello(0, [1; 32], "mallory"))).unwrap();
    let why = read_frame(&mut s).expect("a refusal");
    assert_eq!(why[0], 2);
    assert!(String::from_utf8_lossy(&why).contains("requires the cluster key"));
    // 3. A client that guesses a proof.
    let mut s = raw(b.address());
    s.write_all(&frame(&hello(1, [2; 32], "mallory"))).unwrap();
    read_frame(&mut s).expect("the welcome");
    s.write_all(&frame(&[0x55; 32])).unwrap();
    assert!(refused(&mut s));
    // 4. A recorded honest handshake played again: the server's challenge is new.
    let key = cluster_key();
    let h = hello(1, [3; 32], "a");
    let mut s = raw(b.address());
    s.write_all(&frame(&h)).unwrap();
    let welcome = read_frame(&mut s).unwrap();
    let proof = client_proof(&key, &h, &welcome);
    s.write_all(&frame(&proof)).unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), [1], "the honest handshake");
    let mut replay = raw(b.address());
    replay.write_all(&frame(&h)).unwrap();
    read_frame(&mut replay).unwrap();
    replay.write_all(&frame(&proof)).unwrap();
    assert!(refused(&mut replay), "a replayed handshake was accepted");
    // 5. Agents of another cluster, and one without authentication, through the API.
    let other = Auth::ClusterKey(ClusterKey::generate().unwrap());
    for (name, auth) in [("eve", other), ("open", Auth::InsecureNoAuthentication)] {
        let settings = Settings {
            auth,
            ..loopback_settings(&tb, 256 << 10)
        };
        let eve = Agent::new(name, settings).expect("eve");
        eve.add_peer("b", b.address());
        eve.register("src", host(&[9; 64], LEN as usize)).unwrap();
        let w = Batch::new().write("src", 0, "b", "dst", 0, LEN);
        let e = eve
            .transfer(&w)
            .expect_err("a transfer without the cluster's key");
        assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
        let e = eve.notify("b", b"forged").expect_err("a notification");
        assert!(matches!(e, Error::Authentication { .. }), "{e:?}");
        // The other way: b does not talk to them either.
        b.add_peer(name, eve.address());
        let e = b.notify(name, b"hello").expect_err("b to a foreign agent");
        assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    }
    stop.store(true, Ordering::SeqCst);
    let (rounds, ok) = traffic.join().unwrap();
    assert!(
        ok && rounds > 0,
        "honest transfers failed meanwhile ({rounds} rounds)"
    );

    let d = stats_delta(b.control_stats(), before);
    eprintln!("refusals: {:?}", b.control_stats());
    // Unauthenticated: the keyless client and the agent without authentication.
    assert!(d[0] >= 2, "unauthenticated {d:?}");
    // Wrong proofs: the guess and the replay.
    assert_eq!(d[1], 2, "bad proofs {d:?}");
    // Failed: the old protocol, and eve's two attempts, which saw b's proof fail and left.
    assert!(d[2] >= 3, "failed handshakes {d:?}");
    // Nothing of b's reached them: only the honest peer's notification-free traffic.
    assert!(b.notifications().is_empty());
    // A notification's sender is the name its connection authenticated.
    a.notify("b", b"from a").unwrap();
    let n = b.wait_notification(WAIT).expect("a's notification");
    assert_eq!(
        (n.from.as_str(), n.message.as_slice()),
        ("a", &b"from a"[..])
    );
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// How long `rounds` honest writes of `LEN` bytes to b take.
fn timed(a: &Agent, rounds: u32) -> Duration {
    let t0 = Instant::now();
    for _ in 0..rounds {
        let w = Batch::new().write("src", 0, "b", "dst", 0, LEN);
        a.transfer(&w).unwrap().wait(WAIT).unwrap();
    }
    t0.elapsed()
}

/// How long each of the honest peers takes for `rounds` writes, all at once: the slower.
fn timed_together(peers: &[Arc<Agent>], rounds: u32) -> Duration {
    std::thread::scope(|s| {
        let each: Vec<_> = peers
            .iter()
            .map(|a| s.spawn(move || timed(a, rounds)))
            .collect();
        each.into_iter().map(|t| t.join().unwrap()).max().unwrap()
    })
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_floods_of_connections_half_frames_queue_pairs_and_notifications_stay_bounded() {
    let _alone = alone();
    let tb = Testbed::get();
    let limits = Limits {
        queue_pairs_per_connection: 8,
        queue_pairs_per_peer: 12,
        handshake_timeout: Duration::from_secs(3),
        ..Limits::default()
    };
    let (a, b) = pair(&tb, limits);
    // A second honest peer, writing into the same segment of b.
    let a2 = Agent::new("a2", loopback_settings(&tb, 256 << 10)).expect("a2");
    a2.add_peer("b", b.address());
    a2.register("src", host(&[6; 64], LEN as usize)).unwrap();
    let peers = [a.clone(), Arc::new(a2)];
    const ROUNDS: u32 = 6;
    timed_together(&peers, 2);
    let quiet = timed_together(&peers, ROUNDS).min(timed_together(&peers, ROUNDS));
    let rss0 = rss_kib();
    let before = b.control_stats();

    // Connections that never authenticate: far past the handshake slots.
    let idle: Vec<TcpStream> = (0..300).map(|_| raw(b.address())).collect();
    // Half frames: a 16 MiB handshake announced and one byte sent.
    let mut half: Vec<TcpStream> = (0..24).map(|_| raw(b.address())).collect();
    for s in &mut half {
        s.write_all(&(16u32 << 20).to_le_bytes()).unwrap();
        s.write_all(&[0]).unwrap();
    }
    // An authenticated agent that asks for more queue pairs than b gives one peer.
    let greedy = Agent::new(
        "greedy",
        Settings {
            queue_pairs: 10,
            ..loopback_settings(&tb, 256 << 10)
        },
    )
    .unwrap();
    greedy.add_peer("b", b.address());
    greedy
        .register("src", host(&[1; 64], LEN as usize))
        .unwrap();
    let w = Batch::new().write("src", 0, "b", "dst", 0, LEN);
    let r = greedy.transfer(&w).unwrap().wait(WAIT);
    let e = format!("{r:?}");
    assert!(r.is_err() && e.contains("QueuePairsPerConnection"), "{e}");
    // Notifications until b's queue for this sender is full.
    let mut sent = 0;
    let refusal = loop {
        match greedy.notify("b", b"spam spam spam spam") {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(
            sent <= limits.notifications_per_sender,
            "no bound on notifications"
        );
    };
    assert!(
        matches!(
            refusal,
            Error::LimitReached {
                limit: Limit::NotificationsPerSender,
                ..
            }
        ),
        "{refusal:?}"
    );
    assert_eq!(sent, limits.notifications_per_sender);
    // The honest peer's notification still gets through: the bound is per sender.
    a.notify("b", b"honest").unwrap();

    // Honest transfers while connections and half frames keep coming (as fast as the
    // emulated machine opens them, with a pause of 2 ms: about 150 a second).
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let (stop, addr) = (stop.clone(), b.address());
        std::thread::spawn(move || {
            let mut held = std::collections::VecDeque::new();
            let mut n = 0u32;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(mut s) = TcpStream::connect(addr) {
                    if n.is_multiple_of(2) {
                        let _ = s.write_all(&(16u32 << 20).to_le_bytes());
                    }
                    held.push_back(s);
                }
                if held.len() > 300 {
                    held.pop_front();
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        })
    };
    // The better of two measurements on each side, as for the quiet figure: the machine
    // is noisy, and the flood runs through both.
    let flooded = timed_together(&peers, ROUNDS).min(timed_together(&peers, ROUNDS));
    stop.store(true, Ordering::SeqCst);
    let flood_connections = flood.join().unwrap();
    eprintln!("{flood_connections} connections during the flooded rounds");
    let grown = rss_kib().saturating_sub(rss0);
    let after = b.control_stats();
    eprintln!("quiet {quiet:?}, flooded {flooded:?}, resident +{grown} KiB, {after:?}");
    assert!(
        flooded < quiet * 2,
        "two honest peers' transfers slowed from {quiet:?} to {flooded:?} under the flood"
    );
    // The stated bound: each connection's thread stack (256 KiB) and one frame, at most
    // `2 × handshakes + connections` of them, and the notification queue; far less resides.
    assert!(
        grown < 64 << 10,
        "the flood grew the process by {grown} KiB"
    );
    assert!(
        after.handshakes_dropped - before.handshakes_dropped >= 200,
        "{after:?}"
    );
    assert!(after.open_connections <= u64::from(3 * limits.handshakes + limits.connections));
    let d = stats_delta(after, before);
    assert!(d[3] >= 1 && d[4] >= 1, "{d:?}");
    // Every half frame was refused at once (a handshake is at most 1 KiB), not held.
    for s in &mut half {
        assert!(refused(s));
    }
    let notes = b.notifications();
    assert_eq!(notes.len() as u32, limits.notifications_per_sender + 1);
    assert!(notes.iter().any(|n| n.from == "a"));
    drop(idle);
}

#[test]
#[ignore = "needs the testbed VM"]
fn loopback_mutual_tls_agents_are_their_certificates_names_and_others_are_refused() {
    let _alone = alone();
    let tb = Testbed::get();
    let (ca, other) = (Ca::new("security"), Ca::new("elsewhere"));
    let tls = |files| Settings {
        auth: Auth::MutualTls(files),
        ..loopback_settings(&tb, 256 << 10)
    };
    let b = Agent::new("b", tls(ca.issue("b"))).expect("b");
    let a = Agent::new("a", tls(ca.issue("a"))).expect("a");
    a.add_peer("b", b.address());
    a.register("src", host(&[5; 64], LEN as usize)).unwrap();
    b.register("dst", host(&[], LEN as usize)).unwrap();
    let w = Batch::new().write("src", 0, "b", "dst", 0, LEN);
    a.transfer(&w.notify(b"over tls".to_vec()))
        .unwrap()
        .wait(WAIT)
        .expect("a transfer between agents of the CA");
    let n = b.wait_notification(WAIT).expect("the batch's notification");
    assert_eq!(
        (n.from.as_str(), n.message.as_slice()),
        ("a", &b"over tls"[..])
    );
    // An agent cannot start under a name its certificate does not hold.
    let e = Agent::new("a", tls(ca.issue("mallory"))).expect_err("a borrowed name");
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
    let before = b.control_stats();
    // Another CA's agent, and one with the cluster key instead, are refused both ways.
    let foreign = Agent::new("c", tls(other.issue("c"))).expect("c");
    let keyed = Agent::new("d", loopback_settings(&tb, 256 << 10)).expect("d");
    for x in [&foreign, &keyed] {
        x.add_peer("b", b.address());
        let e = x
            .notify("b", b"let me in")
            .expect_err("a foreign agent's notification");
        assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
        b.add_peer(x.name(), x.address());
        let e = b
            .notify(x.name(), b"hello")
            .expect_err("b to a foreign agent");
        assert_eq!(e.kind(), ErrorKind::Unauthenticated, "{e}");
    }
    let after = b.control_stats();
    eprintln!("{after:?}");
    // The foreign certificate: the client refuses the server's first and leaves, so the
    // server sees its alert (a bad proof) or the closed connection (a failed handshake).
    let refused = |s: ControlStats| s.bad_proofs + s.failed_handshakes;
    assert!(
        refused(after) > refused(before),
        "the foreign certificate was not counted"
    );
    assert!(
        after.unauthenticated > before.unauthenticated,
        "the keyed agent was not counted"
    );
    assert!(b.notifications().is_empty());
}
