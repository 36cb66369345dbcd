//! Requests of several parts (gather and scatter) in the owned, scoped and multi-peer layers,
//! on host and dma-buf regions, and shards: disjoint owned parts of one region, in flight at
//! once on several queue pairs and threads, joined back afterwards. Runs in the testbed VM.

use integration_tests::counts::rdma_resources;

/// The test that counts MRs (device-wide) runs alone: it takes this for writing, every other
/// test of the file for reading (libtest runs a file's tests on several threads).
static COUNTING: std::sync::RwLock<()> = std::sync::RwLock::new(());
use integration_tests::exporters::{self, Exporter};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, hub_and_peers, pattern, pd};
use rdma_dmabuf::{
    scope, Access, Error, HostBuffer, Local, MemoryRegion, MultiChannelBuilder, QueuePair,
    QueuePairBuilder, Shard, WorkKind,
};
use std::sync::Arc;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

fn pair_with_parts(pd: &Arc<rdma_dmabuf::ProtectionDomain>, n: u32) -> (QueuePair, QueuePair) {
    connect_pair(
        QueuePairBuilder::new(pd).max_sge(n),
        QueuePairBuilder::new(pd).max_sge(n),
    )
}

#[test]
#[ignore = "needs the testbed VM"]
fn owned_gather_write_and_scatter_read_on_host_regions() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair_with_parts(&pd, 4);
    assert_eq!((a.max_send_sge(), a.max_recv_sge()), (4, 4));
    assert!(a.max_read_sge() >= 1);
    let (p0, p1, p2) = (pattern(100, 1), pattern(4096, 2), pattern(300, 3));
    let parts = [
        Local::new(host_region(&pd, &p0, 100, Access::empty()), 0..100),
        Local::new(host_region(&pd, &p1, 4096, Access::empty()), 10..1010),
        Local::new(host_region(&pd, &p2, 300, Access::empty()), 0..300),
    ];
    let target = host_region(&pd, &[], 8192, RW);
    let remote = target.remote().unwrap();
    let done = a
        .post_write_parts(parts, remote.slice(50, 1400).unwrap(), None)
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
    assert_eq!(done.wc.kind, WorkKind::Write);
    // Every part came back, in order, untouched.
    assert_eq!(done.parts[1].range(), 10..1010);
    assert!(done.parts[2].region().bytes().unwrap().starts_with(&p2));
    let expected = [&p0[..], &p1[10..1010], &p2[..]].concat();

    // Read the 1,400 bytes back, scattered into two regions (the read's own limit holds).
    let n = a.max_read_sge().min(2) as usize;
    assert_eq!(n, 2, "rxe reads into 2 parts at least");
    let into = [
        Local::new(host_region(&pd, &[], 4096, Access::LOCAL_WRITE), 96..896),
        Local::new(host_region(&pd, &[], 600, Access::LOCAL_WRITE), 0..600),
    ];
    let back = a
        .post_read_parts(into, remote.slice(50, 1400).unwrap())
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
    let [first, second] = back.parts;
    let read = [
        &first.region().bytes().unwrap()[96..896],
        &second.region().bytes().unwrap()[..600],
    ]
    .concat();
    assert_eq!(read, expected);
    drop(b);
    let host = target.into_inner().unwrap();
    assert_eq!(&host.as_slice()[50..1450], &expected[..]);
    assert!(host.as_slice()[..50].iter().all(|&x| x == 0));
    assert!(host.as_slice()[1450..].iter().all(|&x| x == 0));
}

