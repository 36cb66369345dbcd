//! The raw layer: uapi structs (generated from the system headers by bindgen), ioctl
//! wrappers, `mmap`, and (feature `cuda`) the CUDA driver API. `unsafe` blocks live here,
//! and in `crate::cuda`, which calls the `unsafe fn`s of `sys::cuda` (device addresses).
//!
//! What every ioctl wrapper relies on, and how it makes sure of it:
//! * The file is of the kind the request number is for. Numbers are unique only within one
//!   driver, and another driver could take ours for a command of its own, with its own idea of
//!   the argument. So each wrapper takes the file as a type that can only hold the right kind:
//!   a [`DmaBufFile`] (a dma-buf: implemented by `DmaBuf` alone, whose only constructor,
//!   `DmaBuf::try_from`, checks the fdinfo), a [`DrmFile`] (a DRM node that answered
//!   `DRM_IOCTL_VERSION`: `DrmDevice`; checked here for the driver of driver-specific
//!   numbers), a [`HeapFile`] (a file in `/dev/dma_heap`: `DmaHeap`) and [`UdmabufDevice`]
//!   (`/dev/udmabuf`). The three traits are crate-private and name what the wrappers rely on,
//!   so this layer depends on no type above it.
//! * The argument pointer comes from a reference to a struct of the type the number encodes
//!   (or, for `UDMABUF_CREATE_LIST`, from a buffer this module lays out and checks), so it is
//!   valid, aligned and, for `_IOWR` numbers, writable for that size; the structs are plain
//!   integers, so whatever the kernel writes into them is a valid value.
//! * Nothing the kernel dereferences or resolves hides in an integer field unchecked: fds go
//!   in as [`BorrowedFd`]s, and the one user address (i915's extension chain) is built here
//!   from borrowed data.
//!
//! The bindgen structs' layouts are the headers' own (bindgen's assertions run at compile
//! time); the hand-written vgem structs and the ioctl numbers have tests at the end of this
//! file. Descriptors the kernel creates become [`OwnedFd`]s here, through [`owned`], at the
//! call that returned them.

#![allow(unsafe_code)]

use std::ffi::c_int;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    clippy::multiple_unsafe_ops_per_block
)]
mod uapi {
    include!(concat!(env!("OUT_DIR"), "/uapi.rs"));
}
pub use uapi::*;

/// `struct drm_vgem_fence_attach` (include/uapi/drm/vgem_drm.h; not in libdrm's headers).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct drm_vgem_fence_attach {
    pub handle: u32,
    pub flags: u32,
    pub out_fence: u32,
    pub pad: u32,
}

/// `struct drm_vgem_fence_signal`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct drm_vgem_fence_signal {
    pub fence: u32,
    pub flags: u32,
}

/// `VGEM_FENCE_WRITE`: the fence guards a write (exclusive).
pub const VGEM_FENCE_WRITE: u32 = 0x1;

const DRM: u8 = b'd';
const BASE: u8 = DRM_COMMAND_BASE as u8;

nix::ioctl_write_ptr!(raw_udmabuf_create, b'u', 0x42, udmabuf_create);
nix::ioctl_write_ptr!(raw_udmabuf_create_list, b'u', 0x43, udmabuf_create_list);
nix::ioctl_readwrite!(
    raw_heap_alloc,
    DMA_HEAP_IOC_MAGIC,
    0x0,
    dma_heap_allocation_data
);
nix::ioctl_write_ptr!(raw_dmabuf_sync, b'b', 0, dma_buf_sync);
nix::ioctl_readwrite!(raw_export_sync_file, b'b', 2, dma_buf_export_sync_file);
nix::ioctl_write_ptr!(raw_import_sync_file, b'b', 3, dma_buf_import_sync_file);
nix::ioctl_readwrite!(
    raw_i915_gem_create,
    DRM,
    BASE + DRM_I915_GEM_CREATE as u8,
    drm_i915_gem_create
);
nix::ioctl_readwrite!(
    raw_i915_gem_create_ext,
    DRM,
    BASE + DRM_I915_GEM_CREATE_EXT as u8,
    drm_i915_gem_create_ext
);
nix::ioctl_readwrite!(
    raw_amdgpu_gem_create,
    DRM,
    BASE + DRM_AMDGPU_GEM_CREATE as u8,
    drm_amdgpu_gem_create
);
nix::ioctl_readwrite!(
    raw_vgem_fence_attach,
    DRM,
    BASE + 0x1,
    drm_vgem_fence_attach
);
nix::ioctl_write_ptr!(
    raw_vgem_fence_signal,
    DRM,
    BASE + 0x2,
    drm_vgem_fence_signal
);

