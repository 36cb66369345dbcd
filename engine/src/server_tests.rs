//! The control listener against floods, on the host (no device: a listener alone): hellos
//! that never prove anything, a TLS handshake trickled a byte at a time, and an
//! authenticated connection that stays silent.

use crate::auth::{test_pki::Ca, ClusterKey, Credentials, Tls, MAX_HANDSHAKE_FRAME};
use crate::channel::{read_frame, write_frame, Waits};
use crate::codec::Writer;
use crate::inbox::Inbox;
use crate::limits::{Counters, Limits};
use crate::metadata::{Dialer, EmbeddedMetadata};
use crate::server::Server;
use crate::shared::Shared;
use crate::wire::{Reply, Request};
use crate::{Auth, Settings};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A listener of agent "srv" with `creds` and `limits`, and no device.
fn listener(creds: Credentials, auth: Auth, limits: Limits) -> (Server, Arc<Shared>) {
    listener_named("srv", creds, auth, limits)
}

/// As [`listener`], of agent `name` (its threads' names start with it).
fn listener_named(
    name: &str,
    creds: Credentials,
    auth: Auth,
    limits: Limits,
) -> (Server, Arc<Shared>) {
    let settings = Settings {
        auth,
        limits,
        ..Settings::default()
    };
    let dialer = Dialer {
        me: name.into(),
        creds: Arc::new(creds),
        timeout: Duration::from_secs(5),
    };
    let shared = Arc::new(Shared {
        name: name.into(),
        incarnation: 1,
        devices: Vec::new(),
        weights: Vec::new(),
        segments: Default::default(),
        settings,
        metadata: Arc::new(EmbeddedMetadata::with_dialer(dialer.clone())),
        dialer,
        peers: Default::default(),
        inbox: Inbox::new(1, 1),
        counters: Counters::default(),
        metrics: Arc::new(crate::metrics::Recorder::new(true)),
    });
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    (Server::start(shared.clone(), l).unwrap(), shared)
}

fn hello(mode: u8) -> Vec<u8> {
    let mut w = Writer::default();
    w.raw(b"GRC\0").u16(3).u8(mode).raw(&[5u8; 32]).str("flood");
    w.0
}

#[test]
fn hellos_that_never_prove_hold_a_bounded_number_of_connections() {
    let key = ClusterKey::from_bytes(&[7; 32]).unwrap();
    let limits = Limits {
        handshakes: 8,
        ..Limits::default()
    };
    let (server, shared) = listener(Credentials::Key(key.clone()), Auth::ClusterKey(key), limits);
    let mut held = Vec::new();
    let mut peak = 0;
    for _ in 0..40 {
        for _ in 0..16 {
            let mut s = TcpStream::connect(server.addr()).unwrap();
            write_frame(&mut s, &hello(1)).unwrap();
            held.push(s);
        }
        std::thread::sleep(Duration::from_millis(5));
        peak = peak.max(server.gauges().0);
    }
    // Every connection accepted (the listener may lag behind on a loaded machine).
    let t0 = Instant::now();
    while shared.counters.snapshot(0, 0).accepted < held.len() as u64 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "connections never accepted"
        );
        std::thread::sleep(Duration::from_millis(10));
        peak = peak.max(server.gauges().0);
    }
    let c = shared.counters.snapshot(0, 0);
    // At most `handshakes` waiting for a hello and twice that in threads.
    assert!(
        peak <= 3 * u64::from(limits.handshakes),
        "{peak} connections held"
    );
    assert!(c.handshakes_dropped >= 500, "{c:?}");
}

#[test]
fn a_tls_handshake_trickled_a_byte_at_a_time_ends_at_the_handshake_timeout() {
    let ca = Ca::new("trickle");
    let files = ca.agent("srv");
    let tls = Tls::load(&files, Some("srv")).unwrap();
    let limits = Limits {
        handshake_timeout: Duration::from_secs(1),
        ..Limits::default()
    };
    let (server, shared) = listener(Credentials::Tls(tls), Auth::MutualTls(files), limits);
    let mut s = TcpStream::connect(server.addr()).unwrap();
    write_frame(&mut s, &hello(2)).unwrap();
    let waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };
    read_frame(&mut s, MAX_HANDSHAKE_FRAME, waits).expect("the welcome");
    // A TLS record header announcing 16 KiB, then one byte every 200 ms.
    s.write_all(&[0x16, 0x03, 0x01, 0x40, 0x00]).unwrap();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(6) && s.write_all(&[1]).is_ok() {
        if shared.counters.snapshot(0, 0).failed_handshakes > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = t0.elapsed();
    assert_eq!(shared.counters.snapshot(0, 0).failed_handshakes, 1);
    assert!(
        took < Duration::from_secs(3),
        "the trickled handshake held on {took:?}"
    );
}

