//! How a queue pair's end reaches what depends on it. The poll that sees a queue pair's first
//! error completion flushes it once more (for what was posted before anyone knew): on a queue
//! pair attached to a shared receive queue only that queue pair ends and the shared receives
//! stay posted for the others; on a multi-peer channel only the failing peer's queue pair; on
//! an rdma_cm connection the peer learns through DISCONNECTED. And `wait_disconnected` leaves
//! the queue pair flushed with the end recorded, so an awaited receive on the dead connection
//! ends (the wait never eats the DISCONNECTED event that ends it). Runs in the testbed VM;
//! every test takes a lock.

use integration_tests::process::{alone, within};
use integration_tests::runtime::run_local;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, hub_and_peers, pd};
use rdma_dmabuf::{
    Access, CmConnector, CmListener, Error, MultiChannelBuilder, ProtectionDomain, QueuePair,
    QueuePairBuilder, RemoteRegion, SharedReceiveQueue,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);
const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
/// `IBV_WC_WR_FLUSH_ERR`.
const FLUSH_ERR: u32 = 5;

fn status(e: &Error) -> Option<u32> {
    match e {
        Error::Completion { status, .. } => Some(*status),
        _ => None,
    }
}

/// A remote region whose rkey nobody registered: a write to it fails at the peer
/// (`REM_ACCESS_ERR`), at once.
fn bogus(real: RemoteRegion) -> RemoteRegion {
    RemoteRegion {
        rkey: real.rkey ^ 0x00ff_ff00,
        ..real
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_failing_send_of_an_srq_queue_pair_flushes_it_alone_and_the_shared_receives_stay_posted() {
    let _l = alone();
    within(Duration::from_secs(90), "srq + first-error flush", || {
        let tb = Testbed::get();
        let pd = pd(&tb);
        let srq = SharedReceiveQueue::new(&pd, 8).unwrap();
        // Two pairs whose `b` side receives through the shared queue.
        let pairs: Vec<(QueuePair, QueuePair)> = (0..2)
            .map(|_| {
                connect_pair(
                    QueuePairBuilder::new(&pd),
                    QueuePairBuilder::new(&pd).srq(&srq),
                )
            })
            .collect();
        let inbox: Vec<_> = (0..4)
            .map(|_| {
                srq.post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap()
            })
            .collect();
        // b0 (on the SRQ) writes to a bogus rkey at a0: its first error completion.
        let target = host_region(&pd, &[], 4096, RW);
        let src = host_region(&pd, b"x", 4096, Access::empty());
        let e = pairs[0]
            .1
            .post_write(src.into_part(0..1), bogus(target.remote().unwrap()), None)
            .unwrap()
            .spin();
        let e = e.expect_err("bogus rkey");
        eprintln!("b0's write: {}", e.error);
        assert!(pairs[0].1.is_in_error());
        assert!(!pairs[1].1.is_in_error(), "another queue pair of the SRQ");
        // Give rxe a moment to flush whatever it would flush.
        std::thread::sleep(Duration::from_millis(200));
        srq.poll().unwrap();
        assert_eq!(
            srq.outstanding(),
            4,
            "the flush of b0 must not take the shared queue's receives"
        );
        // a1 sends four messages to b1: every shared receive fills with success.
        for k in 0..4u8 {
            let src = host_region(&pd, &[b'a' + k], 4096, Access::empty());
            pairs[1]
                .0
                .post_send(src.into_part(0..1), Some(u32::from(k)))
                .unwrap()
                .spin()
                .unwrap_or_else(|e| panic!("a1's send {k}: {}", e.error));
        }
        let qpn1 = pairs[1].1.endpoint().qpn;
        for p in inbox {
            let got = p.spin_timeout(T).expect("filled").expect("success");
            assert_eq!(got.wc.qp_num, qpn1);
        }
        assert_eq!(srq.outstanding(), 0);
    });
}

#[test]
#[ignore = "needs the testbed VM"]
fn one_failing_peer_of_a_multichannel_is_flushed_alone_and_the_others_go_on() {
    let _l = alone();
    within(
        Duration::from_secs(90),
        "multi-peer with one failing peer",
        || {
            let tb = Testbed::get();
            let pd = pd(&tb);
            let (hub, peers) = hub_and_peers(&pd, MultiChannelBuilder::new(&pd, 3), 3);
            let targets: Vec<_> = (0..3).map(|_| host_region(&pd, &[], 4096, RW)).collect();
            let remotes: Vec<_> = targets.iter().map(|t| t.remote().unwrap()).collect();
            // Receives posted on the hub's queue pairs before the failure (nobody answers them
            // yet).
            let recvs: Vec<_> = (0..3)
                .map(|i| {
                    hub.peer(i)
                        .unwrap()
                        .post_recv(host_region(&pd, &[], 4096, Access::LOCAL_WRITE))
                        .unwrap()
                })
                .collect();
            let src = host_region(&pd, b"0123456789abcdef", 4096, Access::empty());
            let e = hub
                .scatter_write(&[
                    (0, src.part(0..16), remotes[0]),
                    (1, src.part(0..16), bogus(remotes[1])),
                    (2, src.part(0..16), remotes[2]),
                ])
                .expect_err("peer 1's rkey is bogus");
            eprintln!("scatter_write: {e}");
            assert!(!hub.peer(0).unwrap().is_in_error());
            assert!(hub.peer(1).unwrap().is_in_error());
            assert!(!hub.peer(2).unwrap().is_in_error());
            // The failing peer's receive ends, flushed; the others' stay posted and are filled.
            let mut recvs = recvs.into_iter();
            let (r0, r1, r2) = (
                recvs.next().unwrap(),
                recvs.next().unwrap(),
                recvs.next().unwrap(),
            );
            drop(recvs);
            let e1 = r1
                .spin_timeout(Duration::from_secs(5))
                .expect("peer 1's receive ends once its queue pair is in error")
                .expect_err("flushed");
            assert_eq!(status(&e1.error), Some(FLUSH_ERR), "{}", e1.error);
            let r0 = r0
                .spin_timeout(Duration::from_millis(200))
                .expect_err("still posted");
            let r2 = r2
                .spin_timeout(Duration::from_millis(200))
                .expect_err("still posted");
            for (i, r) in [(0usize, r0), (2, r2)] {
                let m = host_region(&pd, &[i as u8 + 1], 4096, Access::empty());
                peers[i]
                    .post_send(m.into_part(0..1), None)
                    .unwrap()
                    .spin()
                    .unwrap();
                let got = r.spin_timeout(T).expect("filled").expect("success");
                assert_eq!(got.region.bytes().unwrap()[0], i as u8 + 1);
            }
            // A send to all is refused before anything is posted (peer 1 is in error).
            let e = hub
                .send_to_all(src.part(0..4))
                .expect_err("peer 1 in error");
            eprintln!("send_to_all: {e}");
            for i in 0..3 {
                assert_eq!(hub.peer(i).unwrap().outstanding(), 0, "peer {i}");
            }
            // The healthy peers still take writes through the channel.
            hub.scatter_write(&[
                (0, src.part(0..16), remotes[0]),
                (2, src.part(0..16), remotes[2]),
            ])
            .expect("healthy peers");
            drop(hub);
            drop(peers);
            for (i, t) in targets.into_iter().enumerate() {
                let b = t.into_inner().unwrap();
                let want: &[u8] = if i == 1 {
                    &[0; 16]
                } else {
                    b"0123456789abcdef"
                };
                assert_eq!(&b.as_slice()[..16], want, "target {i}");
            }
        },
    );
}

/// A connection over rdma_cm on the loopback address, both ends in this thread.
struct Conn {
    server: QueuePair,
    client: QueuePair,
    spd: Arc<ProtectionDomain>,
    cpd: Arc<ProtectionDomain>,
    _listener: CmListener,
}

async fn cm_connect(port: u16) -> Conn {
    let tb = Testbed::get();
    let addr: SocketAddr = format!("{}:{port}", tb.local_addr).parse().unwrap();
    let listener = CmListener::bind(addr).expect("bind");
    let spd = ProtectionDomain::new(&listener.context().unwrap()).unwrap();
    let b = |pd: &Arc<ProtectionDomain>| QueuePairBuilder::new(pd).completion_channel(true);
    let accept = listener.accept_async(b(&spd), b"s", T);
    let dial = async {
        let c = CmConnector::resolve_async(addr, T).await.expect("resolve");
        let cpd = ProtectionDomain::new(&c.context().unwrap()).unwrap();
        let (qp, _) = c.connect_async(b(&cpd), b"c", T).await.expect("connect");
        (qp, cpd)
    };
    let (accepted, (client, cpd)) = tokio::join!(accept, dial);
    let (server, _) = accepted.expect("accept");
    Conn {
        server,
        client,
        spd,
        cpd,
        _listener: listener,
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_first_error_on_an_rdma_cm_connection_disconnects_it_and_both_sides_learn() {
    let _l = alone();
    within(Duration::from_secs(90), "cm first error", || {
        run_local(async {
            let c = cm_connect(20311).await;
            // The server awaits a receive in its own task; the client's write fails.
            let server = std::rc::Rc::new(c.server);
            let s2 = server.clone();
            let spd = c.spd.clone();
            let waiter = tokio::task::spawn_local(async move {
                let r = s2
                    .post_recv(host_region(&spd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap();
                r.await.map(|_| ()).map_err(|e| e.error)
            });
            tokio::task::yield_now().await;
            let target = host_region(&c.spd, &[], 4096, RW);
            let src = host_region(&c.cpd, b"x", 4096, Access::empty());
            let e = c
                .client
                .post_write(src.into_part(0..1), bogus(target.remote().unwrap()), None)
                .unwrap()
                .await
                .expect_err("bogus rkey");
            eprintln!("client's write: {}", e.error);
            assert!(c.client.is_in_error());
            // The first-error flush disconnected the connection: the server's awaited
            // receive ends (flushed, through its DISCONNECTED event).
            let out = tokio::time::timeout(Duration::from_secs(10), waiter)
                .await
                .expect("the server's awaited receive ends after the client's failure")
                .expect("no panic");
            let err = out.expect_err("nothing sent");
            eprintln!("server's receive: {err}");
            assert_eq!(status(&err), Some(FLUSH_ERR));
            assert!(server.is_in_error());
            // The client saw its own disconnect too (a local DISCONNECTED), within time.
            c.client
                .wait_disconnected(Duration::from_secs(10))
                .expect("the client's own DISCONNECTED event");
            drop(target);
        });
    });
}

#[test]
#[ignore = "needs the testbed VM"]
fn wait_disconnected_then_an_awaited_receive_on_the_dead_connection() {
    let _l = alone();
    within(
        Duration::from_secs(90),
        "wait_disconnected + awaited receive",
        || {
            run_local(async {
                // Control: without wait_disconnected, the awaited receive ends once the peer
                // disconnects.
                let c = cm_connect(20312).await;
                let r = c
                    .server
                    .post_recv(host_region(&c.spd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap();
                drop(c.client);
                let out = tokio::time::timeout(Duration::from_secs(10), r).await;
                eprintln!(
                    "control: awaited receive after the peer's disconnect: {:?}",
                    out.as_ref()
                        .map(|o| o.as_ref().map(|_| ()).map_err(|e| e.error.to_string()))
                );
                assert!(out.is_ok(), "control: the receive ends");
                drop(c.server);

                // The same, but the server first calls wait_disconnected (which reads the
                // DISCONNECTED event off the connection's channel).
                let c = cm_connect(20313).await;
                let r = c
                    .server
                    .post_recv(host_region(&c.spd, &[], 4096, Access::LOCAL_WRITE))
                    .unwrap();
                drop(c.client);
                c.server
                    .wait_disconnected(Duration::from_secs(10))
                    .expect("the client disconnected");
                eprintln!(
                    "after wait_disconnected: is_in_error = {}, take_cm_events = {:?}",
                    c.server.is_in_error(),
                    c.server.take_cm_events()
                );
                let out = tokio::time::timeout(Duration::from_secs(5), r).await;
                eprintln!(
                    "awaited receive after wait_disconnected: {:?}",
                    out.as_ref()
                        .map(|o| o.as_ref().map(|_| ()).map_err(|e| e.error.to_string()))
                );
                // A post after the peer is known gone.
                let later = c
                    .server
                    .post_recv(host_region(&c.spd, &[], 4096, Access::LOCAL_WRITE));
                eprintln!(
                    "a receive posted after wait_disconnected: accepted = {}",
                    later.is_ok()
                );
                assert!(later.is_err(), "a post on the dead connection is refused");
                assert!(c.server.is_in_error());
                assert_eq!(
                    c.server.take_cm_events().unwrap(),
                    Some(rdma_dmabuf::reactor::ConnectionEnd::Disconnected),
                    "the end stays recorded"
                );
                assert!(
                    out.is_ok(),
                    "the awaited receive on a connection whose DISCONNECTED was taken by \
                 wait_disconnected never ends"
                );
            });
        },
    );
}
