//! Drop order follows libibverbs' and librdmacm's rules whatever order the program drops its
//! handles in: every child (region, completion channel, completion queue, queue pair, cm id)
//! holds its parent until after it is destroyed, so a queue pair outliving the last handle to
//! its context and protection domain is destroyed first (QP, CQ, completion channel), and only
//! then are the protection domain and the context freed.
//!
//! Each `parents_first_*` test drops the context and protection domain handles before the
//! objects made from them; [`drop_order_under_valgrind_has_no_memory_error`] runs them all
//! under memcheck and requires 0 errors (a use-after-free inside libibverbs shows there, not as
//! a crash). Runs in the testbed VM.

use integration_tests::process::{test_name, valgrind_self};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pattern};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Context, DeviceMemory, MemoryRegion, MultiChannelBuilder,
    ProtectionDomain, QueuePairBuilder,
};
use std::net::SocketAddr;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// How many `parents_first_*` tests there are (the valgrind run checks they all ran).
const SCENARIOS: usize = 7;

fn open(tb: &Testbed) -> (std::sync::Arc<Context>, std::sync::Arc<ProtectionDomain>) {
    let ctx = Context::open(&tb.device).expect("open the testbed's rdma device");
    let pd = ProtectionDomain::new(&ctx).expect("protection domain");
    (ctx, pd)
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_connected_queue_pairs_with_completion_channels() {
    let tb = Testbed::get();
    let (ctx, pd) = open(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    let src = host_region(&pd, &pattern(4096, 3), 4096, Access::empty());
    let dst = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    // A receive left in flight with its handle dropped: its region stays with the queue.
    let orphan = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    // The program lets go of the context and the protection domain first.
    drop(ctx);
    drop(pd);
    let r = b.post_recv(dst).unwrap();
    let s = a.post_send(src, None).unwrap();
    s.wait(T).expect("send completes").expect("ok");
    let got = r.wait(T).expect("receive completes").expect("ok");
    assert_eq!(&got.region.bytes().unwrap()[..4096], &pattern(4096, 3)[..]);
    drop(got);
    drop(b.post_recv(orphan).unwrap());
    // The last handles to the protection domain and the context are in the queue pairs and
    // the orphaned region: dropping the queue pairs must destroy QP, CQ and completion channel
    // before the protection domain and the context go.
    drop(b);
    drop(a);
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_prepared_queue_pair_with_completion_channel() {
    let tb = Testbed::get();
    let (ctx, pd) = open(&tb);
    let qp = QueuePairBuilder::new(&pd)
        .completion_channel(true)
        .build()
        .unwrap();
    drop(ctx);
    drop(pd);
    // The queue pair holds the last reference to the protection domain.
    drop(qp);
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_host_region_outlives_its_handles() {
    let tb = Testbed::get();
    let (ctx, pd) = open(&tb);
    let mr = host_region(&pd, &[1; 64], 1 << 16, Access::LOCAL_WRITE);
    drop(ctx);
    drop(pd);
    assert_eq!(mr.bytes().unwrap()[0], 1);
    // Deregistered, then the protection domain, then the context.
    drop(mr);
    // And `into_inner` after the parents went.
    let (ctx, pd) = open(&tb);
    let mr = host_region(&pd, &[2; 64], 1 << 16, Access::LOCAL_WRITE);
    drop((ctx, pd));
    let buf = mr.into_inner().unwrap();
    assert_eq!(buf.as_slice()[0], 2);
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_dmabuf_regions_outlive_their_handles() {
    let tb = Testbed::get();
    for exporter in integration_tests::exporters::ALL {
        let (ctx, pd) = open(&tb);
        let buf = exporter.allocate(1 << 16);
        let mr = MemoryRegion::register_dmabuf(&pd, buf, 0, 1 << 16, None, Access::LOCAL_WRITE)
            .unwrap_or_else(|e| panic!("{exporter:?}: {e}"));
        drop(ctx);
        drop(pd);
        drop(mr);
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_multi_channel_outlives_its_handles() {
    let tb = Testbed::get();
    let (ctx, pd) = open(&tb);
    let hub = MultiChannelBuilder::new(&pd, 2).build().unwrap();
    let peers: Vec<_> = (0..2)
        .map(|_| {
            QueuePairBuilder::new(&pd)
                .completion_channel(true)
                .build()
                .unwrap()
        })
        .collect();
    let hub_eps = hub.endpoints();
    let peer_eps: Vec<_> = peers.iter().map(|p| p.endpoint()).collect();
    let hub = hub.connect(&peer_eps).unwrap();
    let peers: Vec<_> = peers
        .into_iter()
        .zip(&hub_eps)
        .map(|(p, e)| p.connect(e).unwrap())
        .collect();
    drop(ctx);
    drop(pd);
    drop(peers);
    drop(hub);
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_rdma_cm_queue_pairs_outlive_listener_connector_and_pd() {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:20190", tb.local_addr).parse().unwrap();
    let listener = CmListener::bind(addr).expect("bind");
    let server = std::thread::spawn(move || {
        let ctx = listener.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        let (qp, _) = listener
            .accept(QueuePairBuilder::new(&pd).completion_channel(true), b"", T)
            .expect("accept");
        let note = qp
            .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
            .unwrap();
        // The listener (whose id and event channel are the accepted id's parents in
        // librdmacm), the protection domain and the context go first.
        drop(listener);
        drop(ctx);
        drop(pd);
        note.wait(T).expect("note arrives").expect("ok");
        qp.wait_disconnected(T).expect("the client disconnects");
        drop(qp);
    });
    let (qp, note) = loop {
        let c = CmConnector::resolve(addr, T).expect("resolve");
        let ctx = c.context().unwrap();
        let pd = ProtectionDomain::new(&ctx).unwrap();
        match c.connect(QueuePairBuilder::new(&pd).completion_channel(true), b"", T) {
            Ok((qp, _)) => {
                let note = host_region(&pd, b"bye", 4096, Access::empty());
                // The connector went with `connect`; now the context and the PD handles.
                drop((ctx, pd));
                break (qp, note);
            }
            Err(e) if e.errno() == Some(libc::ECONNREFUSED) => {
                std::thread::sleep(Duration::from_millis(100))
            }
            Err(e) => panic!("connect: {e}"),
        }
    };
    qp.post_send(note, None)
        .unwrap()
        .wait(T)
        .expect("note sent")
        .expect("ok");
    drop(qp);
    server.join().expect("server side");
}

#[test]
#[ignore = "needs the testbed VM"]
fn parents_first_device_memory_is_refused_without_leaking_its_context() {
    let tb = Testbed::get();
    let (ctx, pd) = open(&tb);
    // rxe has no device memory: the refusal must not keep or free the context early.
    match DeviceMemory::allocate(&ctx, 4096, 0) {
        Err(e) => assert!(e.is_unsupported(), "{e}"),
        Ok(dm) => {
            let mr = MemoryRegion::register_dm(&pd, dm, Access::LOCAL_WRITE).unwrap();
            drop((ctx, pd));
            drop(mr);
            return;
        }
    }
    drop(ctx);
    drop(pd);
}

#[test]
#[ignore = "needs the testbed VM"]
fn drop_order_under_valgrind_has_no_memory_error() {
    Testbed::get();
    valgrind_self(&[&test_name(module_path!(), "parents_first_")], SCENARIOS);
}
