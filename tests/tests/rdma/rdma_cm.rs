//! rdma_cm connections (rdma-dmabuf's `cm`): the classic workflow over the testbed's rxe
//! device, in one VM and across the two-node wire. The region the peer may write is announced
//! in the connection's private data. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, pattern};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Endpoint, ErrorKind, Local, ProtectionDomain,
    QueuePairBuilder, RemoteRegion,
};
use std::net::SocketAddr;
use std::time::Duration;

const T: Duration = Duration::from_secs(120);
const SIZE: usize = 1 << 20;
/// What the two-node test writes across the wire: 64 MiB, every byte checked.
const TWO_NODE_SIZE: usize = 64 << 20;
const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

/// Listens on `addr`, announces a writable region, waits for the peer's write-with-immediate,
/// checks the bytes, then waits for the peer to disconnect. Returns the queue pair's
/// endpoints (its own, the peer's).
fn serve(addr: SocketAddr, seed: u8, size: usize) -> (Endpoint, Endpoint) {
    let listener = CmListener::bind(addr).expect("bind and listen");
    let ctx = listener.context().expect("the listener's device");
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let target = host_region(&pd, &[], size, RW);
    let announce = target.remote().unwrap().to_bytes();
    let (qp, hello) = listener
        .accept(QueuePairBuilder::new(&pd), &announce, T)
        .expect("accept");
    assert_eq!(hello, b"hello from the client");
    let note = qp
        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
        .unwrap();
    let got = note
        .spin_timeout(T)
        .expect("the write's immediate arrives")
        .expect("ok");
    assert_eq!(got.wc.imm, Some(size as u32));
    qp.wait_disconnected(T).expect("the client disconnects");
    let endpoints = (qp.endpoint(), qp.remote_endpoint());
    drop(qp);
    let host = target.into_inner().unwrap();
    assert_eq!(&host.as_slice()[..size], &pattern(size, seed)[..]);
    endpoints
}

/// Connects to `addr`, writes the pattern into the announced region, then disconnects.
/// Returns the queue pair's endpoints (its own, the peer's).
fn client(addr: SocketAddr, seed: u8, size: usize) -> (Endpoint, Endpoint) {
    let connector = CmConnector::resolve(addr, T).expect("resolve address and route");
    let ctx = connector.context().unwrap();
    let pd = ProtectionDomain::new(&ctx).unwrap();
    let src = host_region(&pd, &pattern(size, seed), size, Access::empty());
    let deadline = std::time::Instant::now() + T;
    let (qp, announce) = loop {
        // The server may not listen yet: a refusal is retried until the deadline.
        let c = CmConnector::resolve(addr, T).unwrap();
        match c.connect(QueuePairBuilder::new(&pd), b"hello from the client", T) {
            Ok(ok) => break ok,
            Err(e)
                if std::time::Instant::now() < deadline
                    && e.errno() == Some(libc::ECONNREFUSED) =>
            {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    drop(connector);
    let remote = RemoteRegion::from_bytes(&announce).expect("the server's region");
    assert_eq!(remote.len, size as u64);
    let done = qp
        .post_write(Local::new(src, 0..size as u64), remote, Some(size as u32))
        .unwrap()
        .spin();
    done.expect("write completes");
    (qp.endpoint(), qp.remote_endpoint())
    // Dropping the queue pair disconnects.
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_cm_connects_writes_and_disconnects_over_loopback() {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:20079", tb.local_addr).parse().unwrap();
    let server = std::thread::spawn(move || serve(addr, 5, SIZE));
    let (client_ep, client_sees) = client(addr, 5, SIZE);
    let (server_ep, server_sees) = server.join().expect("server side");
    // Each side's idea of its peer is what the peer says of itself (rdma_cm set both up).
    assert_eq!(client_sees.qpn, server_ep.qpn);
    assert_eq!(server_sees.qpn, client_ep.qpn);
    assert_ne!(client_ep.qpn, server_ep.qpn);
    assert_eq!(client_sees.psn, server_ep.psn);
    assert_eq!(server_sees.psn, client_ep.psn);
    assert_eq!(client_sees.gid, server_ep.gid);
    let ip: std::net::Ipv4Addr = tb.local_addr.parse().unwrap();
    assert_eq!(
        client_ep.gid.0[12..],
        ip.octets(),
        "the RoCEv2 GID of the address"
    );
    assert_eq!(client_ep.mtu, server_ep.mtu);
}

#[test]
#[ignore = "needs the testbed VM"]
fn rdma_cm_refusals_are_typed() {
    let tb = Testbed::get();
    // Nobody listens on this port: the connect is rejected.
    let addr: SocketAddr = format!("{}:20099", tb.local_addr).parse().unwrap();
    let c = CmConnector::resolve(addr, T).expect("resolve");
    let pd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
    let err = c.connect(QueuePairBuilder::new(&pd), &[], T).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ECONNREFUSED), "{err}");
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    // Retrying gives up after its patience with the same kind, bounded.
    let started = std::time::Instant::now();
    let err = CmConnector::resolve(addr, T)
        .unwrap()
        .connect_retrying(
            QueuePairBuilder::new(&pd),
            &[],
            T,
            Duration::from_millis(500),
        )
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Too much private data.
    let c = CmConnector::resolve(addr, T).expect("resolve");
    let err = c
        .connect(QueuePairBuilder::new(&pd), &[0; 55], T)
        .unwrap_err();
    assert!(err.to_string().contains("at most 54"), "{err}");
    // A wildcard listener has no device to create regions on.
    let l = CmListener::bind("0.0.0.0:20098".parse().unwrap()).expect("wildcard bind");
    let err = l.context().unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENODEV), "{err}");
    // No request within the timeout.
    let l = CmListener::bind(format!("{}:20097", tb.local_addr).parse().unwrap()).unwrap();
    let pd = ProtectionDomain::new(&l.context().unwrap()).unwrap();
    let err = l
        .accept(QueuePairBuilder::new(&pd), &[], Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.errno(), Some(libc::ETIMEDOUT), "{err}");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
}

