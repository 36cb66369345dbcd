//! drm-export against the real kernel: vgem, udmabuf, the system dma-heap, fences, bad input
//! and descriptor leaks. Runs in the testbed VM.

use drm_export::Mapping;
use drm_export::VgemFence;
use drm_export::{
    prime_export, prime_import, DmaBuf, DmaHeap, DrmDevice, DumbBuffer, Error, FenceAccess,
    GpuBuffer, NodeKind, Placement, Udmabuf,
};
use integration_tests::testbed::Testbed;
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn card() -> Arc<DrmDevice> {
    integration_tests::exporters::vgem_card()
}

fn render() -> DrmDevice {
    DrmDevice::open_driver("vgem", NodeKind::Render).expect("vgem render node")
}

/// A pattern that differs per offset and per seed, so shifted or stale data shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

fn write_all(map: &mut Mapping<'_>, data: &[u8]) {
    map.write()
        .expect("begin CPU write")
        .write_at(0, data)
        .expect("in range");
}

fn read_all(map: &Mapping<'_>) -> Vec<u8> {
    map.read().expect("begin CPU read").to_vec()
}

#[test]
#[ignore = "needs the testbed VM"]
fn vgem_nodes_are_found_with_driver_and_capabilities() {
    Testbed::get();
    let cards = drm_export::drm_nodes(NodeKind::Card).unwrap();
    let renders = drm_export::drm_nodes(NodeKind::Render).unwrap();
    assert!(
        !cards.is_empty() && !renders.is_empty(),
        "{cards:?} {renders:?}"
    );
    let card = card();
    assert_eq!(card.driver().name, "vgem");
    assert_eq!(card.kind(), NodeKind::Card);
    let caps = card.capabilities().expect("caps");
    // vgem is no modesetting driver: the dumb-buffer capability is unanswered, yet it has them.
    assert!(
        caps.prime_import && caps.prime_export && caps.dumb_buffers.is_none(),
        "{caps:?}"
    );
    assert_eq!(render().kind(), NodeKind::Render);
    // The driver-agnostic allocator falls back to dumb buffers on vgem's card node.
    let buf = GpuBuffer::allocate(&card, MIB, Placement::Device).expect("allocate");
    assert!(matches!(buf, GpuBuffer::Dumb(_)));
    assert_eq!(buf.export().expect("export").size(), buf.size());
    // Opening a missing driver says so.
    let err = DrmDevice::open_driver("i915", NodeKind::Render).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
}

#[test]
#[ignore = "needs the testbed VM"]
fn vgem_dumb_buffer_round_trips_through_prime_import_on_the_render_node() {
    Testbed::get();
    let card = card();
    let buf = DumbBuffer::new(&card, 4 * MIB).expect("dumb buffer");
    let mut exported = buf.export().expect("export from the card node");
    let data = pattern(exported.size() as usize, 7);
    write_all(&mut exported.map().expect("map"), &data);

    let render = render();
    let imported = prime_import(&render, &exported).expect("import on the render node");
    // The re-export is the same dma-buf (the kernel keeps one per GEM object), which
    // `exported` still owns: a second owner is refused until that one is gone.
    let err = prime_export(&render, imported.handle()).unwrap_err();
    assert!(matches!(err, Error::AlreadyOwned { .. }), "{err}");
    let size = exported.size();
    drop(exported);
    let mut again = prime_export(&render, imported.handle()).expect("re-export from render node");
    assert_eq!(again.size(), size);
    assert_eq!(read_all(&again.map().expect("map re-export")), data);
}

#[test]
#[ignore = "needs the testbed VM"]
fn udmabuf_pattern_crosses_between_memfd_and_dmabuf_mapping() {
    Testbed::get();
    let mut u = Udmabuf::new(2 * MIB).expect("udmabuf");
    let data = pattern(2 * MIB as usize, 3);
    nix::sys::uio::pwrite(u.memfd(), &data, 0).expect("write through the memfd");
    let memfd = u.memfd().try_clone().expect("dup the memfd");
    let mut map = u.dmabuf_mut().map().expect("map");
    assert_eq!(
        read_all(&map),
        data,
        "memfd writes visible through the dma-buf"
    );

    let back = pattern(2 * MIB as usize, 99);
    write_all(&mut map, &back);
    let mut seen = vec![0u8; back.len()];
    nix::sys::uio::pread(&memfd, &mut seen, 0).expect("read through the memfd");
    assert_eq!(seen, back, "dma-buf writes visible through the memfd");
}

#[test]
#[ignore = "needs the testbed VM"]
fn udmabuf_list_joins_ranges_in_order() {
    Testbed::get();
    let page = drm_export::page_size();
    let memfd = sealed_memfd(4 * page);
    let data = pattern(4 * page as usize, 11);
    nix::sys::uio::pwrite(&memfd, &data, 0).expect("fill memfd");
    // Page 2, then page 0.
    let mut d = Udmabuf::export_list(&memfd, &[(2 * page, page), (0, page)]).expect("list");
    assert_eq!(d.size(), 2 * page);
    let seen = read_all(&d.map().expect("map"));
    let p = page as usize;
    assert_eq!(&seen[..p], &data[2 * p..3 * p]);
    assert_eq!(&seen[p..], &data[..p]);
}

