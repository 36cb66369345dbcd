//! The scoped layer and multi-peer channels against the real kernel: a hub with a channel to
//! three peers multicasts, scatters writes, gathers receives and reads. Runs in the testbed VM.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, hub_and_peers, loopback_pair, pattern, pd};
use rdma_dmabuf::{scope, Access, Local, MultiChannelBuilder, QueuePair};

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const PEERS: usize = 3;
const N: usize = 256 << 10;

#[test]
#[ignore = "needs the testbed VM"]
fn a_scope_returns_only_after_its_requests_completed() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let data = pattern(N, 21);
    let src = host_region(&pd, &data, N, Access::empty());
    let mut dst = host_region(&pd, &[], N, Access::LOCAL_WRITE);
    // Nothing is waited for inside: the scope drains on the way out.
    scope(|s| {
        s.recv(&b, dst.part_mut(0..N as u64)).unwrap();
        s.send(&a, src.part(0..N as u64), None).unwrap();
    });
    assert_eq!(&dst.bytes().unwrap()[..N], &data[..]);
    assert_eq!((a.outstanding(), b.outstanding()), (0, 0));
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_panicking_scope_flushes_and_drains_before_unwinding_on() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_a, b) = loopback_pair(&pd);
    let mut dst = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        scope(|s| {
            // A receive whose message never comes, then a panic.
            s.recv(&b, dst.part_mut(0..4096)).unwrap();
            panic!("in the scope");
        })
    }));
    assert!(r.is_err(), "the panic went on");
    assert_eq!(
        b.outstanding(),
        0,
        "the receive was flushed before the scope returned"
    );
    // The region is ours again.
    assert!(dst.bytes_mut().is_ok());
}

/// A hub channel to three peers, each peer a queue pair in the same process.
fn three_peers(
    pd: &std::sync::Arc<rdma_dmabuf::ProtectionDomain>,
) -> (rdma_dmabuf::MultiChannel, Vec<QueuePair>) {
    hub_and_peers(pd, MultiChannelBuilder::new(pd, PEERS), PEERS)
}

#[test]
#[ignore = "needs the testbed VM"]
fn multi_peer_multicast_scatter_and_gather_with_three_peers() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (hub, peers) = three_peers(&pd);
    assert_eq!(hub.len(), PEERS);

    // Multicast: one region, sent to every peer at once.
    let data = pattern(N, 1);
    let src = host_region(&pd, &data, N, Access::empty());
    let recvs: Vec<_> = peers
        .iter()
        .map(|p| {
            p.post_recv(host_region(&pd, &[], N, Access::LOCAL_WRITE))
                .unwrap()
        })
        .collect();
    let wcs = hub.send_to_all(src.part(0..N as u64)).unwrap();
    assert_eq!(wcs.len(), PEERS);
    for r in recvs {
        let got = r.spin().unwrap();
        assert_eq!(got.wc.byte_len as usize, N);
        assert_eq!(&got.region.bytes().unwrap()[..N], &data[..]);
    }

    // Scatter write: a different part of one region to each peer.
    let whole = pattern(PEERS * N, 2);
    let big = host_region(&pd, &whole, PEERS * N, Access::empty());
    let targets: Vec<_> = (0..PEERS).map(|_| host_region(&pd, &[], N, RW)).collect();
    let parts: Vec<_> = (0..PEERS)
        .map(|i| {
            (
                i,
                big.part((i * N) as u64..((i + 1) * N) as u64),
                targets[i].remote().unwrap(),
            )
        })
        .collect();
    hub.scatter_write(&parts).unwrap();

    // Gather read: read every peer's target back into one region's parts.
    let mut back: Vec<_> = (0..PEERS)
        .map(|_| host_region(&pd, &[], N, Access::LOCAL_WRITE))
        .collect();
    let mut reads: Vec<_> = back
        .iter_mut()
        .enumerate()
        .map(|(i, r)| (i, r.part_mut(0..N as u64), targets[i].remote().unwrap()))
        .collect();
    hub.gather_read(&mut reads).unwrap();
    drop(reads);
    for (i, r) in back.iter().enumerate() {
        assert_eq!(
            &r.bytes().unwrap()[..N],
            &whole[i * N..(i + 1) * N],
            "peer {i}"
        );
    }
    for (i, t) in targets.into_iter().enumerate() {
        assert_eq!(
            &t.into_inner().unwrap().as_slice()[..N],
            &whole[i * N..(i + 1) * N]
        );
    }

    // Gather receive: each peer sends its own message.
    let mut inbox: Vec<_> = (0..PEERS)
        .map(|_| host_region(&pd, &[], N, Access::LOCAL_WRITE))
        .collect();
    let sends: Vec<_> = peers
        .iter()
        .enumerate()
        .map(|(i, p)| {
            p.post_send(
                Local::new(
                    host_region(&pd, &pattern(N, 10 + i as u8), N, Access::empty()),
                    0..N as u64,
                ),
                None,
            )
            .unwrap()
        })
        .collect();
    let mut parts: Vec<_> = inbox
        .iter_mut()
        .enumerate()
        .map(|(i, r)| (i, r.part_mut(0..N as u64)))
        .collect();
    hub.gather_recv(&mut parts).unwrap();
    drop(parts);
    for s in sends {
        s.spin().unwrap();
    }
    for (i, r) in inbox.iter().enumerate() {
        assert_eq!(
            &r.bytes().unwrap()[..N],
            &pattern(N, 10 + i as u8)[..],
            "from peer {i}"
        );
    }
    assert!(hub.peer(PEERS).is_err(), "peer index past the end");
}

#[test]
#[ignore = "needs the testbed VM"]
fn more_peers_than_the_device_has_queue_pairs_is_refused_before_anything_is_created() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let max_qp = pd.context().query_device().unwrap().max_qp;
    let peers = max_qp as usize + 1;
    let err = MultiChannelBuilder::new(&pd, peers).build().unwrap_err();
    assert!(
        matches!(err, rdma_dmabuf::Error::InvalidArgument { .. }),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains(&format!("{peers} peers")), "{text}");
    assert!(text.contains(&format!("at most {max_qp}")), "{text}");
    // Within the limit the channel builds, with settings given through `queue_pairs`.
    let hub = MultiChannelBuilder::new(&pd, 2)
        .queue_pairs(|b| b.send_depth(3).recv_depth(5))
        .build()
        .unwrap();
    assert_eq!(hub.endpoints().len(), 2);
}
