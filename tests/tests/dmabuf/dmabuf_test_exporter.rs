//! The patched rxe against the dma-buf contract, with the test exporter
//! (`kernel-patches/test-exporter/`): its sg_tables carry poisoned page pointers, so a driver
//! that fills its page table from `sg_page()` faults on them, while one that imports through
//! the sanctioned CPU-access API (`dma_buf_vmap`) moves every byte. Its second kind of buffer
//! reports its vmap as I/O memory, which rxe must refuse with `EOPNOTSUPP`; its third moves
//! its backing unless pinned, which rxe must prevent for as long as it maps the buffer. Every
//! buffer counts the calls rxe makes into it, and after every scenario, error paths included,
//! each attach, pin, vmap and CPU access must have been undone, and nothing mapped for DMA.
//! Runs in the testbed VM (patched mode: the exporter is loaded with the patched stack).

use integration_tests::raw_verbs::RawPd;
use integration_tests::roundtrip::{dmabuf_round_trip, PAGE};
use integration_tests::test_exporter::{
    allocate, move_backing, unbalanced_releases, Counters, Kind,
};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, DmaBuf, Error, Local, MemoryRegion};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

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
        let keep = dup(&buf);
        let what = format!("test exporter, {size} bytes");
        dmabuf_round_trip(&tb, buf, size, 7 + i as u8, &what);
        // Registered (the round trip registers more than once), each undone; the CPU
        // accesses include the test's own (DMA_BUF_IOCTL_SYNC around its reads).
        let c = Counters::of(&keep);
        c.assert_balanced(&what);
        assert!(
            c.attach.0 >= 1 && c.cpu_access.0 >= c.attach.0,
            "{what}: {c:?}"
        );
    }
    assert_eq!(unbalanced_releases(), 0);
}

/// A second fd of `buf`'s buffer, which keeps it (and its counters) alive after `buf` is
/// registered, deregistered and dropped.
fn dup(buf: &DmaBuf) -> OwnedFd {
    buf.as_fd().try_clone_to_owned().expect("dup dma-buf fd")
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_dmabuf_whose_vmap_is_io_memory_is_refused_with_eopnotsupp() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let buf = allocate(4 * PAGE, Kind::IoMem);
    assert_eq!(buf.exporter(), "test_exporter_iomem");
    for access in [RW, Access::empty(), RW.union(Access::REMOTE_ATOMIC)] {
        let iomem = allocate(4 * PAGE, Kind::IoMem);
        let keep = dup(&iomem);
        match MemoryRegion::register_dmabuf(&pd, iomem, 0, PAGE, None, access) {
            Err(e @ Error::Unsupported { .. }) => {
                assert_eq!(e.errno(), Some(libc::EOPNOTSUPP), "{access:?}: {e}");
                assert!(
                    e.to_string().contains("I/O memory"),
                    "the hint says why: {e}"
                );
            }
            other => panic!("{access:?}: expected EOPNOTSUPP, got {other:?}"),
        }
        // Attached and mapped, then both undone; no CPU access was begun.
        let c = Counters::of(&keep);
        c.assert_balanced("I/O memory refused");
        assert_eq!((c.attach.0, c.vmap.0, c.cpu_access.0), (1, 1, 0), "{c:?}");
    }
    // The same exporter's system-memory buffers still register, on the same PD.
    drop(buf);
    let ok =
        MemoryRegion::register_dmabuf(&pd, allocate(4 * PAGE, Kind::System), 0, PAGE, None, RW);
    assert!(ok.is_ok(), "{:?}", ok.err());
}

/// A dynamic exporter's buffer is pinned from registration to deregistration: the exporter
/// cannot move it while rxe copies through its kernel mapping (a move is refused with EBUSY),
/// and can once the region is gone. Registered again after the move, rxe maps the new pages:
/// what was written before the move reads back.
#[test]
#[ignore = "needs the testbed VM"]
fn a_movable_buffer_is_pinned_while_registered_and_moves_after() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let buf = allocate(4 * PAGE, Kind::Movable);
    assert_eq!(buf.exporter(), "test_exporter_movable");
    let keep = dup(&buf);
    let region = MemoryRegion::register_dmabuf(&pd, buf, PAGE, PAGE, None, RW).unwrap();
    let c = Counters::of(&keep);
    assert_eq!((c.attach, c.pin, c.vmap), ((1, 0), (1, 0), (1, 0)), "{c:?}");
    assert_eq!(move_backing(&keep), Err(nix::errno::Errno::EBUSY));

    let data = pattern(PAGE as usize, 3);
    let src = host_region(&pd, &data, PAGE as usize, Access::empty());
    peer.post_write(Local::new(src, 0..PAGE), region.remote().unwrap(), None)
        .unwrap()
        .spin()
        .unwrap();
    drop(region);
    let c = Counters::of(&keep);
    c.assert_balanced("deregistered");
    assert_eq!(c.moves, 0);
    move_backing(&keep).expect("moves once nothing pins it");
    assert_eq!(Counters::of(&keep).moves, 1);

    let again = DmaBuf::try_from(keep).unwrap();
    let keep = dup(&again);
    let region = MemoryRegion::register_dmabuf(&pd, again, PAGE, PAGE, None, RW).unwrap();
    let back = host_region(&pd, &[], PAGE as usize, Access::LOCAL_WRITE);
    let back = peer
        .post_read(Local::new(back, 0..PAGE), region.remote().unwrap())
        .unwrap()
        .spin()
        .unwrap();
    assert!(back.region.bytes().unwrap()[..PAGE as usize] == data[..]);
    drop(region);
    let c = Counters::of(&keep);
    c.assert_balanced("registered after the move");
    assert_eq!((c.pin.0, c.vmap.0, c.moves), (2, 2, 1), "{c:?}");
}

