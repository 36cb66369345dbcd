//! CPU access to dma-bufs and dma-buf regions: what the safe API allows and refuses at run
//! time. (What it refuses at compile time is in `compile_fail/`.) Runs in the testbed VM.

use drm_export::{Error as DrmError, Udmabuf};
use integration_tests::exporters::Exporter;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, Error, MemoryRegion, RemoteRegion};

const MIB: u64 = 1 << 20;

/// The case behind the old `&[u8]` miscompile: while one read guard lives, another writer
/// (here `pwrite` on the udmabuf's memfd) changes the bytes. Each copy out of the guard must
/// see the bytes as they are now: a shared slice let the compiler reuse the first value.
#[test]
#[ignore = "needs the testbed VM"]
fn a_live_read_guard_sees_writes_made_through_another_path() {
    Testbed::get();
    let mut u = Udmabuf::new(MIB).expect("udmabuf");
    let memfd = u.memfd().try_clone().expect("dup memfd");
    let map = u.dmabuf_mut().map().expect("map");
    let guard = map.read().expect("begin read");
    for round in 0u8..50 {
        nix::sys::uio::pwrite(&memfd, &[round; 64], 4096).expect("pwrite through the memfd");
        let mut seen = [0u8; 64];
        guard.read_at(4096, &mut seen).expect("in range");
        assert_eq!(seen, [round; 64], "round {round}: a stale copy");
    }
}

/// Copies in and out of a mapping are bounds-checked with a typed error, never a panic.
#[test]
#[ignore = "needs the testbed VM"]
fn mapping_copies_out_of_range_are_typed_errors() {
    Testbed::get();
    let mut buf = Exporter::Udmabuf.allocate(MIB);
    let mut map = buf.map().expect("map");
    let mut one = [0u8; 1];
    for (offset, len) in [(MIB as usize, 1), (MIB as usize - 1, 2), (usize::MAX, 2)] {
        let mut dst = vec![0u8; len];
        let err = map.read().unwrap().read_at(offset, &mut dst).unwrap_err();
        assert!(matches!(err, DrmError::InvalidArgument { .. }), "{err}");
        assert!(err.to_string().contains("outside"), "{err}");
    }
    let err = map
        .write()
        .unwrap()
        .write_at(usize::MAX, &[1, 2])
        .unwrap_err();
    assert!(matches!(err, DrmError::InvalidArgument { .. }), "{err}");
    let mut w = map.write().unwrap();
    w.fill(0xa5);
    w.write_at(MIB as usize - 1, &[7]).unwrap();
    w.read_at(MIB as usize - 1, &mut one).unwrap();
    assert_eq!(one, [7]);
    drop(w);
    let all = map.read().unwrap().to_vec();
    assert!(all[..MIB as usize - 1].iter().all(|&b| b == 0xa5));
}

/// A region peers may write cannot be mapped (hole 2's way in was a clone taken before
/// registration; `DmaBuf` has no clone any more, see compile_fail/dmabuf_has_no_clone.rs).
/// A region no peer can write maps, and what the NIC received is there.
#[test]
#[ignore = "needs the testbed VM"]
fn a_remotely_writable_dmabuf_region_is_not_mapped() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let buf = Exporter::Vgem.allocate(MIB);
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let mut region = MemoryRegion::register_dmabuf(&pd, buf, 0, MIB, None, rw).unwrap();
    let err = region.map().unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("remotely writable"), "{err}");

    let mut buf = region.into_inner().unwrap();
    let data = pattern(4096, 9);
    Exporter::fill(&mut buf, 0, &data);
    let mut local = MemoryRegion::register_dmabuf(&pd, buf, 0, MIB, None, Access::LOCAL_WRITE)
        .expect("register without remote access");
    let mut back = vec![0u8; data.len()];
    let map = local.map().expect("a region no peer can write maps");
    map.read().unwrap().read_at(0, &mut back).unwrap();
    assert_eq!(back, data);
}

/// Hole 6: an iova range that wraps around the address space is refused at registration, and
/// a remote slice whose address would wrap is refused, where both once overflowed (a panic in
/// debug builds, address 0 in release).
#[test]
#[ignore = "needs the testbed VM"]
fn a_wrapping_iova_is_refused() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_a, _b) = loopback_pair(&pd);
    let buf = Exporter::Udmabuf.allocate(8192);
    let err = MemoryRegion::register_dmabuf(
        &pd,
        buf,
        0,
        8192,
        Some(0xffff_ffff_ffff_f000),
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("wraps"), "{err}");

    let forged = RemoteRegion {
        addr: 0xffff_ffff_ffff_f000,
        len: 8192,
        rkey: 1,
    };
    let err = forged.slice(4096, 16).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
}