#[test]
#[ignore = "needs the testbed VM"]
fn gather_and_scatter_on_dmabuf_regions_owned_and_scoped() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair_with_parts(&pd, 3);
    for exporter in exporters::ALL {
        let what = format!("{exporter:?}");
        let data: Vec<Vec<u8>> = (0..3).map(|i| pattern(4096, 10 + i)).collect();
        let senders = [0, 1, 2].map(|i| {
            let mut buf = exporter.allocate(4096);
            Exporter::fill(&mut buf, 0, &data[i]);
            let r =
                MemoryRegion::register_dmabuf(&pd, buf, 0, 4096, None, Access::empty()).unwrap();
            Local::new(r, 1000..2000)
        });
        let receivers = [0, 1].map(|_| {
            let buf = exporter.allocate(4096);
            let r = MemoryRegion::register_dmabuf(&pd, buf, 0, 4096, None, Access::LOCAL_WRITE)
                .unwrap();
            Local::new(r, 2048..4096)
        });
        let inbox = b.post_recv_parts(receivers).unwrap();
        let sent = a.post_send_parts(senders, Some(9)).unwrap();
        assert_eq!(sent.spin_timeout(T).unwrap().unwrap().parts.len(), 3);
        let got = inbox.spin_timeout(T).unwrap().unwrap();
        assert_eq!((got.wc.byte_len, got.wc.imm), (3000, Some(9)), "{what}");
        let sent: Vec<u8> = data.iter().flat_map(|d| d[1000..2000].to_vec()).collect();
        let [r0, r1] = got.parts;
        let mut b0 = r0.into_region().into_inner().unwrap();
        let mut b1 = r1.into_region().into_inner().unwrap();
        let (b0, b1) = (Exporter::read(&mut b0), Exporter::read(&mut b1));
        assert_eq!(&b0[2048..], &sent[..2048], "{what}: first part");
        assert_eq!(&b1[2048..2048 + 952], &sent[2048..], "{what}: second part");
        assert!(
            b0[..2048].iter().all(|&x| x == 0),
            "{what}: outside the part"
        );
        assert!(
            b1[3000..].iter().all(|&x| x == 0),
            "{what}: past the message"
        );

        // Scoped: two borrowed parts of one dma-buf region gathered into one write, and a
        // read scattered back into two dma-buf regions.
        let mut buf = exporter.allocate(4096);
        Exporter::fill(&mut buf, 0, &data[0]);
        let source =
            MemoryRegion::register_dmabuf(&pd, buf, 0, 4096, None, Access::empty()).unwrap();
        let target = host_region(&pd, &[], 4096, RW);
        let remote = target.remote().unwrap();
        let mut into = [0, 1].map(|_| {
            let buf = exporter.allocate(4096);
            MemoryRegion::register_dmabuf(&pd, buf, 0, 4096, None, Access::LOCAL_WRITE).unwrap()
        });
        scope(|s| {
            let parts = [source.part(3000..3100), source.part(10..60)];
            s.write_parts(&a, parts, remote, None)
                .unwrap()
                .spin()
                .unwrap();
            let [i0, i1] = &mut into;
            let scatter = [i0.part_mut(0..100), i1.part_mut(500..550)];
            s.read_parts(&a, scatter, remote).unwrap().spin().unwrap();
        });
        let want = [&data[0][3000..3100], &data[0][10..60]].concat();
        let [i0, i1] = into.map(|r| Exporter::read(&mut r.into_inner().unwrap()));
        assert_eq!(&i0[..100], &want[..100], "{what}: scoped, first part");
        assert_eq!(&i1[500..550], &want[100..], "{what}: scoped, second part");
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn shards_of_one_region_are_in_flight_at_once_on_two_threads() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    const CHUNK: u64 = 4096;
    let data = pattern(32 * CHUNK as usize, 5);
    let source = host_region(&pd, &data, data.len(), Access::empty());
    let target = host_region(&pd, &[], data.len(), RW);
    let remote = target.remote().unwrap();
    let mut shards = source.split_into_chunks(CHUNK).unwrap();
    assert_eq!(shards.len(), 32);
    assert_eq!(shards[3].addr(), shards[0].addr() + 3 * CHUNK);
    let second_half = shards.split_off(16);
    let pairs = [pair_with_parts(&pd, 1), pair_with_parts(&pd, 1)];
    // Each thread keeps its 16 writes in flight at once, each from its own shard.
    let back: Vec<Shard<HostBuffer>> = std::thread::scope(|s| {
        let runs: Vec<_> = pairs
            .into_iter()
            .zip([shards, second_half])
            .map(|((a, b), mine)| {
                s.spawn(move || {
                    let pending: Vec<_> = mine
                        .into_iter()
                        .map(|sh| {
                            let to = remote.slice(sh.range().start, sh.len()).unwrap();
                            a.post_write_parts([sh], to, None).unwrap()
                        })
                        .collect();
                    assert_eq!(a.outstanding(), 16);
                    let back: Vec<_> = pending
                        .into_iter()
                        .map(|p| {
                            let [sh] = p.spin_timeout(T).unwrap().unwrap().parts;
                            sh
                        })
                        .collect();
                    drop(b);
                    back
                })
            })
            .collect();
        runs.into_iter().flat_map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(back.len(), 32);
    let region = Shard::join(back).unwrap();
    assert_eq!(region.bytes().unwrap(), &data[..]);
    assert_eq!(target.into_inner().unwrap().as_slice(), &data[..]);
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_gather_of_shards_and_the_registration_lives_until_the_last_shard() {
    let _alone = COUNTING.write().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = pair_with_parts(&pd, 4);
    let mrs = rdma_resources("mr");
    let data = pattern(4096, 7);
    let mut shards = host_region(&pd, &data, 4096, Access::LOCAL_WRITE)
        .split([0..16, 100..116, 2000..2032, 4000..4096])
        .unwrap();
    assert_eq!(rdma_resources("mr"), mrs + 1);
    assert_eq!(shards[1].bytes().unwrap(), &data[100..116]);
    shards[2].bytes_mut().unwrap().fill(0xee);
    let target = host_region(&pd, &[], 4096, RW);
    let remote = target.remote().unwrap();
    let last = shards.pop().unwrap();
    let gather: [Shard<HostBuffer>; 3] = shards.try_into().unwrap();
    let done = a
        .post_write_parts(gather, remote, None)
        .unwrap()
        .spin_timeout(T)
        .unwrap()
        .unwrap();
    let expected = [&data[0..16], &data[100..116], &[0xee; 32][..]].concat();
    // Joining without the fourth shard is refused, with the shards back.
    let err = Shard::join(done.parts).unwrap_err();
    assert!(
        err.error.to_string().contains("3 of the region's 4 shards"),
        "{}",
        err.error
    );
    let mut shards = err.shards;
    // A shard lent to the NIC in a request whose handle was dropped stays away until the
    // completion is polled.
    let to = remote.slice(1000, 96).unwrap();
    drop(a.post_write_parts([last], to, None).unwrap());
    let again = Shard::join(shards).unwrap_err();
    assert!(
        again.error.to_string().contains("in flight"),
        "{}",
        again.error
    );
    shards = again.shards;
    let deadline = std::time::Instant::now() + T;
    while a.outstanding() > 0 {
        a.poll().unwrap();
        assert!(
            std::time::Instant::now() < deadline,
            "the write never completed"
        );
    }
    assert_eq!(rdma_resources("mr"), mrs + 2, "the source and the target");
    // Dropping shards one by one keeps the registration until the last.
    let keep = shards.pop().unwrap();
    drop(shards);
    assert_eq!(rdma_resources("mr"), mrs + 2);
    drop(keep);
    assert_eq!(
        rdma_resources("mr"),
        mrs + 1,
        "deregistered with the last shard"
    );
    let host = target.into_inner().unwrap();
    assert_eq!(&host.as_slice()[..64], &expected[..]);
    assert_eq!(&host.as_slice()[1000..1096], &data[4000..4096]);
}

#[test]
#[ignore = "needs the testbed VM"]
fn parts_bad_inputs_are_typed_errors_with_the_parts_back() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let dev = pd.context().query_device().unwrap();
    let invalid = |e: &Error, needle: &str| {
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert!(e.to_string().contains(needle), "{needle:?} not in: {e}");
    };
    // Creation: 0 parts, or more than the device takes.
    for n in [0, dev.max_sge + 1] {
        let e = QueuePairBuilder::new(&pd).max_sge(n).build().unwrap_err();
        invalid(&e, &format!("max_sge {n}"));
    }
    let (a, b) = pair_with_parts(&pd, 2);
    let target = host_region(&pd, &[], 16384, RW);
    let remote = target.remote().unwrap();
    let three = [1u8, 2, 3].map(|i| host_region(&pd, &[i; 8], 64, Access::empty()));
    let e = a.post_write_parts(three, remote, None).unwrap_err();
    invalid(&e.error, "takes 1 to 2");
    assert_eq!(e.parts[2].bytes().unwrap()[0], 3, "the parts come back");
    let none: [MemoryRegion<HostBuffer>; 0] = [];
    invalid(&a.post_send_parts(none, None).unwrap_err().error, "0 parts");
    let two = [1u8, 2].map(|i| host_region(&pd, &[i; 8], 4096, Access::empty()));
    let e = a
        .post_write_parts(two, remote.slice(0, 8000).unwrap(), None)
        .unwrap_err();
    invalid(&e.error, "8192 bytes to a remote region of 8000");
    // The NIC writes what a read or receive scatters into: every part needs LOCAL_WRITE.
    let mixed = [
        Local::new(host_region(&pd, &[], 64, Access::LOCAL_WRITE), 0..64),
        Local::new(host_region(&pd, &[], 64, Access::empty()), 0..64),
    ];
    let e = a.post_read_parts(mixed, remote).unwrap_err();
    invalid(&e.error, "without LOCAL_WRITE");
    let e = b
        .post_recv_parts(e.parts.map(|l| Local::new(l.into_region(), reversed())))
        .unwrap_err();
    invalid(&e.error, "reversed");
    assert_eq!(a.outstanding() + b.outstanding(), 0, "nothing was posted");

    // Splits and joins.
    let region = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    let e = region.split([0..100, 50..150]).unwrap_err();
    invalid(&e.error, "overlap");
    let e = e.region.split(std::iter::once(0..4097)).unwrap_err();
    invalid(&e.error, "outside");
    let e = e.region.split_into_chunks(0).unwrap_err();
    invalid(&e.error, "0 bytes");
    let mut ours = e.region.split_into_chunks(2048).unwrap();
    let theirs = host_region(&pd, &[], 64, Access::empty())
        .split_into_chunks(64)
        .unwrap();
    ours.extend(theirs);
    invalid(&Shard::join(ours).unwrap_err().error, "different regions");
    invalid(
        &Shard::<HostBuffer>::join(Vec::new()).unwrap_err().error,
        "no shard",
    );
    let open = host_region(&pd, &[], 64, RW)
        .split(std::iter::once(0..8))
        .unwrap();
    invalid(&open[0].bytes().unwrap_err(), "remotely writable");
}

#[test]
#[ignore = "needs the testbed VM"]
fn scoped_and_multi_peer_parts_gather_and_scatter() {
    let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair_with_parts(&pd, 3);
    let data = pattern(4096, 11);
    let source = host_region(&pd, &data, 4096, Access::empty());
    let target = host_region(&pd, &[], 4096, RW);
    let remote = target.remote().unwrap();
    let mut left = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut right = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    scope(|s| {
        // Shared parts of one region may be gathered in any order, even overlapping.
        let parts = [
            source.part(100..110),
            source.part(0..10),
            source.part(105..115),
        ];
        s.write_parts(&a, parts, remote, None)
            .unwrap()
            .spin()
            .unwrap();
        let into = [left.part_mut(0..12), right.part_mut(32..50)];
        let wc = s.read_parts(&a, into, remote).unwrap().spin().unwrap();
        assert_eq!(wc.kind, WorkKind::Read);
    });
    let expected = [&data[100..110], &data[0..10], &data[105..115]].concat();
    assert_eq!(&left.bytes().unwrap()[..12], &expected[..12]);
    assert_eq!(&right.bytes().unwrap()[32..50], &expected[12..]);
    drop((a, b));
    assert_eq!(
        &target.into_inner().unwrap().as_slice()[..30],
        &expected[..]
    );

    // One gather write per peer, all at once.
    let hub = MultiChannelBuilder::new(&pd, 2).queue_pairs(|q| q.max_sge(2));
    let (hub, peers) = hub_and_peers(&pd, hub, 2);
    let targets = [0, 1].map(|_| host_region(&pd, &[], 4096, RW));
    let requests = [0, 1].map(|peer| {
        let at = 1000 * peer as u64;
        let parts = [source.part(at..at + 8), source.part(at + 500..at + 508)];
        (peer, parts, targets[peer].remote().unwrap())
    });
    let wcs = hub.scatter_write_parts(&requests).unwrap();
    assert_eq!(wcs.len(), 2);
    let three = [source.part(0..1), source.part(1..2), source.part(2..3)];
    let e = hub.scatter_write_parts(&[(0, three, remote)]).unwrap_err();
    assert!(e.to_string().contains("takes 1 to 2"), "{e}");

    // Read each peer's 16 bytes back, scattered over two regions; then each peer sends 12
    // bytes that land scattered the same way.
    let mut low = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    let mut high = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
    {
        let (l0, l1) = (low.part_mut(0..6), high.part_mut(0..10));
        let mut reads = [(0, [l0, l1], targets[0].remote().unwrap())];
        assert_eq!(hub.gather_read_parts(&mut reads).unwrap().len(), 1);
    }
    let want0 = [&data[0..8], &data[500..508]].concat();
    assert_eq!(&low.bytes().unwrap()[..6], &want0[..6]);
    assert_eq!(&high.bytes().unwrap()[..10], &want0[6..]);
    for (i, peer) in peers.iter().enumerate() {
        let r = host_region(&pd, &[i as u8 + 1; 12], 64, Access::empty());
        drop(peer.post_send(r.into_part(0..12), None).unwrap());
    }
    let mut more = [0, 1].map(|_| host_region(&pd, &[], 64, Access::LOCAL_WRITE));
    {
        let [m0, m1] = &mut more;
        let mut recvs = [
            (0, [low.part_mut(0..4), high.part_mut(0..8)]),
            (1, [m0.part_mut(32..36), m1.part_mut(32..40)]),
        ];
        let wcs = hub.gather_recv_parts(&mut recvs).unwrap();
        assert_eq!(wcs.iter().map(|w| w.byte_len).collect::<Vec<_>>(), [12, 12]);
    }
    assert_eq!(&low.bytes().unwrap()[..4], &[1; 4]);
    assert_eq!(&high.bytes().unwrap()[..8], &[1; 8]);
    assert_eq!(&more[0].bytes().unwrap()[32..36], &[2; 4]);
    assert_eq!(&more[1].bytes().unwrap()[32..40], &[2; 8]);
    drop(hub);
    for (peer, t) in targets.into_iter().enumerate() {
        let at = 1000 * peer;
        let got = t.into_inner().unwrap();
        let want = [&data[at..at + 8], &data[at + 500..at + 508]].concat();
        assert_eq!(&got.as_slice()[..16], &want[..], "peer {peer}");
    }
}

/// 10..0, a reversed range.
fn reversed() -> std::ops::Range<u64> {
    let (start, end) = (10, 0);
    start..end
}

/// Tests of the two-node testbed: `cargo xtask test` runs this module on both nodes.
mod two_node {
    use super::*;

    /// Across the wire: node b gathers four shards of a vgem dma-buf into one RDMA write to node
    /// a, then sends three of them as one message that a scatters into two dma-buf parts.
    #[test]
    #[ignore = "needs the testbed VM"]
    fn two_node_gather_write_and_scattered_receive_across_the_wire() {
        let _counting = COUNTING.read().unwrap_or_else(|e| e.into_inner());
        use integration_tests::oob;
        use rdma_dmabuf::{Endpoint, RemoteRegion};
        let tb = Testbed::get();
        let pd = pd(&tb);
        let qp = QueuePairBuilder::new(&pd).max_sge(4).build().unwrap();
        let data = pattern(65536, 21);
        let ranges: [std::ops::Range<usize>; 4] =
            [0..4096, 8192..12288, 20000..24096, 60000..64096];
        if tb.is_server() {
            let target = host_region(&pd, &[], 65536, RW);
            let mine = [
                qp.endpoint().to_bytes().as_slice(),
                &target.remote().unwrap().to_bytes(),
            ]
            .concat();
            let theirs = oob::serve(&tb.local_addr, 18620, &mine);
            let qp = qp.connect(&Endpoint::from_bytes(&theirs).unwrap()).unwrap();
            let into = [0, 1].map(|_| {
                let buf = Exporter::Vgem.allocate(8192);
                let r = MemoryRegion::register_dmabuf(&pd, buf, 0, 8192, None, Access::LOCAL_WRITE)
                    .unwrap();
                Local::new(r, 0..8192)
            });
            let got = qp
                .post_recv_parts(into)
                .unwrap()
                .spin_timeout(Duration::from_secs(60))
                .unwrap()
                .unwrap();
            assert_eq!(got.wc.byte_len, 3 * 4096);
            let gathered: Vec<u8> = ranges
                .iter()
                .flat_map(|r| data[r.start..r.end].to_vec())
                .collect();
            let [p0, p1] = got.parts;
            let mut b0 = p0.into_region().into_inner().unwrap();
            let mut b1 = p1.into_region().into_inner().unwrap();
            assert_eq!(Exporter::read(&mut b0), gathered[..8192]);
            assert_eq!(Exporter::read(&mut b1)[..4096], gathered[8192..12288]);
            let host = target.into_inner().unwrap();
            assert_eq!(&host.as_slice()[..gathered.len()], &gathered[..]);
        } else {
            let theirs = oob::connect(&tb.peer_addr, 18620, &qp.endpoint().to_bytes());
            let (ep, rr) = theirs.split_at(Endpoint::WIRE_LEN);
            let qp = qp.connect(&Endpoint::from_bytes(ep).unwrap()).unwrap();
            let remote = RemoteRegion::from_bytes(rr).unwrap();
            let mut buf = Exporter::Vgem.allocate(65536);
            Exporter::fill(&mut buf, 0, &data);
            let region =
                MemoryRegion::register_dmabuf(&pd, buf, 0, 65536, None, Access::empty()).unwrap();
            let shards: [Shard<_>; 4] = region
                .split(ranges.map(|r| r.start as u64..r.end as u64))
                .unwrap()
                .try_into()
                .unwrap();
            let done = qp
                .post_write_parts(shards, remote, None)
                .unwrap()
                .spin_timeout(T)
                .unwrap()
                .unwrap();
            let [s0, s1, s2, s3] = done.parts;
            qp.post_send_parts([s0, s1, s2], None)
                .unwrap()
                .spin_timeout(T)
                .unwrap()
                .unwrap();
            drop(s3);
        }
    }
}