mod errno;
mod pages;
use errno::{os_error, restart};
pub use pages::page_size;

#[cfg(feature = "cuda")]
pub mod cuda;

/// Takes ownership of `fd`, a descriptor that a call has just created (rustix's
/// `ret_owned_fd`).
///
/// # Safety
/// `fd` is an open descriptor of this process that nothing else owns: one the kernel (or a
/// driver) has just created and returned to this caller. Otherwise the `OwnedFd` would close,
/// on drop, a descriptor that its real owner still uses, or whatever file has its number by
/// then.
unsafe fn owned(fd: c_int) -> OwnedFd {
    // SAFETY: `fd` is open and owned by no one else, as this function's contract requires of
    // every caller; that is all `from_raw_fd` asks.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// A file proven to be a dma-buf of a fixed size. Contract: implemented only by a type whose
/// every constructor checked that its fd is a dma-buf and read its size from the kernel (the
/// crate's `DmaBuf`); crate-private, so no other crate can.
pub(crate) trait DmaBufFile: AsFd {
    /// The size the kernel reported, fixed for the buffer's life.
    fn size(&self) -> u64;
}

/// A file proven to be a DRM device node that answered `DRM_IOCTL_VERSION` (the crate's
/// `DrmDevice`), with the driver name it gave. Same contract as [`DmaBufFile`].
pub(crate) trait DrmFile: AsFd {
    /// The driver's name, from `DRM_IOCTL_VERSION`.
    fn driver_name(&self) -> &str;
}

/// A file proven to be a dma-heap opened in `/dev/dma_heap` (the crate's `DmaHeap`). Same
/// contract as [`DmaBufFile`].
pub(crate) trait HeapFile {
    /// The heap's file.
    fn heap_fd(&self) -> BorrowedFd<'_>;
}

/// A DRM device's file, refused (`ENOTTY`, the kernel's "not an ioctl of this file") unless
/// its driver is `driver`. The DRM core dispatches driver-specific ioctls by number alone
/// (`nr - DRM_COMMAND_BASE` indexes the driver's table), so another driver would run its own
/// command of that number on our struct, and may read fields of it as user addresses.
fn driver_fd<'d>(dev: &'d impl DrmFile, driver: &str) -> io::Result<BorrowedFd<'d>> {
    if dev.driver_name() == driver {
        Ok(dev.as_fd())
    } else {
        Err(io::Error::from_raw_os_error(libc::ENOTTY))
    }
}

/// The udmabuf driver's device file.
pub const UDMABUF_DEVICE: &str = "/dev/udmabuf";

/// `/dev/udmabuf`, open read-write: the file the udmabuf ioctls go to.
#[derive(Debug)]
pub struct UdmabufDevice(std::fs::File);

impl UdmabufDevice {
    /// Opens [`UDMABUF_DEVICE`].
    pub fn open() -> io::Result<UdmabufDevice> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(UDMABUF_DEVICE)
            .map(UdmabufDevice)
    }
}

