//! The transfer engine's etcd metadata backend, against a real etcd (Debian's etcd-server)
//! started by each test inside the testbed VM: agents over rxe loopback find each other
//! through etcd, keys live under leases, watches follow segments, etcd lost and back; values
//! signed and checked, etcd's own users and TLS.

use gpu_rdma_engine::{
    Agent, AgentDescriptor, Auth, Batch, ClusterKey, DeviceRegion, Error, ErrorKind, EtcdMetadata,
    EtcdSettings, EtcdTls, EtcdUser, MetadataService, SegmentDescriptor, Settings, TlsFiles,
};
use integration_tests::engine::{bytes, host};
use integration_tests::etcd::Etcd;
use integration_tests::exporters::Exporter;
use integration_tests::pki::Ca;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pattern;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(120);
const TTL: Duration = Duration::from_secs(2);

fn backend(etcd: &Etcd) -> Arc<EtcdMetadata> {
    backend_with(etcd, Auth::FromEnvironment)
}

/// A backend that signs and checks values with `auth` (the harness's cluster key from the
/// environment, another key, or none).
fn backend_with(etcd: &Etcd, auth: Auth) -> Arc<EtcdMetadata> {
    let settings = EtcdSettings {
        endpoints: vec![etcd.endpoint()],
        lease_ttl: TTL,
        // A guest under TCG answers slowly.
        timeout: Duration::from_secs(5),
        auth,
        ..EtcdSettings::default()
    };
    Arc::new(EtcdMetadata::new(settings).expect("connect to etcd"))
}

fn agent(tb: &Testbed, name: &str, m: &Arc<EtcdMetadata>) -> Agent {
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        ..Settings::default()
    };
    Agent::with_metadata(name, settings, m.clone()).expect("agent")
}

/// Polls `f` every 100 ms until it holds, at most `limit`; how long it took.
fn until(limit: Duration, what: &str, mut f: impl FnMut() -> bool) -> Duration {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    t0.elapsed()
}

fn segments(m: &EtcdMetadata, agent: &str) -> Vec<String> {
    match m.lookup(agent) {
        Ok(r) => r.descriptor.segments.into_iter().map(|s| s.name).collect(),
        Err(e) => vec![format!("{e:?}")],
    }
}

/// A runtime and a raw etcd client: what a writer of the prefix who is not an agent uses.
fn raw_etcd(
    etcd: &Etcd,
    opts: Option<etcd_client::ConnectOptions>,
) -> (tokio::runtime::Runtime, etcd_client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let c = rt.block_on(etcd_client::Client::connect([etcd.endpoint()], opts));
    (rt, c.expect("connect to etcd"))
}

/// A descriptor of a made-up agent (no RDMA needed to publish it).
fn made_up(agent: &str, incarnation: u64) -> AgentDescriptor {
    AgentDescriptor {
        agent: agent.into(),
        incarnation,
        segments: vec![SegmentDescriptor {
            name: "kv".into(),
            len: 4096,
            base: Some(0x1000),
            remote_read: true,
            remote_write: true,
            regions: vec![DeviceRegion {
                device: 0,
                device_name: "rxe0".into(),
                gid: [0; 16],
                addr: 0x1000,
                rkey: 1,
                tier: 0,
            }],
        }],
    }
}

