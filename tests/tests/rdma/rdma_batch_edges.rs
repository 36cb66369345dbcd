//! Edges of the batch's two send paths, found by an independent review of the extended
//! send verbs' batch (all held): full-depth batches back to back on a send queue with no
//! slack (rxe's ring holds exactly a depth of 2^n - 1: had the slots counted less
//! cautiously than the provider, the provider would refuse a chain mid-section, which on the
//! extended path stops the queue pair), and rdma_cm queue pairs, created through
//! `rdma_create_qp_ex`, on both paths. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pattern, pd};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Local, ProtectionDomain, QueuePair, QueuePairBuilder,
    RemoteRegion,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);

/// `len` bytes of pattern `n`, as a part of its (page-sized) region.
fn src(pd: &Arc<ProtectionDomain>, n: u8, len: usize) -> Local<rdma_dmabuf::HostBuffer> {
    Local::new(
        host_region(pd, &pattern(len, n), len, Access::empty()),
        0..len as u64,
    )
}

/// Depth 2^n - 1: rxe's ring has exactly `depth` usable entries, no slack. A batch of the
/// whole depth, posted again as soon as the last one's completion is taken, must never be
/// refused by the provider (which on the extended path would kill the queue pair).
#[test]
#[ignore = "needs the testbed VM"]
fn full_depth_batches_back_to_back_on_a_ring_without_slack() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    for depth in [7u32, 15] {
        let (a, _b) = connect_pair(
            QueuePairBuilder::new(&pd).send_depth(depth),
            QueuePairBuilder::new(&pd),
        );
        assert!(a.extended_verbs());
        let target = host_region(&pd, &[], 15 * 64, RW);
        let r = target.remote().unwrap();
        for round in 0..300u32 {
            let n = round as u8;
            let res = if depth == 7 {
                let parts: [_; 7] = std::array::from_fn(|j| src(&pd, n ^ j as u8, 64));
                let rem = std::array::from_fn(|j| r.slice(64 * j as u64, 64).unwrap());
                a.post_write_batch(parts, rem)
                    .map(|p| p.spin_timeout(T).unwrap().unwrap().parts.len())
                    .map_err(|e| (e.error, e.parts.is_some()))
            } else {
                let parts: [_; 15] = std::array::from_fn(|j| src(&pd, n ^ j as u8, 64));
                let rem = std::array::from_fn(|j| r.slice(64 * j as u64, 64).unwrap());
                a.post_write_batch(parts, rem)
                    .map(|p| p.spin_timeout(T).unwrap().unwrap().parts.len())
                    .map_err(|e| (e.error, e.parts.is_some()))
            };
            match res {
                Ok(k) => assert_eq!(k as u32, depth),
                Err((e, back)) => panic!("depth {depth} round {round}: {e} (parts back: {back})"),
            }
        }
        // Mixed: a single write outstanding, then a batch of depth - 1, both at once.
        for round in 0..100u8 {
            let one = a
                .post_write(src(&pd, round, 64), r.slice(0, 64).unwrap(), None)
                .unwrap();
            if depth == 7 {
                let parts: [_; 6] = std::array::from_fn(|j| src(&pd, round ^ j as u8, 64));
                let rem = std::array::from_fn(|j| r.slice(64 * (j as u64 + 1), 64).unwrap());
                let b = a
                    .post_write_batch(parts, rem)
                    .unwrap_or_else(|e| panic!("{}", e.error));
                b.spin_timeout(T).unwrap().unwrap();
            } else {
                let parts: [_; 14] = std::array::from_fn(|j| src(&pd, round ^ j as u8, 64));
                let rem = std::array::from_fn(|j| r.slice(64 * (j as u64 + 1), 64).unwrap());
                let b = a
                    .post_write_batch(parts, rem)
                    .unwrap_or_else(|e| panic!("{}", e.error));
                b.spin_timeout(T).unwrap().unwrap();
            }
            one.spin_timeout(T).unwrap().unwrap();
        }
    }
}

/// Both ends of an rdma_cm connection get the path asked for (`rdma_create_qp_ex`), and a
/// batch lands on each.
#[test]
#[ignore = "needs the testbed VM"]
fn rdma_cm_queue_pairs_get_the_extended_verbs_and_batches_land() {
    let tb = Testbed::get();
    for (port, extended) in [(20181u16, true), (20182, false)] {
        let addr: SocketAddr = format!("{}:{port}", tb.local_addr).parse().unwrap();
        let server = std::thread::spawn(move || {
            let listener = CmListener::bind(addr).expect("bind");
            let ctx = listener.context().unwrap();
            let pd = ProtectionDomain::new(&ctx).unwrap();
            let target = host_region(&pd, &[], 4 * 256, RW);
            let announce = target.remote().unwrap().to_bytes();
            let (qp, _) = listener
                .accept(
                    QueuePairBuilder::new(&pd).extended_verbs(extended),
                    &announce,
                    T,
                )
                .expect("accept");
            assert_eq!(qp.extended_verbs(), extended, "server side");
            qp.wait_disconnected(Duration::from_secs(60))
                .expect("disconnect");
            drop(qp);
            let host = target.into_inner().unwrap();
            let want: Vec<u8> = (0..4u8).flat_map(|j| pattern(256, 40 + j)).collect();
            assert_eq!(&host.as_slice()[..1024], &want[..]);
        });
        let deadline = std::time::Instant::now() + T;
        let (qp, announce, pd) = loop {
            let c = CmConnector::resolve(addr, T).unwrap();
            let pd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
            match c.connect(
                QueuePairBuilder::new(&pd).extended_verbs(extended),
                b"hi",
                T,
            ) {
                Ok((qp, a)) => break (qp, a, pd),
                Err(e)
                    if std::time::Instant::now() < deadline
                        && e.errno() == Some(libc::ECONNREFUSED) =>
                {
                    std::thread::sleep(Duration::from_millis(100))
                }
                Err(e) => panic!("connect: {e}"),
            }
        };
        let qp: QueuePair = qp;
        assert_eq!(qp.extended_verbs(), extended, "client side");
        let remote = RemoteRegion::from_bytes(&announce).unwrap();
        let parts: [_; 4] = std::array::from_fn(|j| src(&pd, 40 + j as u8, 256));
        let rem = std::array::from_fn(|j| remote.slice(256 * j as u64, 256).unwrap());
        qp.post_write_batch(parts, rem)
            .unwrap()
            .spin_timeout(T)
            .unwrap()
            .unwrap();
        drop(qp);
        server.join().expect("server");
    }
}
