//! drm-export soundness and robustness: GEM handles shared between a buffer and the PRIME
//! import of its own export, checked sync_file construction, waits without a deadline, and
//! dma-heap sizes refused before the kernel. The kernel tests run in the testbed VM.

use drm_export::VgemFence;
use drm_export::{
    prime_export, prime_import, DmaHeap, DrmDevice, DumbBuffer, Error, FenceAccess, SyncFile,
    Udmabuf,
};
use integration_tests::testbed::Testbed;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const TIB: u64 = 1 << 40;

fn card() -> Arc<DrmDevice> {
    integration_tests::exporters::vgem_card()
}

/// A foreign fd that is not a sync_file is refused with a typed error that says what it is;
/// before, `SyncFile::from_fd` took any fd and `wait()` on a regular file returned `Ok`.
#[test]
fn sync_file_from_a_regular_file_or_pipe_is_refused() {
    let file = std::fs::File::open("/proc/self/status").unwrap();
    let err = SyncFile::try_from(OwnedFd::from(file)).unwrap_err();
    assert!(matches!(err, Error::NotSyncFile { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("is not a sync_file"), "{msg}");
    assert!(msg.contains("/proc/"), "{msg}");
    assert!(msg.contains("DMA_BUF_IOCTL_EXPORT_SYNC_FILE"), "{msg}");

    // Another anonymous kind of fd, pollable like a sync_file, is refused too.
    let (reader, _writer) = std::io::pipe().unwrap();
    let err = SyncFile::try_from(OwnedFd::from(reader)).unwrap_err();
    assert!(matches!(err, Error::NotSyncFile { .. }), "{err}");
    assert!(err.to_string().contains("pipe:"), "{err}");
}

/// The scenario of the double close: `import(&dev, &a.export())` on the same device file
/// returns `a`'s own handle. Before, dropping the import closed it, the next buffer got the
/// same handle number, and dropping `a` closed that buffer's handle.
#[test]
#[ignore = "needs the testbed VM"]
fn dropping_an_import_of_ones_own_export_leaves_later_handles_open() {
    Testbed::get();
    let card = card();
    let a = DumbBuffer::new(&card, MIB).expect("dumb buffer a");
    let imported = prime_import(&card, &a.export().expect("export a")).expect("import");
    assert_eq!(
        imported.handle(),
        a.handle(),
        "the kernel returns the file's existing handle for its own export"
    );
    drop(imported);
    let b = DumbBuffer::new(&card, MIB).expect("dumb buffer b");
    drop(a);
    let exported = b
        .export()
        .expect("b's GEM handle must still be open after a and the import are dropped");
    assert_eq!(exported.size(), b.size());
}

/// Every owner of a shared handle holds it: the buffer stays exportable while imports come
/// and go, imports outlive the buffer, and the last owner closes the handle.
#[test]
#[ignore = "needs the testbed VM"]
fn a_shared_gem_handle_closes_with_its_last_owner() {
    Testbed::get();
    let card = card();
    let a = DumbBuffer::new(&card, MIB).expect("dumb buffer");
    let handle = a.handle();
    let d = a.export().expect("export");
    let first = prime_import(&card, &d).expect("import 1");
    let second = prime_import(&card, &d).expect("import 2");
    assert_eq!((first.handle(), second.handle()), (handle, handle));
    drop(first);
    drop(second);
    // The kernel hands back the live export `d` (the handle is open), which this process
    // already owns (ENOENT would mean the handle was closed).
    owned_already(a.export(), "the buffer's handle survives both imports");

    // An import may outlive the buffer it came from.
    let third = prime_import(&card, &d).expect("import 3");
    drop(a);
    owned_already(
        prime_export(&card, third.handle()),
        "the import still owns the handle",
    );
    drop(third);
    // The last owner closed it: the handle no longer exists on this file.
    let err = prime_export(&card, handle).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENOENT), "{err}");
}

/// An export of a buffer whose dma-buf this process already owns: the kernel found the open
/// handle and returned that dma-buf, which a second `DmaBuf` may not own.
fn owned_already(export: drm_export::Result<drm_export::DmaBuf>, what: &str) {
    let err = export.expect_err(what);
    assert!(matches!(err, Error::AlreadyOwned { .. }), "{what}: {err}");
}

/// A real sync_file passes the check; a dma-buf (another fd the kernel made) does not.
#[test]
#[ignore = "needs the testbed VM"]
fn a_real_sync_file_passes_the_check_and_a_dma_buf_does_not() {
    Testbed::get();
    let u = Udmabuf::new(MIB).expect("udmabuf");
    let sf = u
        .dmabuf()
        .export_sync_file(FenceAccess::Read)
        .expect("export sync_file");
    let sf = SyncFile::try_from(sf.into_fd()).expect("a sync_file is accepted");
    assert!(sf.is_signalled().unwrap());
    let dmabuf = std::os::fd::AsFd::as_fd(u.dmabuf())
        .try_clone_to_owned()
        .expect("dup");
    let err = SyncFile::try_from(dmabuf).unwrap_err();
    assert!(matches!(err, Error::NotSyncFile { .. }), "{err}");
}

