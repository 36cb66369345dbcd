//! The patched rxe against the dma-buf contract, with the test exporter
//! (`kernel-patches/test-exporter/`): its sg_tables carry poisoned page pointers, so a driver
//! that fills its page table from `sg_page()` faults on them, while one that imports through
//! the sanctioned CPU-access API (`dma_buf_vmap`) moves every byte. Its second kind of buffer
//! reports its vmap as I/O memory, which rxe must refuse with `EOPNOTSUPP`. Runs in the
//! testbed VM (patched mode: the exporter is loaded with the patched stack).

use integration_tests::roundtrip::{dmabuf_round_trip, PAGE};
use integration_tests::test_exporter::{allocate, Kind};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pd;
use rdma_dmabuf::{Access, Error, MemoryRegion};

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

#[test]
#[ignore = "needs the testbed VM"]
fn poisoned_page_pointers_do_not_matter_to_rxe_write_read_send() {
    let tb = Testbed::get();
    for (i, size) in [PAGE, 1 << 20, 16 << 20].into_iter().enumerate() {
        let buf = allocate(size + 2 * PAGE, Kind::System);
        assert_eq!(buf.exporter(), "test_exporter");
        let what = format!("test exporter, {size} bytes");
        dmabuf_round_trip(&tb, buf, size, 7 + i as u8, &what);
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
                assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{access:?}: {e}");
                assert!(
                    e.to_string().contains("I/O memory"),
                    "the hint says why: {e}"
                );
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
