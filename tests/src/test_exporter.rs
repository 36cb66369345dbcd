//! The testbed's test exporter (`kernel-patches/test-exporter/`, loaded with the patched stack):
//! dma-bufs whose sg_tables carry poisoned page pointers, as `CONFIG_DMABUF_DEBUG` mangles
//! them, so that an importer which looks at the struct pages of a mapping faults. Its vmap
//! works; one kind of buffer reports that vmap as I/O memory.

use drm_export::DmaBuf;
use std::os::fd::{FromRawFd, OwnedFd};

/// The exporter's device node.
pub const DEVICE: &str = "/dev/dmabuf_test_exporter";

/// `struct dte_create` of `dmabuf_test_exporter.c`.
#[repr(C)]
#[derive(Debug, Default)]
pub struct DteCreate {
    size: u64,
    flags: u32,
    fd: i32,
}

/// `DTE_IOMEM`: the buffer's vmap reports I/O memory.
const DTE_IOMEM: u32 = 0x1;

nix::ioctl_readwrite!(
    /// `DTE_IOCTL_CREATE`: `_IOWR('D', 0xe0, struct dte_create)`.
    dte_create,
    b'D',
    0xe0,
    DteCreate
);

/// What the buffer's vmap reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// System memory: the importer may use the mapping.
    System,
    /// I/O memory (`iosys_map.is_iomem`): a CPU importer must refuse it, or use I/O accessors.
    IoMem,
}

/// A zero-filled dma-buf of `size` bytes (rounded up to pages) from the test exporter.
///
/// # Panics
/// Without the exporter (the patched testbed loads it) or if it fails.
pub fn allocate(size: u64, kind: Kind) -> DmaBuf {
    let dev = std::fs::File::options()
        .read(true)
        .write(true)
        .open(DEVICE)
        .unwrap_or_else(|e| panic!("{DEVICE}: {e} (the patched testbed loads the exporter)"));
    let mut req = DteCreate {
        size,
        flags: if kind == Kind::IoMem { DTE_IOMEM } else { 0 },
        fd: -1,
    };
    // SAFETY: `dev` is the exporter's device, whose DTE_IOCTL_CREATE reads and writes one
    // `struct dte_create`, which `DteCreate` matches field for field (16 bytes, no padding).
    unsafe { dte_create(std::os::fd::AsRawFd::as_raw_fd(&dev), &mut req) }
        .unwrap_or_else(|e| panic!("DTE_IOCTL_CREATE of {size} bytes: {e}"));
    assert!(req.fd >= 0, "the exporter returned no fd");
    // SAFETY: the ioctl succeeded, so `req.fd` is a new fd that this process owns and nothing
    // else holds.
    let fd = unsafe { OwnedFd::from_raw_fd(req.fd) };
    DmaBuf::try_from(fd).expect("the exporter's fd is a dma-buf")
}