#[test]
fn an_authenticated_connection_that_stays_silent_is_closed_at_the_idle_timeout() {
    let key = ClusterKey::from_bytes(&[9; 32]).unwrap();
    let limits = Limits {
        idle_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let creds = Credentials::Key(key.clone());
    let (server, shared) = listener(Credentials::Key(key.clone()), Auth::ClusterKey(key), limits);
    let s = TcpStream::connect(server.addr()).unwrap();
    let waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };
    let mut ch = crate::auth::connect(s, server.addr(), "quiet", &creds, Some("srv"), waits)
        .expect("authenticated");
    let t0 = Instant::now();
    // The server closes it: the next read ends, well before our own 5 s.
    let e = ch
        .recv(64, waits)
        .expect_err("a frame from a server with nothing to say");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "{e} after {:?}",
        t0.elapsed()
    );
    assert_eq!(shared.counters.snapshot(0, 0).idle_closed, 1);
}

#[test]
fn waits_too_long_to_be_deadlines_mean_none() {
    let key = ClusterKey::from_bytes(&[3; 32]).unwrap();
    let limits = Limits {
        idle_timeout: Duration::MAX,
        handshake_timeout: Duration::MAX,
        ..Limits::default()
    };
    let creds = Credentials::Key(key.clone());
    let (server, shared) = listener(Credentials::Key(key.clone()), Auth::ClusterKey(key), limits);
    let waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };
    let s = TcpStream::connect(server.addr()).unwrap();
    let mut ch = crate::auth::connect(s, server.addr(), "c", &creds, Some("srv"), waits).unwrap();
    let r = crate::wire::call(
        &mut ch,
        server.addr(),
        Duration::from_secs(5),
        &Request::Check,
    );
    assert_eq!(r.unwrap(), Reply::Incarnation(1));
    assert_eq!(shared.counters.snapshot(0, 0).authenticated, 1);
}

/// The threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

#[test]
fn many_peers_are_served_by_a_fixed_number_of_threads() {
    let key = ClusterKey::from_bytes(&[4; 32]).unwrap();
    let limits = Limits {
        serving_threads: 2,
        ..Limits::default()
    };
    let creds = Credentials::Key(key.clone());
    // Its own name: the threads counted are this listener's alone.
    let (server, shared) = listener_named(
        "many",
        Credentials::Key(key.clone()),
        Auth::ClusterKey(key),
        limits,
    );
    let waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };
    let t = Duration::from_secs(5);
    let mut peers = Vec::new();
    for i in 0..40 {
        let s = TcpStream::connect(server.addr()).unwrap();
        let name = format!("peer{i}");
        let mut ch = crate::auth::connect(s, server.addr(), &name, &creds, Some("many"), waits)
            .expect("authenticated");
        let r = crate::wire::call(&mut ch, server.addr(), t, &Request::Check);
        assert_eq!(r.unwrap(), Reply::Incarnation(1), "{name}");
        peers.push(ch);
    }
    // Every connection is still served, in any order, by the same two threads.
    for (i, ch) in peers.iter_mut().enumerate().rev() {
        let r = crate::wire::call(ch, server.addr(), t, &Request::Check);
        assert_eq!(r.unwrap(), Reply::Incarnation(1), "peer{i}, again");
    }
    // The handshake threads have handed their connections over and exited.
    let deadline = Instant::now() + Duration::from_secs(5);
    while threads_named("many-peer") > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(threads_named("many-peer"), 0, "handshake threads left");
    assert_eq!(threads_named("many-serve"), 2, "serving threads");
    assert_eq!(server.gauges().0, 40, "connections open");
    assert_eq!(shared.counters.snapshot(0, 0).authenticated, 40);
    // Closed by the peers: out of the table, the threads unchanged.
    drop(peers);
    let deadline = Instant::now() + Duration::from_secs(5);
    while server.gauges().0 > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(server.gauges().0, 0, "connections left open");
    assert_eq!(threads_named("many-serve"), 2);
    drop(server);
    assert_eq!(
        threads_named("many-serve"),
        0,
        "serving threads after the listener's end"
    );
}
