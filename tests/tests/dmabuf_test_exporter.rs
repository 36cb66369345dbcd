//! The patched rxe against the dma-buf contract, with the test exporter
//! (`kernel-patches/test-exporter/`): its sg_tables carry poisoned page pointers, so a driver
//! that fills its page table from `sg_page()` faults on them, while one that imports through
//! the sanctioned CPU-access API (`dma_buf_vmap`) moves every byte. Its second kind of buffer
//! reports its vmap as I/O memory, which rxe must refuse with `EOPNOTSUPP`. Runs in the
//! testbed VM (patched mode: the exporter is loaded with the patched stack).

use integration_tests::exporters::Exporter;
use integration_tests::test_exporter::{allocate, Kind};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, Error, Local, MemoryRegion};

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const PAGE: u64 = 4096;
/// The registered range starts one page into the buffer, at an iova with the same page offset.
const IOVA: u64 = 0x7f00_0000_1000;

/// RDMA WRITE into, READ out of, SEND into and SEND out of a region of `size` bytes one page
/// into a poisoned buffer, every byte checked through the exporter's mmap.
fn round_trip(size: u64, seed: u8) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, owner) = loopback_pair(&pd);
    let what = format!("test exporter, {size} bytes");
    let buf = allocate(size + 2 * PAGE, Kind::System);
    assert_eq!(buf.exporter(), "test_exporter");
    let total = buf.size() as usize;
    let region = MemoryRegion::register_dmabuf(&pd, buf, PAGE, size, Some(IOVA), RW)
        .unwrap_or_else(|e| panic!("{what}: register: {e}"));
    let remote = region.remote().unwrap();
    let n = size as usize;

    // RDMA WRITE from a host region into the poisoned buffer, then READ it back.
    let p1 = pattern(n, seed);
    let src = host_region(&pd, &p1, n, Access::empty());
    peer.post_write(Local::new(src, 0..size), remote, None)
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("{what}: write: {}", e.error));
    let back = host_region(&pd, &[], n, Access::LOCAL_WRITE);
    let back = peer
        .post_read(Local::new(back, 0..size), remote)
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("{what}: read: {}", e.error));
    assert!(
        back.region.bytes().unwrap()[..n] == p1[..],
        "{what}: read back"
    );

    // SEND into a receive posted on the region.
    let p2 = pattern(n, seed.wrapping_add(100));
    let recv = owner
        .post_recv(region)
        .unwrap_or_else(|e| panic!("{what}: post recv: {}", e.error));
    let src = host_region(&pd, &p2, n, Access::empty());
    peer.post_send(Local::new(src, 0..size), None)
        .unwrap()
        .wait()
        .unwrap();
    let got = recv
        .wait()
        .unwrap_or_else(|e| panic!("{what}: recv: {}", e.error));
    assert_eq!(got.wc.byte_len as u64, size);

    // Every byte through the exporter's mmap, after deregistration; nothing outside the range
    // moved.
    let mut buf = got.region.into_inner().unwrap();
    let seen = Exporter::read(&mut buf);
    assert_eq!(seen.len(), total);
    let (start, end) = (PAGE as usize, PAGE as usize + n);
    assert!(seen[start..end] == p2[..], "{what}: received bytes");
    assert!(
        seen[..start].iter().all(|&b| b == 0),
        "{what}: the page before"
    );
    assert!(
        seen[end..].iter().all(|&b| b == 0),
        "{what}: the bytes after"
    );

    // SEND out of the region: the CPU fills it through the mmap, rxe sends it.
    let p3 = pattern(n, seed.wrapping_add(200));
    Exporter::fill(&mut buf, start, &p3);
    let out =
        MemoryRegion::register_dmabuf(&pd, buf, PAGE, size, Some(IOVA), Access::empty()).unwrap();
    let inbox = peer
        .post_recv(host_region(&pd, &[], n, Access::LOCAL_WRITE))
        .unwrap();
    owner
        .post_send(out, None)
        .unwrap()
        .wait()
        .unwrap_or_else(|e| panic!("{what}: send out: {}", e.error));
    let got = inbox.wait().unwrap();
    assert!(
        got.region.bytes().unwrap()[..n] == p3[..],
        "{what}: sent from the buffer"
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn poisoned_page_pointers_do_not_matter_to_rxe_write_read_send() {
    for (i, size) in [PAGE, 1 << 20, 16 << 20].into_iter().enumerate() {
        round_trip(size, 7 + i as u8);
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_dmabuf_whose_vmap_is_io_memory_is_refused_with_eopnotsupp() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let buf = allocate(4 * PAGE, Kind::IoMem);
    assert_eq!(buf.exporter(), "test_exporter_iomem");
    for access in [RW, Access::empty(), RW.union(Access::REMOTE_ATOMIC)] {
        match MemoryRegion::register_dmabuf(
            &pd,
            allocate(4 * PAGE, Kind::IoMem),
            0,
            PAGE,
            None,
            access,
        ) {
            Err(e @ Error::Unsupported { .. }) => {
                assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{access:?}: {e}")
            }
            other => panic!("{access:?}: expected EOPNOTSUPP, got {other:?}"),
        }
    }
    // The same exporter's system-memory buffers still register, on the same PD.
    drop(buf);
    let ok =
        MemoryRegion::register_dmabuf(&pd, allocate(4 * PAGE, Kind::System), 0, PAGE, None, RW);
    assert!(ok.is_ok(), "{:?}", ok.err());
}
