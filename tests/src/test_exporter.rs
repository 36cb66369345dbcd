//! The testbed's test exporter (`kernel-patches/test-exporter/`, loaded with the patched stack):
//! dma-bufs whose sg_tables carry poisoned page pointers, as `CONFIG_DMABUF_DEBUG` mangles
//! them, so that an importer which looks at the struct pages of a mapping faults. Its vmap
//! works; one kind of buffer reports that vmap as I/O memory, another moves its backing on
//! request unless pinned. Each buffer counts the calls importers make into it (debugfs).

use drm_export::DmaBuf;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};

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
/// `DTE_MOVABLE`: a dynamic exporter's buffer, moved by `DTE_IOCTL_MOVE` unless pinned.
const DTE_MOVABLE: u32 = 0x2;
/// The exporter's per-buffer counters (debugfs).
const BUFFERS: &str = "/sys/kernel/debug/dmabuf_test_exporter/buffers";

nix::ioctl_readwrite!(
    /// `DTE_IOCTL_CREATE`: `_IOWR('D', 0xe0, struct dte_create)`.
    dte_create,
    b'D',
    0xe0,
    DteCreate
);

nix::ioctl_write_int_bad!(
    /// `DTE_IOCTL_MOVE`: `_IO('D', 0xe1)`, the dma-buf's fd as the argument.
    dte_move,
    nix::request_code_none!(b'D', 0xe1)
);

/// What the buffer's vmap reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// System memory: the importer may use the mapping.
    System,
    /// I/O memory (`iosys_map.is_iomem`): a CPU importer must refuse it, or use I/O accessors.
    IoMem,
    /// System memory from a dynamic exporter (it has `pin`), which moves the buffer to new
    /// pages on [`move_backing`] unless an attachment pinned it.
    Movable,
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
        flags: match kind {
            Kind::System => 0,
            Kind::IoMem => DTE_IOMEM,
            Kind::Movable => DTE_MOVABLE,
        },
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

/// Asks the exporter to move the backing of `buf` (a [`Kind::Movable`] buffer) to new pages,
/// as a driver evicting it would: `EBUSY` while an importer has it pinned.
///
/// # Panics
/// Without the exporter.
pub fn move_backing(buf: impl AsFd) -> nix::Result<()> {
    let dev = std::fs::File::open(DEVICE).unwrap_or_else(|e| panic!("{DEVICE}: {e}"));
    let fd = buf.as_fd().as_raw_fd();
    // SAFETY: DTE_IOCTL_MOVE takes a dma-buf fd by value and touches no user memory.
    unsafe { dte_move(dev.as_raw_fd(), fd) }.map(drop)
}

/// What importers have called on one buffer so far: each pair is a call and its undoing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `attach` and `detach`.
    pub attach: (u64, u64),
    /// `map_dma_buf` and `unmap_dma_buf`.
    pub map: (u64, u64),
    /// `pin` and `unpin` (movable buffers only).
    pub pin: (u64, u64),
    /// `vmap` and `vunmap` (the core calls the exporter once per mapping, refcounted).
    pub vmap: (u64, u64),
    /// `begin_cpu_access` and `end_cpu_access`.
    pub cpu_access: (u64, u64),
    /// Moves of the backing.
    pub moves: u64,
}

impl Counters {
    /// The counters of the buffer `buf` (by the inode of its dma-buf file).
    ///
    /// # Panics
    /// Without the exporter's debugfs file, or if it does not list the buffer.
    pub fn of(buf: impl AsFd) -> Counters {
        let ino = nix::sys::stat::fstat(buf.as_fd())
            .expect("fstat dma-buf")
            .st_ino;
        let text = std::fs::read_to_string(BUFFERS).unwrap_or_else(|e| panic!("{BUFFERS}: {e}"));
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(&ino.to_string()))
            .unwrap_or_else(|| panic!("buffer {ino} not in {BUFFERS}:\n{text}"));
        let get = |name: &str| -> u64 {
            line.split(' ')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in {line:?}"))
        };
        Counters {
            attach: (get("attach"), get("detach")),
            map: (get("map"), get("unmap")),
            pin: (get("pin"), get("unpin")),
            vmap: (get("vmap"), get("vunmap")),
            cpu_access: (get("begin"), get("end")),
            moves: get("moves"),
        }
    }

    /// Asserts that every call was undone, and that nothing was ever mapped for DMA (rxe
    /// never maps an attachment).
    ///
    /// # Panics
    /// If not.
    pub fn assert_balanced(&self, what: &str) {
        for (name, (on, off)) in [
            ("attach", self.attach),
            ("pin", self.pin),
            ("vmap", self.vmap),
            ("cpu access", self.cpu_access),
        ] {
            assert_eq!(on, off, "{what}: {name} not undone: {self:?}");
        }
        assert_eq!(self.map, (0, 0), "{what}: mapped for DMA: {self:?}");
    }
}

/// How many of the exporter's buffers were released with an importer's attach, pin, vmap or
/// CPU access not undone (0 unless an importer leaked one).
///
/// # Panics
/// Without the exporter's debugfs file.
pub fn unbalanced_releases() -> u64 {
    let text = std::fs::read_to_string(BUFFERS).unwrap_or_else(|e| panic!("{BUFFERS}: {e}"));
    text.lines()
        .find_map(|l| l.strip_prefix("unbalanced="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no unbalanced= line in {BUFFERS}"))
}