/// Two regions on one buffer (one through the crate, one registered directly, since the crate
/// allows one `DmaBuf` per buffer): one CPU access for both, which ends only with the last of
/// them, whichever goes first; the one left keeps working.
#[test]
#[ignore = "needs the testbed VM"]
fn two_regions_on_one_buffer_share_one_cpu_access_in_either_order() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let raw = RawPd::open(&tb);
    let rw = RW.bits() as i32;
    for crate_first in [true, false] {
        let what = if crate_first {
            "crate's first"
        } else {
            "raw first"
        };
        let buf = allocate(4 * PAGE, Kind::System);
        let keep = dup(&buf);
        let region = MemoryRegion::register_dmabuf(&pd, buf, PAGE, PAGE, None, RW).unwrap();
        let other = raw
            .reg_dmabuf(2 * PAGE, PAGE as usize, 0, keep.as_raw_fd(), rw)
            .unwrap_or_else(|e| panic!("{what}: second region: errno {e}"));
        let c = Counters::of(&keep);
        assert_eq!(
            (c.attach, c.vmap, c.cpu_access),
            ((2, 0), (1, 0), (1, 0)),
            "{what}: {c:?}"
        );
        let (region, other) = if crate_first {
            drop(region);
            (None, Some(other))
        } else {
            drop(other);
            (Some(region), None)
        };
        let c = Counters::of(&keep);
        assert_eq!((c.attach, c.cpu_access), ((2, 1), (1, 0)), "{what}: {c:?}");
        if let Some(region) = region {
            let data = pattern(PAGE as usize, 5);
            let src = host_region(&pd, &data, PAGE as usize, Access::empty());
            peer.post_write(Local::new(src, 0..PAGE), region.remote().unwrap(), None)
                .unwrap()
                .spin()
                .unwrap_or_else(|e| panic!("{what}: write: {}", e.error));
            let mut buf = region.into_inner().unwrap();
            let c = Counters::of(&keep);
            assert_eq!(c.cpu_access, (1, 1), "{what}: one bracket for both: {c:?}");
            // (The test's own read brackets its access with DMA_BUF_IOCTL_SYNC.)
            let seen = integration_tests::exporters::Exporter::read(&mut buf);
            assert!(seen[PAGE as usize..2 * PAGE as usize] == data[..], "{what}");
        }
        drop(other);
        let c = Counters::of(&keep);
        c.assert_balanced(what);
        assert_eq!(c.attach, (2, 2), "{what}: {c:?}");
        if crate_first {
            assert_eq!(c.cpu_access, (1, 1), "{what}: one bracket for both: {c:?}");
        }
    }
}

/// rxe waits only for the exporter's kernel fences: a buffer with an unsignalled implicit
/// fence (here a vgem write fence carried over with a sync_file) is refused at once with
/// EBUSY, everything undone, rather than held for as long as the fence lasts; once the fence
/// signals, the same buffer registers.
#[test]
#[ignore = "needs the testbed VM"]
fn a_buffer_with_an_unsignalled_implicit_fence_is_refused_at_once_with_ebusy() {
    use drm_export::VgemFence;
    use drm_export::{DumbBuffer, FenceAccess};
    let tb = Testbed::get();
    let pd = pd(&tb);
    let card = integration_tests::exporters::vgem_card();
    let gem = DumbBuffer::new(&card, PAGE).unwrap();
    let fence = VgemFence::attach(&card, gem.handle(), true).unwrap();
    let sync = gem
        .export()
        .unwrap()
        .export_sync_file(FenceAccess::Read)
        .unwrap();
    let buf = allocate(4 * PAGE, Kind::System);
    buf.import_sync_file(FenceAccess::Write, &sync).unwrap();
    let keep = dup(&buf);
    let t = Instant::now();
    let e = MemoryRegion::register_dmabuf(&pd, buf, 0, PAGE, None, RW)
        .expect_err("an unsignalled implicit fence");
    assert_eq!(e.errno(), Some(libc::EBUSY), "{e}");
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "refused at once: {:?}",
        t.elapsed()
    );
    let c = Counters::of(&keep);
    c.assert_balanced("refused for a fence");
    assert_eq!((c.attach.0, c.vmap.0, c.cpu_access.0), (1, 1, 0), "{c:?}");

    fence.signal().unwrap();
    let region =
        MemoryRegion::register_dmabuf(&pd, DmaBuf::try_from(keep).unwrap(), 0, PAGE, None, RW)
            .expect("registers once the fence signalled");
    let back = region.into_inner().unwrap();
    Counters::of(&back).assert_balanced("after the fence");
}