#[test]
#[ignore = "needs the testbed VM"]
fn system_heap_buffer_round_trips_a_pattern() {
    Testbed::get();
    assert!(drm_export::dma_heaps()
        .unwrap()
        .contains(&"system".to_string()));
    let heap = DmaHeap::system().expect("system heap");
    let mut d = heap.allocate(3 * MIB).expect("allocate");
    assert_eq!(d.size(), 3 * MIB);
    assert_eq!(d.exporter(), "system");
    let data = pattern(3 * MIB as usize, 5);
    let mut map = d.map().expect("map");
    write_all(&mut map, &data);
    drop(map);
    // A second, independent mapping sees the same bytes.
    assert_eq!(read_all(&d.map().expect("map again")), data);
}

#[test]
#[ignore = "needs the testbed VM"]
fn sync_file_wait_times_out_until_the_vgem_fence_signals() {
    Testbed::get();
    let card = card();
    let buf = DumbBuffer::new(&card, MIB).expect("dumb buffer");
    let d = buf.export().expect("export");
    let fence = VgemFence::attach(&card, buf.handle(), true).expect("attach write fence");

    // A reader must wait for the writer's fence.
    let sf = d
        .export_sync_file(FenceAccess::Read)
        .expect("export sync_file");
    assert!(!sf.is_signalled().unwrap());
    let err = sf.wait(Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");

    // The fence carried over to another buffer through import.
    let u = Udmabuf::new(MIB).expect("udmabuf");
    u.dmabuf()
        .import_sync_file(FenceAccess::Write, &sf)
        .expect("import sync_file");
    let other = u
        .dmabuf()
        .export_sync_file(FenceAccess::Read)
        .expect("export");
    assert!(!other.is_signalled().unwrap());

    fence.signal().expect("signal");
    sf.wait(Duration::from_secs(5)).expect("signalled");
    other
        .wait(Duration::from_secs(5))
        .expect("signalled through import");
}

fn memfd(name: &std::ffi::CStr, sealing: bool) -> OwnedFd {
    let flags = if sealing {
        MFdFlags::MFD_ALLOW_SEALING
    } else {
        MFdFlags::empty()
    };
    memfd_create(name, flags).expect("memfd")
}

fn sealed_memfd(size: u64) -> OwnedFd {
    let fd = memfd(c"sealed", true);
    nix::unistd::ftruncate(&fd, size as i64).unwrap();
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_ADD_SEALS(nix::fcntl::SealFlag::F_SEAL_SHRINK),
    )
    .unwrap();
    fd
}

fn assert_invalid<T: std::fmt::Debug>(r: drm_export::Result<T>, needle: &str) {
    match r {
        Err(e @ Error::InvalidArgument { .. }) => {
            assert!(e.to_string().contains(needle), "{e}")
        }
        other => panic!("expected InvalidArgument ({needle}), got {other:?}"),
    }
}

fn assert_errno<T: std::fmt::Debug>(r: drm_export::Result<T>, errno: i32, hint: &str) {
    match r {
        Err(e) => {
            assert_eq!(e.errno(), Some(errno), "{e}");
            assert!(e.to_string().contains(hint), "{e}");
        }
        Ok(v) => panic!("expected errno {errno}, got {v:?}"),
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn bad_input_gives_typed_errors() {
    Testbed::get();
    let page = drm_export::page_size();

    // Not a dma-buf: a regular file and a memfd.
    let file = OwnedFd::from(std::fs::File::open("/proc/self/status").unwrap());
    assert!(matches!(
        DmaBuf::try_from(file),
        Err(Error::NotDmaBuf { .. })
    ));
    let m = memfd(c"plain", false);
    let err = DmaBuf::try_from(m).unwrap_err();
    assert!(matches!(err, Error::NotDmaBuf { .. }), "{err}");
    assert!(err.to_string().contains("memfd:plain"), "{err}");

    // Sizes refused before the kernel.
    assert_invalid(Udmabuf::new(0), "non-zero multiple");
    assert_invalid(Udmabuf::new(page + 1), "non-zero multiple");
    let limit = drm_export::udmabuf_size_limit().expect("udmabuf.size_limit_mb readable");
    assert_invalid(Udmabuf::new(limit + page), "size_limit_mb");
    assert_invalid(DmaHeap::system().unwrap().allocate(0), "size 0");
    assert_invalid(DumbBuffer::new(&card(), 0), "size 0");

    // A memfd without the shrink seal: the kernel refuses, the hint says why.
    let unsealed = memfd(c"unsealed", true);
    nix::unistd::ftruncate(&unsealed, page as i64).unwrap();
    assert_errno(
        Udmabuf::export(&unsealed, 0, page),
        libc::EINVAL,
        "F_SEAL_SHRINK",
    );

    // Dumb buffers need the card node.
    let render = Arc::new(render());
    assert_errno(DumbBuffer::new(&render, MIB), libc::EACCES, "card node");
    assert!(matches!(
        GpuBuffer::allocate(&render, MIB, Placement::System),
        Err(Error::Unsupported { .. })
    ));

    // Unknown heap, bad heap name.
    assert_errno(DmaHeap::open("no-such-heap"), libc::ENOENT, "no such heap");
    assert_invalid(DmaHeap::open("../system"), "bad heap name");

    // Importing something that is not a dma-buf.
    let not_dmabuf = sealed_memfd(page);
    let err = prime_import(&render, &not_dmabuf.as_fd()).unwrap_err();
    assert!(err.errno().is_some(), "{err}");
    assert!(err.to_string().contains("not a dma-buf"), "{err}");
}