const CONTROL: &str = "127.0.0.1:9";

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_two_agents_transfer_checked_and_watches_follow_segments() {
    let tb = Testbed::get();
    let etcd = Etcd::start("two-agents");
    let (ma, mb) = (backend(&etcd), backend(&etcd));
    let (a, b) = (agent(&tb, "a", &ma), agent(&tb, "b", &mb));
    const LEN: u64 = 4 << 20;
    const BLOCK: u64 = 64 << 10;
    let mut src = Exporter::Vgem.allocate(LEN);
    let p = pattern(LEN as usize, 3);
    Exporter::fill(&mut src, 0, &p);
    a.register("src", src).unwrap();
    a.register("back", host(&[], LEN as usize)).unwrap();
    b.register("dst", Exporter::Udmabuf.allocate(LEN)).unwrap();

    // Scattered blocks a -> b, read back b -> a; every byte checked.
    let blocks = LEN / BLOCK;
    let slot = |j: u64| ((j * 37) % blocks) * BLOCK;
    let mut write = Batch::new().notify(b"written".to_vec());
    let mut read = Batch::new();
    for j in 0..blocks {
        write = write.write("src", j * BLOCK, "b", "dst", slot(j), BLOCK);
        read = read.read("back", j * BLOCK, "b", "dst", slot(j), BLOCK);
    }
    a.transfer(&write).unwrap().wait(WAIT).expect("written");
    let n = b
        .wait_notification(Duration::from_secs(30))
        .expect("notified");
    assert_eq!(n.message, b"written");
    a.transfer(&read).unwrap().wait(WAIT).expect("read back");
    assert_eq!(bytes(a.unregister("back").unwrap()), p);

    // The watch: a's backend learns of b's new and removed segments without asking etcd.
    b.register("late", host(&[], 4096)).unwrap();
    until(Duration::from_secs(30), "a sees b's new segment", || {
        segments(&ma, "b").contains(&"late".to_string())
    });
    b.unregister("late").unwrap();
    until(Duration::from_secs(30), "a sees it removed", || {
        !segments(&ma, "b").contains(&"late".to_string())
    });

    // Names are unique: another incarnation of "b" is refused while b lives.
    let other = backend(&etcd);
    let d = made_up("b", b.incarnation() ^ 1);
    match other.publish(&d, CONTROL.parse().unwrap()) {
        Err(Error::AgentExists { agent, incarnation }) => {
            assert_eq!(agent, "b");
            assert_eq!(incarnation, Some(b.incarnation()));
        }
        r => panic!("a second \"b\": {r:?}"),
    }

    // A dropped agent withdraws: its keys vanish at once, and a's watch sees it.
    drop(b);
    let took = until(Duration::from_secs(30), "b withdrawn", || {
        matches!(ma.lookup("b"), Err(Error::UnknownAgent(_)))
    });
    assert!(took < TTL, "withdrawn after {took:?}: revoked, not expired");
    assert!(matches!(
        a.transfer(&Batch::new().write("src", 0, "b", "dst", 0, 1)),
        Err(Error::UnknownAgent(_))
    ));
    // Now the name is free.
    other
        .publish(&d, CONTROL.parse().unwrap())
        .expect("b's name is free");
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_crashed_agents_keys_vanish_after_the_lease_ttl() {
    let etcd = Etcd::start("lease");
    let (crashing, peer) = (backend(&etcd), backend(&etcd));
    crashing
        .publish(&made_up("c", 7), CONTROL.parse().unwrap())
        .unwrap();
    assert_eq!(segments(&peer, "c"), ["kv"]);
    // Held alive well past the TTL while the agent lives.
    std::thread::sleep(TTL * 2);
    assert_eq!(segments(&peer, "c"), ["kv"]);
    // A crash: the lease is no longer renewed, and not revoked.
    drop(crashing);
    let t0 = Instant::now();
    assert_eq!(segments(&peer, "c"), ["kv"], "gone before the TTL");
    until(TTL + Duration::from_secs(10), "c's keys expire", || {
        matches!(peer.lookup("c"), Err(Error::UnknownAgent(_)))
    });
    let took = t0.elapsed();
    eprintln!("c's keys expired {took:?} after its last renewal stopped (TTL {TTL:?})");
    assert!(
        took >= TTL / 2,
        "gone after {took:?}: expired with the lease, not earlier"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_lost_resolved_peers_keep_working_lookups_fail_typed_and_segments_come_back() {
    let tb = Testbed::get();
    let mut etcd = Etcd::start("lost");
    let (ma, mb) = (backend(&etcd), backend(&etcd));
    let (a, b) = (agent(&tb, "a", &ma), agent(&tb, "b", &mb));
    const LEN: usize = 1 << 20;
    a.register("src", host(&pattern(LEN, 4), LEN)).unwrap();
    b.register("dst", host(&[], LEN)).unwrap();
    let w = Batch::new().write("src", 0, "b", "dst", 0, LEN as u64);
    a.transfer(&w).unwrap().wait(WAIT).expect("b resolved");
    let lease = mb.lease().expect("b's lease");

    etcd.stop();
    // Resolved: goes on without etcd.
    a.transfer(&w).unwrap().wait(WAIT).expect("still works");
    // Never resolved: refused, typed.
    match a.transfer(&Batch::new().write("src", 0, "nobody", "x", 0, 1)) {
        Err(Error::Metadata { .. }) => {}
        r => panic!("a look-up without etcd: {r:?}"),
    }
    assert!(matches!(ma.lookup("nobody"), Err(Error::Metadata { .. })));
    // b registers meanwhile: kept, published when etcd is back.
    b.register("while-lost", host(&pattern(4096, 8), 4096))
        .expect("registered while etcd is lost");

    etcd.start_again();
    until(Duration::from_secs(60), "b publishes again", || {
        mb.lease().is_some_and(|l| l != lease)
    });
    assert_eq!(mb.republish_error(), None);
    // A new peer finds b's segments, the one registered while etcd was lost included.
    let mc = backend(&etcd);
    let c = agent(&tb, "c", &mc);
    let mut names = segments(&mc, "b");
    names.sort();
    assert_eq!(names, ["dst", "while-lost"]);
    c.register("in", host(&[], 4096)).unwrap();
    c.transfer(&Batch::new().read("in", 0, "b", "while-lost", 0, 4096))
        .unwrap()
        .wait(WAIT)
        .expect("c reads b's segment");
    assert_eq!(bytes(c.unregister("in").unwrap()), pattern(4096, 8));
    assert_eq!(bytes(b.unregister("dst").unwrap()), pattern(LEN, 4));
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_a_segment_etcd_refuses_fails_register_and_stays_unpublished() {
    let tb = Testbed::get();
    let etcd = Etcd::start("refused");
    let (ma, mb) = (backend(&etcd), backend(&etcd));
    let (a, b) = (agent(&tb, "a", &ma), agent(&tb, "b", &mb));
    const LEN: usize = 4096;
    a.register("ok", host(&pattern(LEN, 5), LEN)).unwrap();
    // b follows a from here on (its look-up starts a watch).
    assert_eq!(segments(&mb, "a"), ["ok"]);
    let lease = ma.lease().expect("a's lease");

    // A key and value of 2 MiB each: past etcd's request limit (--max-request-bytes, 1.5
    // MiB by default), refused by etcd, not lost on the way.
    let huge = "x".repeat(2 << 20);
    match a.register(&huge, host(&[], LEN)) {
        Err(Error::MetadataRefused { op, detail }) => {
            eprintln!("refused: {op}: {detail}");
            assert!(detail.contains("etcd refused"), "{op}: {detail}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a segment etcd refuses was reported registered"),
    }
    let names = |d: gpu_rdma_engine::AgentDescriptor| -> Vec<String> {
        d.segments.into_iter().map(|s| s.name).collect()
    };
    assert_eq!(names(a.descriptor()), ["ok"], "deregistered again");
    assert_eq!(
        ma.lease(),
        Some(lease),
        "taken for a refusal, not a loss of etcd"
    );
    assert_eq!(ma.republish_error(), None);

    // Later publications go on; b's watch, which delivers in order, never saw the refused
    // segment.
    a.register("after", host(&[], LEN)).unwrap();
    until(Duration::from_secs(30), "b sees a's next segment", || {
        segments(&mb, "a").contains(&"after".to_string())
    });
    let mut seen = segments(&mb, "a");
    seen.sort();
    assert_eq!(seen, ["after", "ok"]);
    // A new peer reads etcd afresh: the same.
    let mc = backend(&etcd);
    let mut read = segments(&mc, "a");
    read.sort();
    assert_eq!(read, ["after", "ok"]);

    // The first segment still works.
    b.register("in", host(&[], LEN)).unwrap();
    b.transfer(&Batch::new().read("in", 0, "a", "ok", 0, LEN as u64))
        .unwrap()
        .wait(WAIT)
        .expect("b reads a's first segment");
    assert_eq!(bytes(b.unregister("in").unwrap()), pattern(LEN, 5));
    assert_eq!(ma.lease(), Some(lease));
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_descriptor_of_another_version_is_refused_typed() {
    const NEXT: u16 = gpu_rdma_engine::FORMAT_VERSION + 1;
    let etcd = Etcd::start("version");
    // Unsigned values, so that the test can change their version in place (signed ones
    // changed so are refused as forged: etcd_values_written_by_others_are_refused...).
    let open = || backend_with(&etcd, Auth::InsecureNoAuthentication);
    let (m1, m2, peer) = (open(), open(), open());
    m1.publish(&made_up("rec", 1), CONTROL.parse().unwrap())
        .unwrap();
    m2.publish(&made_up("seg", 2), CONTROL.parse().unwrap())
        .unwrap();
    let (rt, mut c) = raw_etcd(&etcd, None);
    rt.block_on(async {
        // The agent record of "rec", as a writer of the next version would put it.
        let key = m1.record_key("rec");
        let got = c.get(key.clone(), None).await.unwrap();
        let mut v = got.kvs()[0].value().to_vec();
        v[4..6].copy_from_slice(&NEXT.to_le_bytes());
        c.put(key, v, None).await.unwrap();
        // A segment of "seg" in the next version.
        let mut v = made_up("seg", 2).to_bytes();
        v[4..6].copy_from_slice(&NEXT.to_le_bytes());
        c.put(m2.segment_key("seg", "kv"), v, None).await.unwrap();
    });
    for agent in ["rec", "seg"] {
        match peer.lookup(agent) {
            Err(Error::IncompatibleVersion { found, supported }) if found == NEXT => {
                assert_eq!(supported, gpu_rdma_engine::FORMAT_VERSION)
            }
            r => panic!("{agent}: {r:?}"),
        }
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_values_written_by_others_are_refused_typed_and_counted() {
    let etcd = Etcd::start("forged");
    let (honest, peer) = (backend(&etcd), backend(&etcd));
    honest
        .publish(&made_up("honest", 1), CONTROL.parse().unwrap())
        .unwrap();
    assert_eq!(segments(&peer, "honest"), ["kv"]);
    // An agent of no cluster (unsigned values) and one of another cluster.
    let open = backend_with(&etcd, Auth::InsecureNoAuthentication);
    open.publish(&made_up("mallory", 2), CONTROL.parse().unwrap())
        .unwrap();
    let other = Auth::ClusterKey(ClusterKey::generate().unwrap());
    let eve = backend_with(&etcd, other);
    eve.publish(&made_up("eve", 3), CONTROL.parse().unwrap())
        .unwrap();
    let (rt, mut c) = raw_etcd(&etcd, None);
    rt.block_on(async {
        // honest's signed values, copied under the keys of a made-up agent "thief".
        for (from, to) in [
            (honest.record_key("honest"), honest.record_key("thief")),
            (
                honest.segment_key("honest", "kv"),
                honest.segment_key("thief", "kv"),
            ),
        ] {
            let got = c.get(from, None).await.unwrap();
            c.put(to, got.kvs()[0].value().to_vec(), None)
                .await
                .unwrap();
        }
    });
    for agent in ["mallory", "eve", "thief"] {
        match peer.lookup(agent) {
            Err(e @ Error::Authentication { .. }) => {
                assert_eq!(e.kind(), ErrorKind::Unauthenticated);
                eprintln!("{agent}: {e}");
            }
            r => panic!("{agent}'s forged values gave {r:?}"),
        }
    }
    assert!(peer.refused_values() >= 3, "{}", peer.refused_values());
    // honest's own values still read, and a backend without the key refuses them.
    assert_eq!(segments(&peer, "honest"), ["kv"]);
    assert!(matches!(
        open.lookup("honest"),
        Err(Error::Authentication { .. })
    ));
    // A value changed in place: one bit of the rkey.
    rt.block_on(async {
        let key = honest.segment_key("honest", "kv");
        let got = c.get(key.clone(), None).await.unwrap();
        let mut v = got.kvs()[0].value().to_vec();
        let at = v.len() - 32 - 6;
        v[at] ^= 1;
        c.put(key, v, None).await.unwrap();
    });
    until(
        Duration::from_secs(30),
        "the watch delivers the change",
        || matches!(peer.lookup("honest"), Err(Error::Authentication { .. })),
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_with_its_own_authentication_refuses_a_client_without_its_user() {
    let etcd = Etcd::start("users");
    let prefix = EtcdSettings::default().prefix;
    let (rt, mut c) = raw_etcd(&etcd, None);
    rt.block_on(async {
        c.user_add("root", "root-secret", None).await.unwrap();
        c.user_grant_role("root", "root").await.unwrap();
        c.role_add("agents").await.unwrap();
        let perm = etcd_client::Permission::read_write(prefix.clone()).with_prefix();
        c.role_grant_permission("agents", perm).await.unwrap();
        c.user_add("agent", "agent-secret", None).await.unwrap();
        c.user_grant_role("agent", "agents").await.unwrap();
        c.auth_enable().await.unwrap();
    });
    let with_user = |user: Option<EtcdUser>| {
        EtcdMetadata::new(EtcdSettings {
            endpoints: vec![etcd.endpoint()],
            lease_ttl: TTL,
            timeout: Duration::from_secs(5),
            user,
            ..EtcdSettings::default()
        })
    };
    let agent = || {
        Some(EtcdUser {
            name: "agent".into(),
            password: "agent-secret".into(),
        })
    };
    let (a, b) = (with_user(agent()).unwrap(), with_user(agent()).unwrap());
    a.publish(&made_up("a", 1), CONTROL.parse().unwrap())
        .unwrap();
    assert_eq!(segments(&b, "a"), ["kv"]);
    // Without the user, or with a wrong password: nothing read, nothing written.
    let wrong = Some(EtcdUser {
        name: "agent".into(),
        password: "guess".into(),
    });
    for user in [None, wrong] {
        let shown = format!("{user:?}");
        assert!(
            !shown.contains("secret") && !shown.contains("guess"),
            "{shown}"
        );
        match with_user(user) {
            Err(e) => eprintln!("{shown}: {e}"),
            Ok(m) => {
                let r = m.lookup("a");
                assert!(r.is_err(), "{shown} read the agent: {r:?}");
                let p = m.publish(&made_up("mallory", 2), CONTROL.parse().unwrap());
                assert!(p.is_err(), "{shown} published");
            }
        }
    }
    assert!(matches!(b.lookup("mallory"), Err(Error::UnknownAgent(_))));
}

#[test]
#[ignore = "needs the testbed VM"]
fn etcd_over_tls_with_client_certificates_and_values_signed_by_their_agents() {
    let ca = Ca::new("etcd-tls");
    let etcd = Etcd::start_tls("tls", ca.issue("127.0.0.1"));
    let backend_as = |files: TlsFiles, identity: bool| {
        EtcdMetadata::new(EtcdSettings {
            endpoints: vec![etcd.endpoint()],
            lease_ttl: TTL,
            timeout: Duration::from_secs(5),
            tls: Some(EtcdTls {
                ca: ca.ca(),
                identity: identity.then(|| (files.cert.clone(), files.key.clone())),
            }),
            auth: Auth::MutualTls(files),
            ..EtcdSettings::default()
        })
    };
    let (a, b) = (ca.issue("a"), ca.issue("b"));
    let (ma, mb) = (
        backend_as(a.clone(), true).unwrap(),
        backend_as(b.clone(), true).unwrap(),
    );
    ma.publish(&made_up("a", 1), CONTROL.parse().unwrap())
        .unwrap();
    mb.publish(&made_up("b", 2), CONTROL.parse().unwrap())
        .unwrap();
    assert_eq!(segments(&mb, "a"), ["kv"]);
    // b's certificate does not name a: b cannot publish as a.
    let e = backend_as(b.clone(), true)
        .unwrap()
        .publish(&made_up("a", 3), CONTROL.parse().unwrap())
        .expect_err("b published as a");
    assert!(e.to_string().contains("does not name agent \"a\""), "{e}");
    // No client certificate: etcd refuses the connection.
    let r = backend_as(b.clone(), false).and_then(|m| m.lookup("a"));
    assert!(r.is_err(), "etcd served a client without a certificate");
    // b's own signed values, written under a's keys by a writer of the prefix.
    let read = |p: &std::path::Path| std::fs::read(p).unwrap();
    let tls = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&ca.ca())))
        .identity(etcd_client::Identity::from_pem(read(&b.cert), read(&b.key)));
    let (rt, mut c) = raw_etcd(
        &etcd,
        Some(etcd_client::ConnectOptions::new().with_tls(tls)),
    );
    rt.block_on(async {
        for (from, to) in [
            (mb.record_key("b"), ma.record_key("a")),
            (mb.segment_key("b", "kv"), ma.segment_key("a", "kv")),
        ] {
            let got = c.get(from, None).await.unwrap();
            c.put(to, got.kvs()[0].value().to_vec(), None)
                .await
                .unwrap();
        }
    });
    let peer = backend_as(ca.issue("c"), true).unwrap();
    match peer.lookup("a") {
        Err(e @ Error::Authentication { .. }) => eprintln!("a, rewritten by b: {e}"),
        r => panic!("values b signed were taken as a's: {r:?}"),
    }
    assert!(peer.refused_values() >= 1);
    assert_eq!(segments(&peer, "b"), ["kv"]);
}