/// `UDMABUF_CREATE`: `size` bytes at `offset` of `memfd` as a new dma-buf.
pub fn udmabuf_create(
    dev: &UdmabufDevice,
    memfd: BorrowedFd<'_>,
    flags: u32,
    offset: u64,
    size: u64,
) -> io::Result<(OwnedFd, Option<bool>)> {
    let arg = udmabuf_create {
        memfd: memfd.as_raw_fd() as u32,
        flags,
        offset,
        size,
    };
    // The pages' frames, before the ioctl pins them (see `pages`).
    let pages = pages::before(memfd, &[(offset, size)]);
    // SAFETY: `dev` is /dev/udmabuf, whose driver defines this number as
    // _IOW('u', 0x42, struct udmabuf_create); the kernel reads that struct from `&arg`, a live
    // local of that type. `arg.memfd` is the number of `memfd`, which is borrowed, so open and
    // ours, for the call.
    let fd = restart(|| unsafe { raw_udmabuf_create(dev.0.as_raw_fd(), &arg) })?;
    // SAFETY: UDMABUF_CREATE succeeded, and its return value is then the dma-buf fd that the
    // kernel has just installed for this call (dma_buf_fd); nothing else has seen it.
    let fd = unsafe { owned(fd) };
    Ok((fd, pages::after(pages)))
}

/// `UDMABUF_CREATE_LIST`: the `(offset, size)` ranges of `memfd`, in order, as one dma-buf.
pub fn udmabuf_create_list(
    dev: &UdmabufDevice,
    memfd: BorrowedFd<'_>,
    flags: u32,
    ranges: &[(u64, u64)],
) -> io::Result<(OwnedFd, Option<bool>)> {
    let buf = udmabuf_list_words(flags, memfd.as_raw_fd() as u32, ranges)?;
    let arg = buf.as_ptr().cast::<udmabuf_create_list>();
    // The pages' frames, before the ioctl pins them (see `pages`).
    let pages = pages::before(memfd, ranges);
    // SAFETY: `dev` is /dev/udmabuf, whose driver defines this number as
    // _IOW('u', 0x43, struct udmabuf_create_list). The kernel reads the 8-byte header from
    // `arg`, then `count` items of 24 bytes right after it: `buf` holds exactly that, laid out
    // by `udmabuf_list_words` (field offsets checked at compile time below and by the
    // `udmabuf_list_words_follow_the_uapi_layout` test), 8-aligned as a `Vec<u64>`, and it
    // outlives the call. Every item's memfd is `memfd`, borrowed (so open and ours) for the
    // call.
    let fd = restart(|| unsafe { raw_udmabuf_create_list(dev.0.as_raw_fd(), arg) })?;
    // SAFETY: UDMABUF_CREATE_LIST succeeded, and its return value is then the dma-buf fd that
    // the kernel has just installed for this call; nothing else has seen it.
    let fd = unsafe { owned(fd) };
    Ok((fd, pages::after(pages)))
}

// `udmabuf_list_words` writes the header as one word and each item as three: these are the
// offsets that it assumes, as the uapi header lays them out.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<udmabuf_create_list>() == 8 && align_of::<udmabuf_create_list>() <= 8);
    assert!(offset_of!(udmabuf_create_list, flags) == 0);
    assert!(offset_of!(udmabuf_create_list, count) == 4);
    assert!(offset_of!(udmabuf_create_list, list) == 8);
    assert!(size_of::<udmabuf_create_item>() == 24 && align_of::<udmabuf_create_item>() <= 8);
    assert!(offset_of!(udmabuf_create_item, memfd) == 0);
    assert!(offset_of!(udmabuf_create_item, __pad) == 4);
    assert!(offset_of!(udmabuf_create_item, offset) == 8);
    assert!(offset_of!(udmabuf_create_item, size) == 16);
};

