//! One round trip through a dma-buf region, shared by the tests of every exporter: RDMA WRITE,
//! READ, SEND into and SEND out of the region, every byte checked through the exporter's
//! mapping.

use crate::exporters::Exporter;
use crate::testbed::Testbed;
use crate::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, DmaBuf, Local, MemoryRegion};

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
/// The page size the offsets below assume.
pub const PAGE: u64 = 4096;
/// The registered range starts one page into the buffer, at an iova with the same page offset.
pub const IOVA: u64 = 0x7f00_0000_1000;

/// Registers `size` bytes of `buf` (which has at least a page more before and after) one page
/// in, at an iova with the same page offset, then: RDMA WRITE a pattern into it and READ it
/// back, SEND into a receive posted on it, check every byte through the exporter's mapping
/// (and that nothing outside the range moved), and SEND out of it. `what` names the case in
/// failures.
pub fn dmabuf_round_trip(tb: &Testbed, buf: DmaBuf, size: u64, seed: u8, what: &str) {
    let pd = pd(tb);
    let (peer, owner) = loopback_pair(&pd);
    let total = buf.size() as usize;
    let region = MemoryRegion::register_dmabuf(&pd, buf, PAGE, size, Some(IOVA), RW)
        .unwrap_or_else(|e| panic!("{what}: register: {e}"));
    assert_eq!(region.addr(), IOVA, "work requests use the iova");
    let remote = region.remote().unwrap();
    assert_eq!(
        (remote.addr, remote.len),
        (IOVA, size),
        "peers are told the iova"
    );

    // RDMA WRITE from a host region into the dma-buf region.
    let n = size as usize;
    let p1 = pattern(n, seed);
    let src = host_region(&pd, &p1, n, Access::empty());
    peer.post_write(Local::new(src, 0..size), remote, None)
        .unwrap()
        .spin()
        .unwrap_or_else(|e| panic!("{what}: write: {}", e.error));

    // RDMA READ it back.
    let back = host_region(&pd, &[], n, Access::LOCAL_WRITE);
    let back = peer
        .post_read(Local::new(back, 0..size), remote)
        .unwrap()
        .spin()
        .unwrap_or_else(|e| panic!("{what}: read: {}", e.error));
    assert!(
        back.region.bytes().unwrap()[..n] == p1[..],
        "{what}: read back"
    );

    // SEND into a receive posted on the dma-buf region.
    let p2 = pattern(n, seed.wrapping_add(100));
    let recv = owner
        .post_recv(region)
        .unwrap_or_else(|e| panic!("{what}: post recv: {}", e.error));
    let src = host_region(&pd, &p2, n, Access::empty());
    peer.post_send(Local::new(src, 0..size), None)
        .unwrap()
        .spin()
        .unwrap();
    let got = recv
        .spin()
        .unwrap_or_else(|e| panic!("{what}: recv: {}", e.error));
    assert_eq!(got.wc.byte_len as u64, size);

    // The owner checks every byte through the exporter's mapping (after deregistration: no
    // peer can write any more), and that nothing outside the registered range moved.
    let mut buf = got.region.into_inner().unwrap();
    let seen = Exporter::read(&mut buf);
    assert_eq!(seen.len(), total);
    assert!(
        seen[PAGE as usize..PAGE as usize + n] == p2[..],
        "{what}: received bytes"
    );
    assert!(
        seen[..PAGE as usize].iter().all(|&b| b == 0),
        "{what}: the page before is untouched"
    );
    assert!(
        seen[PAGE as usize + n..].iter().all(|&b| b == 0),
        "{what}: the bytes after are untouched"
    );

    // SEND out of a dma-buf region: the CPU fills it through the mapping, the NIC sends it.
    let p3 = pattern(n, seed.wrapping_add(200));
    Exporter::fill(&mut buf, PAGE as usize, &p3);
    let out =
        MemoryRegion::register_dmabuf(&pd, buf, PAGE, size, Some(IOVA), Access::empty()).unwrap();
    let inbox = peer
        .post_recv(host_region(&pd, &[], n, Access::LOCAL_WRITE))
        .unwrap();
    owner
        .post_send(out, None)
        .unwrap()
        .spin()
        .unwrap_or_else(|e| panic!("{what}: send out: {}", e.error));
    let got = inbox.spin().unwrap();
    assert!(
        got.region.bytes().unwrap()[..n] == p3[..],
        "{what}: sent from the dma-buf"
    );
}