/// `Duration::MAX` means "no deadline": a signalled fence returns at once. Before, the
/// deadline `Instant::now() + Duration::MAX` overflowed and panicked.
#[test]
#[ignore = "needs the testbed VM"]
fn waiting_with_duration_max_on_a_signalled_sync_file_returns() {
    Testbed::get();
    // A buffer without fences: its sync_file is signalled from the start.
    let u = Udmabuf::new(MIB).expect("udmabuf");
    let sf = u
        .dmabuf()
        .export_sync_file(FenceAccess::Read)
        .expect("export");
    sf.wait(Duration::MAX)
        .expect("an unfenced buffer's sync_file is signalled");

    // A vgem fence signalled by hand, then waited on with no deadline.
    let card = card();
    let buf = DumbBuffer::new(&card, MIB).expect("dumb buffer");
    let d = buf.export().expect("export");
    let fence = VgemFence::attach(&card, buf.handle(), true).expect("attach write fence");
    let sf = d
        .export_sync_file(FenceAccess::Read)
        .expect("export sync_file");
    assert!(!sf.is_signalled().unwrap());
    fence.signal().expect("signal");
    let start = Instant::now();
    sf.wait(Duration::MAX).expect("signalled");
    assert!(start.elapsed() < Duration::from_secs(5));
}

/// A terabyte from the system heap is refused at once with an error that names the size and
/// the machine's memory. Before, the heap allocated page by page until the OOM killer ended
/// the test process.
#[test]
#[ignore = "needs the testbed VM"]
fn a_terabyte_from_the_system_heap_is_refused_before_the_kernel() {
    Testbed::get();
    let heap = DmaHeap::system().expect("system heap");
    let start = Instant::now();
    let err = heap.allocate(TIB).unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("size {TIB} bytes")), "{msg}");
    assert!(msg.contains("MemTotal"), "{msg}");

    // Zero and partial pages are refused too (the kernel would round 4097 up to 8192).
    let page = drm_export::page_size();
    let err = heap.allocate(0).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("size 0"), "{err}");
    let err = heap.allocate(page + 1).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    assert!(
        err.to_string().contains("not a multiple of the page size"),
        "{err}"
    );

    // The process is alive and the heap still serves a sane request.
    assert_eq!(heap.allocate(MIB).expect("1 MiB").size(), MIB);
}

/// Driver-specific ioctls are numbered per driver, so the crate checks the driver before one:
/// an i915 or amdgpu allocation on vgem is `Unsupported`, not an ioctl vgem would misread.
#[test]
#[ignore = "needs the testbed VM"]
fn another_drivers_gem_allocation_on_vgem_is_refused_before_the_ioctl() {
    Testbed::get();
    let dev = card();
    for (name, r) in [
        (
            "i915",
            drm_export::GemBuffer::i915(&dev, MIB, drm_export::Placement::System),
        ),
        (
            "amdgpu",
            drm_export::GemBuffer::amdgpu(&dev, MIB, drm_export::Placement::System),
        ),
    ] {
        let err = r.expect_err(name);
        assert!(matches!(err, Error::Unsupported { .. }), "{name}: {err}");
    }
}

/// A heap name that would leave /dev/dma_heap is refused.
#[test]
#[ignore = "needs the testbed VM"]
fn heap_names_that_leave_the_heap_folder_are_refused() {
    Testbed::get();
    for name in [".", "..", "../null", ""] {
        let err = DmaHeap::open(name).expect_err(name);
        assert!(
            matches!(err, Error::InvalidArgument { .. }),
            "{name:?}: {err}"
        );
    }
    assert!(DmaHeap::open("system").is_ok());
}

/// One live `DmaBuf` per buffer in a process: a dup of a live one's fd, and a second PRIME
/// export of the same GEM object (the kernel hands back the same dma-buf), are refused with
/// a typed error, also while the first is registered with the NIC; once the first is gone
/// (dropped, or turned back into its fd) the buffer can be owned again. Before, the dup became
/// a second owner that could map and write the buffer while the NIC sent it.
#[test]
#[ignore = "needs the testbed VM"]
fn a_second_dmabuf_for_a_live_buffer_is_refused() {
    use rdma_dmabuf::{Access, MemoryRegion};
    use std::os::fd::AsFd;
    let tb = Testbed::get();
    for exporter in integration_tests::exporters::ALL {
        let buf = exporter.allocate(MIB);
        let id = buf.buffer_id();
        let dup = || buf.as_fd().try_clone_to_owned().unwrap();
        let err = drm_export::DmaBuf::try_from(dup()).unwrap_err();
        assert!(
            matches!(err, Error::AlreadyOwned { .. }),
            "{exporter:?}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("already owned") && msg.contains("into_fd"),
            "{msg}"
        );
        assert!(msg.contains(&format!("inode {}", id.ino)), "{msg}");
        let kept = dup();
        let pd = integration_tests::verbs::pd(&tb);
        let region = MemoryRegion::register_dmabuf(&pd, buf, 0, MIB, None, Access::LOCAL_WRITE);
        let region = region.unwrap();
        let again = kept.try_clone().unwrap();
        let err = drm_export::DmaBuf::try_from(again).unwrap_err();
        assert!(
            matches!(err, Error::AlreadyOwned { .. }),
            "while registered: {err}"
        );
        let buf = region.into_inner().unwrap();
        let fd = buf.into_fd();
        let owned = drm_export::DmaBuf::try_from(kept).expect("owned again after into_fd");
        assert_eq!(owned.buffer_id(), id);
        drop(owned);
        let owned = drm_export::DmaBuf::try_from(fd).expect("owned again after a drop");
        assert_eq!(owned.buffer_id(), id);
    }
    // The same GEM object exported twice: the second export is the same dma-buf.
    let dumb = DumbBuffer::new(&card(), MIB).unwrap();
    let first = dumb.export().unwrap();
    let err = dumb.export().unwrap_err();
    assert!(matches!(err, Error::AlreadyOwned { .. }), "{err}");
    drop(first);
    dumb.export()
        .expect("exportable again once the first is dropped");
}