/// The argument of `UDMABUF_CREATE_LIST` as 64-bit words: the header (`flags`, `count`), then
/// one item (`memfd`, pad, `offset`, `size`) per range. Each pair of 32-bit fields goes into
/// its word through native-endian bytes, so the bytes in memory are the struct's on either
/// byte order (no little-endian assumption).
fn udmabuf_list_words(flags: u32, memfd: u32, ranges: &[(u64, u64)]) -> io::Result<Vec<u64>> {
    let count =
        u32::try_from(ranges.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let mut words = Vec::with_capacity(1 + 3 * ranges.len());
    words.push(two_u32s(flags, count));
    for &(offset, size) in ranges {
        words.extend([two_u32s(memfd, 0), offset, size]);
    }
    Ok(words)
}

/// The `u64` whose bytes in memory are `first`'s then `second`'s.
fn two_u32s(first: u32, second: u32) -> u64 {
    let mut bytes = [0; 8];
    bytes[..4].copy_from_slice(&first.to_ne_bytes());
    bytes[4..].copy_from_slice(&second.to_ne_bytes());
    u64::from_ne_bytes(bytes)
}

/// `DMA_HEAP_IOCTL_ALLOC` on `heap`; returns the dma-buf.
pub fn heap_alloc(heap: &impl HeapFile, arg: &mut dma_heap_allocation_data) -> io::Result<OwnedFd> {
    // SAFETY: `heap` is a HeapFile (a DmaHeap), a file opened in /dev/dma_heap (its only constructor
    // refuses names that leave the folder), whose driver defines this number as
    // _IOWR('H', 0, struct dma_heap_allocation_data); `arg` is a live, writable struct of that
    // type, of integers only.
    restart(|| unsafe { raw_heap_alloc(heap.heap_fd().as_raw_fd(), arg) })?;
    // SAFETY: the allocation succeeded, so the kernel has stored in `arg.fd` the dma-buf fd it
    // has just installed for this call; nothing else has seen it.
    Ok(unsafe { owned(arg.fd as c_int) })
}

/// `DMA_BUF_IOCTL_SYNC` with `flags` (`DMA_BUF_SYNC_{START,END}` | `{READ,WRITE}`).
pub fn dmabuf_sync(buf: &impl DmaBufFile, flags: u32) -> io::Result<()> {
    let arg = dma_buf_sync {
        flags: u64::from(flags),
    };
    // SAFETY: `buf` is a DmaBufFile (a DmaBuf), so its fd is a dma-buf (`DmaBuf::try_from`, its only
    // constructor, found the dma-buf fields in its fdinfo), whose driver defines this number
    // as _IOW('b', 0, struct dma_buf_sync); the kernel reads that struct from `&arg`, a live
    // local.
    restart(|| unsafe { raw_dmabuf_sync(buf.as_fd().as_raw_fd(), &arg) }).map(drop)
}

/// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE`: the buffer's current fences for `flags` as a sync_file.
pub fn export_sync_file(buf: &impl DmaBufFile, flags: u32) -> io::Result<OwnedFd> {
    let mut arg = dma_buf_export_sync_file { flags, fd: -1 };
    // SAFETY: `buf`'s fd is a dma-buf (a DmaBuf, checked by `DmaBuf::try_from`), whose driver
    // defines this number as _IOWR('b', 2, struct dma_buf_export_sync_file); `arg` is a live,
    // writable local of that type, of integers only.
    restart(|| unsafe { raw_export_sync_file(buf.as_fd().as_raw_fd(), &mut arg) })?;
    // SAFETY: the export succeeded, so the kernel has stored in `arg.fd` the sync_file fd it
    // has just installed for this call; nothing else has seen it.
    Ok(unsafe { owned(arg.fd) })
}

/// `DMA_BUF_IOCTL_IMPORT_SYNC_FILE`: adds `sync_file`'s fence to the buffer for `flags`.
pub fn import_sync_file(
    buf: &impl DmaBufFile,
    flags: u32,
    sync_file: BorrowedFd<'_>,
) -> io::Result<()> {
    let arg = dma_buf_import_sync_file {
        flags,
        fd: sync_file.as_raw_fd(),
    };
    // SAFETY: `buf`'s fd is a dma-buf (a DmaBuf, checked by `DmaBuf::try_from`), whose driver
    // defines this number as _IOW('b', 3, struct dma_buf_import_sync_file); the kernel reads
    // that struct from `&arg`, a live local. `arg.fd` is `sync_file`'s number, borrowed (so
    // open and ours) for the call; the kernel refuses it if it is not a sync_file.
    restart(|| unsafe { raw_import_sync_file(buf.as_fd().as_raw_fd(), &arg) }).map(drop)
}

/// `DRM_IOCTL_I915_GEM_CREATE` (`ENOTTY` unless the driver is i915).
pub fn i915_gem_create(dev: &impl DrmFile, arg: &mut drm_i915_gem_create) -> io::Result<()> {
    let fd = driver_fd(dev, "i915")?;
    // SAFETY: `fd` is an i915 DRM node (checked just above), whose driver defines this number
    // as DRM_IOWR(0x40 + 0x1b, struct drm_i915_gem_create); `arg` is a live, writable struct of
    // that type, of integers only (no user addresses).
    restart(|| unsafe { raw_i915_gem_create(fd.as_raw_fd(), arg) }).map(drop)
}

/// `DRM_IOCTL_I915_GEM_CREATE_EXT` with one extension, `I915_GEM_CREATE_EXT_MEMORY_REGIONS`,
/// listing `regions` in order of preference; returns the new handle (`ENOTTY` unless the
/// driver is i915).
pub fn i915_gem_create_in_regions(
    dev: &impl DrmFile,
    size: u64,
    flags: u32,
    regions: &[drm_i915_gem_memory_class_instance],
) -> io::Result<u32> {
    let fd = driver_fd(dev, "i915")?;
    let num_regions =
        u32::try_from(regions.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let ext = drm_i915_gem_create_ext_memory_regions {
        base: i915_user_extension {
            name: I915_GEM_CREATE_EXT_MEMORY_REGIONS,
            ..Default::default()
        },
        num_regions,
        regions: regions.as_ptr() as u64,
        ..Default::default()
    };
    let mut arg = drm_i915_gem_create_ext {
        size,
        flags,
        extensions: std::ptr::addr_of!(ext) as u64,
        ..Default::default()
    };
    // SAFETY: `fd` is an i915 DRM node (checked just above), whose driver defines this number
    // as DRM_IOWR(0x40 + 0x3c, struct drm_i915_gem_create_ext); `arg` is a live, writable
    // local of that type. The kernel follows two user addresses, both only to read:
    // `arg.extensions` is `ext`, a local whose `next_extension` is 0 (the chain's end), and
    // `ext.regions` is `regions`, borrowed for the call, with `num_regions` its length. Both
    // outlive the call.
    restart(|| unsafe { raw_i915_gem_create_ext(fd.as_raw_fd(), &mut arg) })?;
    Ok(arg.handle)
}

/// `DRM_IOCTL_AMDGPU_GEM_CREATE` (`ENOTTY` unless the driver is amdgpu).
pub fn amdgpu_gem_create(dev: &impl DrmFile, arg: &mut drm_amdgpu_gem_create) -> io::Result<()> {
    let fd = driver_fd(dev, "amdgpu")?;
    // SAFETY: `fd` is an amdgpu DRM node (checked just above), whose driver defines this number
    // as DRM_IOWR(0x40 + 0x00, union drm_amdgpu_gem_create); `arg` is a live, writable union of
    // that type, of integers only (no user addresses).
    restart(|| unsafe { raw_amdgpu_gem_create(fd.as_raw_fd(), arg) }).map(drop)
}

// `amdgpu_gem_create_out_handle` reads `out.handle` from bytes that `in_` initialised: `in_`
// must cover the whole union, with no padding (four u64 fields), and `out.handle` must be the
// first four bytes.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<drm_amdgpu_gem_create_in>() == 32);
    assert!(size_of::<drm_amdgpu_gem_create>() == size_of::<drm_amdgpu_gem_create_in>());
    assert!(offset_of!(drm_amdgpu_gem_create_out, handle) == 0);
};

/// The handle amdgpu wrote into the union's `out` member (meaningful after a successful
/// [`amdgpu_gem_create`]).
pub fn amdgpu_gem_create_out_handle(arg: &drm_amdgpu_gem_create) -> u32 {
    // SAFETY: reading a union field needs its bytes to be a valid value of its type. Every
    // byte of `arg` is initialised whichever member was written last: `in_` (four u64 fields,
    // no padding) covers the whole union, and the kernel writes `out` over it (sizes asserted
    // above). `out.handle` is a plain u32, for which any initialised bytes are valid.
    unsafe { arg.out.handle }
}

/// `DRM_IOCTL_VGEM_FENCE_ATTACH` (`ENOTTY` unless the driver is vgem).
pub fn vgem_fence_attach(dev: &impl DrmFile, arg: &mut drm_vgem_fence_attach) -> io::Result<()> {
    let fd = driver_fd(dev, "vgem")?;
    // SAFETY: `fd` is a vgem DRM node (checked just above), whose driver defines this number as
    // DRM_IOWR(0x41, struct drm_vgem_fence_attach); `arg` is a live, writable struct of that
    // type (layout tested below), of integers only.
    restart(|| unsafe { raw_vgem_fence_attach(fd.as_raw_fd(), arg) }).map(drop)
}

/// `DRM_IOCTL_VGEM_FENCE_SIGNAL` (`ENOTTY` unless the driver is vgem).
pub fn vgem_fence_signal(dev: &impl DrmFile, fence: u32) -> io::Result<()> {
    let fd = driver_fd(dev, "vgem")?;
    let arg = drm_vgem_fence_signal { fence, flags: 0 };
    // SAFETY: `fd` is a vgem DRM node (checked just above), whose driver defines this number as
    // DRM_IOW(0x42, struct drm_vgem_fence_signal); the kernel reads that struct (layout tested
    // below) from `&arg`, a live local.
    restart(|| unsafe { raw_vgem_fence_signal(fd.as_raw_fd(), &arg) }).map(drop)
}

/// A shared read-write mapping of a whole dma-buf; unmapped on drop.
#[derive(Debug)]
pub struct Mmap {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

// SAFETY: `Mmap` owns a mapping of shared memory that anyone may change at any time, and it
// never hands out a reference into it, only volatile copies (`VolatileSlice`), which are sound
// whatever other threads, processes or devices do to the bytes. Its raw pointer is not tied to
// the thread that mapped it: any thread may copy through it or unmap it.
unsafe impl Send for Mmap {}
// SAFETY: `&Mmap` gives only `len` and volatile slices, so sharing it across threads is
// concurrent volatile access, which the reasoning above already allows.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// `mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, buf, 0)`: all of a dma-buf, whose
    /// size the kernel reported (`DmaBuf::try_from` read it from the fdinfo). Taking a
    /// [`DmaBufFile`] (a `DmaBuf`), not any fd and length, is what makes this safe: a dma-buf keeps its size for
    /// life and the kernel refuses to map past it (`EINVAL`), so no byte of the mapping lies
    /// past the end of its file (a memfd someone shrinks would give `SIGBUS` instead).
    pub fn of(buf: &impl DmaBufFile) -> io::Result<Mmap> {
        let len =
            usize::try_from(buf.size()).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
        // SAFETY: a dma-buf keeps its size for life and is `len` bytes long (see above).
        unsafe { Mmap::shared(buf.as_fd(), 0, len) }
    }

    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, offset)`.
    ///
    /// # Safety
    /// `fd`'s file is at least `offset + len` bytes long and cannot shrink while mapped (a
    /// dma-buf, or a memfd with `F_SEAL_SHRINK`), so no access through the mapping faults.
    unsafe fn shared(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<Mmap> {
        let nz = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let offset =
            i64::try_from(offset).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        use nix::sys::mman::{MapFlags, ProtFlags};
        // SAFETY: no address is given (no `MAP_FIXED`), so the kernel puts the mapping where
        // nothing of this process is mapped: it replaces no memory and aliases no Rust object.
        // `fd` is borrowed, so open, for the call. The returned `Mmap` is the mapping's only
        // owner: it reaches the bytes only through volatile copies and unmaps them on drop.
        let ptr = unsafe {
            nix::sys::mman::mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                offset,
            )
        }
        .map_err(os_error)?;
        Ok(Mmap { ptr, len })
    }

    /// The mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The mapping's start address, for looking its pages up in `/proc/self/pagemap` (an
    /// address only: nothing is reached through it).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// The mapping as volatile memory: every access is a volatile copy, never a Rust
    /// reference, because other mappings, processes, the GPU and the NIC may change these bytes
    /// at any time (a `&[u8]` over them would let the compiler assume they cannot).
    pub fn volatile(&self) -> vm_memory::VolatileSlice<'_> {
        // SAFETY: `VolatileSlice::new` asks for `len` bytes at `ptr` that stay valid while the
        // slice lives, and whose other users access them only volatilely. `ptr..ptr + len` is
        // the read-write mapping made by `new`, which stays mapped until `self` drops, and the
        // slice borrows `self`. Within this process nothing makes a Rust reference to it: `Mmap`
        // hands out only these slices. Other mappings, processes and devices are outside Rust's
        // model, which is why every access here is volatile.
        unsafe { vm_memory::VolatileSlice::new(self.ptr.as_ptr().cast(), self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are the address and length `mmap` returned in `new`, and this
        // is their only unmap; no slice of the mapping outlives `self` (each borrows it).
        if let Err(e) = unsafe { nix::sys::mman::munmap(self.ptr, self.len) } {
            crate::diag::warn(format_args!("munmap failed: {e}"));
        }
    }
}

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// The vgem structs are hand-written (libdrm ships no vgem_drm.h): check them against
    /// include/uapi/drm/vgem_drm.h's layout.
    #[test]
    fn vgem_structs_match_uapi() {
        assert_eq!(size_of::<drm_vgem_fence_attach>(), 16);
        assert_eq!(offset_of!(drm_vgem_fence_attach, out_fence), 8);
        assert_eq!(size_of::<drm_vgem_fence_signal>(), 8);
    }

    #[test]
    fn ioctl_numbers_match_the_headers() {
        // Values as the C macros expand them on x86-64.
        assert_eq!(
            nix::request_code_write!(b'u', 0x42, size_of::<udmabuf_create>()),
            0x4018_7542
        );
        assert_eq!(
            nix::request_code_readwrite!(b'H', 0, size_of::<dma_heap_allocation_data>()),
            0xc018_4800
        );
        assert_eq!(
            nix::request_code_write!(b'b', 0, size_of::<dma_buf_sync>()),
            0x4008_6200
        );
        assert_eq!(
            nix::request_code_readwrite!(b'd', 0x40 + 0x1b, size_of::<drm_i915_gem_create>()),
            0xc010_645b
        );
        assert_eq!(
            nix::request_code_readwrite!(b'd', 0x40, size_of::<drm_amdgpu_gem_create>()),
            0xc020_6440
        );
    }

    #[test]
    fn udmabuf_list_item_is_24_bytes() {
        assert_eq!(size_of::<udmabuf_create_item>(), 24);
        assert_eq!(size_of::<udmabuf_create_list>(), 8);
    }

    /// The packed list has every field at the offset the uapi struct gives it, read back as
    /// native-endian bytes (so the test means the same on either byte order).
    #[test]
    fn udmabuf_list_words_follow_the_uapi_layout() {
        let ranges = [(0x1000, 0x2000), (0x5_0000_0000, 0x3000)];
        let words = udmabuf_list_words(0x8000_0001, 7, &ranges).unwrap();
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        let head = size_of::<udmabuf_create_list>();
        let item = size_of::<udmabuf_create_item>();
        assert_eq!(bytes.len(), head + ranges.len() * item);
        let u32_at = |at: usize| u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap());
        assert_eq!(u32_at(offset_of!(udmabuf_create_list, flags)), 0x8000_0001);
        assert_eq!(u32_at(offset_of!(udmabuf_create_list, count)), 2);
        for (i, &(offset, size)) in ranges.iter().enumerate() {
            let at = offset_of!(udmabuf_create_list, list) + i * item;
            assert_eq!(u32_at(at + offset_of!(udmabuf_create_item, memfd)), 7);
            assert_eq!(u32_at(at + offset_of!(udmabuf_create_item, __pad)), 0);
            assert_eq!(u64_at(at + offset_of!(udmabuf_create_item, offset)), offset);
            assert_eq!(u64_at(at + offset_of!(udmabuf_create_item, size)), size);
        }
    }
}