/// A request the listener adopts but cannot take (its queue pair cannot be made: a send
/// queue far past the device's) is rejected: the client hears `Refused` at once instead of
/// waiting out its timeout, and the listener's refusal is typed.
#[test]
#[ignore = "needs the testbed VM"]
fn a_request_the_listener_cannot_take_is_rejected_at_once() {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:20096", tb.local_addr).parse().unwrap();
    let listener = CmListener::bind(addr).expect("bind and listen");
    let pd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
    let server = std::thread::spawn(move || {
        let huge = QueuePairBuilder::new(&pd).send_depth(1 << 30);
        listener.accept(huge, &[], T).map(drop)
    });
    let c = CmConnector::resolve(addr, T).expect("resolve");
    let cpd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
    let started = std::time::Instant::now();
    let err = c
        .connect(QueuePairBuilder::new(&cpd), &[], Duration::from_secs(60))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Refused, "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused only after {:?}: {err}",
        started.elapsed()
    );
    let refused = server.join().unwrap().unwrap_err();
    assert!(!refused.to_string().is_empty());
}

/// A client started before its server connects once the server listens (one protection
/// domain for every try), and the server learns that the client is done by
/// awaiting the disconnect on tokio.
#[test]
#[ignore = "needs the testbed VM"]
fn rdma_cm_connect_retrying_reaches_a_late_listener_and_the_end_is_awaited() {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:20081", tb.local_addr).parse().unwrap();
    let server = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(1500));
        let listener = CmListener::bind(addr).expect("bind and listen");
        let pd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
        let (qp, hello) = listener
            .accept(QueuePairBuilder::new(&pd), b"welcome", T)
            .expect("accept");
        assert_eq!(hello, b"late hello");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let started = std::time::Instant::now();
        rt.block_on(qp.wait_disconnected_async(T))
            .expect("the client's disconnect is awaited");
        assert!(qp.is_in_error(), "the ended connection takes no more posts");
        started.elapsed()
    });
    let connector = CmConnector::resolve(addr, T).expect("resolve");
    let pd = ProtectionDomain::new(&connector.context().unwrap()).unwrap();
    let started = std::time::Instant::now();
    let (qp, welcome) = connector
        .connect_retrying(QueuePairBuilder::new(&pd), b"late hello", T, T)
        .expect("connects once the server listens");
    assert!(
        started.elapsed() >= Duration::from_millis(1000),
        "connected before the server listened?"
    );
    assert_eq!(welcome, b"welcome");
    // "I am done": the disconnect.
    drop(qp);
    let waited = server.join().expect("server side");
    assert!(waited < T, "{waited:?}");
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_rdma_cm_write_across_the_wire() {
        let tb = Testbed::get();
        if tb.is_server() {
            serve(
                format!("{}:20080", tb.local_addr).parse().unwrap(),
                6,
                TWO_NODE_SIZE,
            );
        } else {
            let (_, server) = client(
                format!("{}:20080", tb.peer_addr).parse().unwrap(),
                6,
                TWO_NODE_SIZE,
            );
            // The peer's GID is node a's RoCEv2 address.
            let ip: std::net::Ipv4Addr = tb.peer_addr.parse().unwrap();
            assert_eq!(server.gid.0[12..], ip.octets());
        }
    }
}
