//! The raw layer: uapi structs (generated from the system headers by bindgen), ioctl
//! wrappers, `mmap`. The only module of this crate that uses `unsafe`.
//!
//! Every wrapper takes the ioctl's argument by reference, so the pointer handed to the kernel
//! is always valid for the call; the structs' layouts are the headers' own, and bindgen's
//! layout tests (run by `cargo test`) check them.

#![allow(unsafe_code)]

use nix::errno::Errno;
use std::ffi::c_int;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

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

/// Repeats an ioctl interrupted by a signal (`EINTR`/`EAGAIN`), as libdrm's `drmIoctl` does.
fn restart(mut call: impl FnMut() -> nix::Result<c_int>) -> io::Result<c_int> {
    loop {
        match call() {
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            other => return other.map_err(io::Error::from),
        }
    }
}

#[cfg(feature = "cuda")]
pub mod cuda;

/// Wraps an fd a driver just returned.
#[cfg(feature = "cuda")]
pub(crate) fn owned_fd(fd: c_int) -> OwnedFd {
    owned(fd)
}

/// Wraps an fd the kernel just returned.
fn owned(fd: c_int) -> OwnedFd {
    // SAFETY: callers pass only a descriptor that a successful ioctl has just created and
    // that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `UDMABUF_CREATE` on an open `/dev/udmabuf`.
pub fn udmabuf_create(dev: BorrowedFd<'_>, arg: &udmabuf_create) -> io::Result<OwnedFd> {
    // SAFETY: _IOW('u', 0x42, struct udmabuf_create); `arg` is a live struct of that type.
    restart(|| unsafe { raw_udmabuf_create(dev.as_raw_fd(), arg) }).map(owned)
}

/// `UDMABUF_CREATE_LIST`: `items` follow the header in one buffer, as the uapi lays them out.
pub fn udmabuf_create_list(
    dev: BorrowedFd<'_>,
    flags: u32,
    items: &[udmabuf_create_item],
) -> io::Result<OwnedFd> {
    let count =
        u32::try_from(items.len()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // The header is 8 bytes (flags, count) and each item 24; u64 words keep the alignment.
    let words = 1 + items.len() * 3;
    let mut buf = vec![0u64; words];
    buf[0] = u64::from(flags) | (u64::from(count) << 32);
    for (i, it) in items.iter().enumerate() {
        buf[1 + 3 * i] = u64::from(it.memfd) | (u64::from(it.__pad) << 32);
        buf[2 + 3 * i] = it.offset;
        buf[3 + 3 * i] = it.size;
    }
    let arg = buf.as_ptr().cast::<udmabuf_create_list>();
    // SAFETY: _IOW('u', 0x43, struct udmabuf_create_list) with its flexible array: `buf`
    // holds the header followed by `count` items in the uapi's layout (little-endian x86-64
    // word packing, checked by the list test in the VM) and outlives the call.
    restart(|| unsafe { raw_udmabuf_create_list(dev.as_raw_fd(), arg) }).map(owned)
}

/// `DMA_HEAP_IOCTL_ALLOC` on an open heap; returns the dma-buf.
pub fn heap_alloc(heap: BorrowedFd<'_>, arg: &mut dma_heap_allocation_data) -> io::Result<OwnedFd> {
    // SAFETY: _IOWR('H', 0, struct dma_heap_allocation_data); `arg` is live and writable.
    restart(|| unsafe { raw_heap_alloc(heap.as_raw_fd(), arg) })?;
    Ok(owned(arg.fd as c_int))
}

/// `DMA_BUF_IOCTL_SYNC` with `flags` (`DMA_BUF_SYNC_{START,END}` | `{READ,WRITE}`).
pub fn dmabuf_sync(buf: BorrowedFd<'_>, flags: u32) -> io::Result<()> {
    let arg = dma_buf_sync {
        flags: u64::from(flags),
    };
    // SAFETY: _IOW('b', 0, struct dma_buf_sync); `arg` lives on this frame.
    restart(|| unsafe { raw_dmabuf_sync(buf.as_raw_fd(), &arg) }).map(drop)
}

/// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE`: the buffer's current fences for `flags` as a sync_file.
pub fn export_sync_file(buf: BorrowedFd<'_>, flags: u32) -> io::Result<OwnedFd> {
    let mut arg = dma_buf_export_sync_file { flags, fd: -1 };
    // SAFETY: _IOWR('b', 2, struct dma_buf_export_sync_file); `arg` is live and writable.
    restart(|| unsafe { raw_export_sync_file(buf.as_raw_fd(), &mut arg) })?;
    Ok(owned(arg.fd))
}

/// `DMA_BUF_IOCTL_IMPORT_SYNC_FILE`: adds `sync_file`'s fence to the buffer for `flags`.
pub fn import_sync_file(
    buf: BorrowedFd<'_>,
    flags: u32,
    sync_file: BorrowedFd<'_>,
) -> io::Result<()> {
    let arg = dma_buf_import_sync_file {
        flags,
        fd: sync_file.as_raw_fd(),
    };
    // SAFETY: _IOW('b', 3, struct dma_buf_import_sync_file); `arg` lives on this frame and
    // names an fd borrowed for the call.
    restart(|| unsafe { raw_import_sync_file(buf.as_raw_fd(), &arg) }).map(drop)
}

/// `DRM_IOCTL_I915_GEM_CREATE`.
pub fn i915_gem_create(dev: BorrowedFd<'_>, arg: &mut drm_i915_gem_create) -> io::Result<()> {
    // SAFETY: DRM_IOWR(0x40 + 0x1b, struct drm_i915_gem_create); `arg` is live and writable.
    restart(|| unsafe { raw_i915_gem_create(dev.as_raw_fd(), arg) }).map(drop)
}

/// `DRM_IOCTL_I915_GEM_CREATE_EXT`; `arg.extensions` must point to a live extension chain.
pub fn i915_gem_create_ext(
    dev: BorrowedFd<'_>,
    arg: &mut drm_i915_gem_create_ext,
) -> io::Result<()> {
    // SAFETY: DRM_IOWR(0x40 + 0x3c, struct drm_i915_gem_create_ext); `arg` is live and
    // writable; the caller (gem.rs) keeps the extension chain it points to alive for the call.
    restart(|| unsafe { raw_i915_gem_create_ext(dev.as_raw_fd(), arg) }).map(drop)
}

/// `DRM_IOCTL_AMDGPU_GEM_CREATE`.
pub fn amdgpu_gem_create(dev: BorrowedFd<'_>, arg: &mut drm_amdgpu_gem_create) -> io::Result<()> {
    // SAFETY: DRM_IOWR(0x40 + 0x00, union drm_amdgpu_gem_create); `arg` is live and writable.
    restart(|| unsafe { raw_amdgpu_gem_create(dev.as_raw_fd(), arg) }).map(drop)
}

/// The handle amdgpu wrote into the union's `out` member.
pub fn amdgpu_gem_create_out_handle(arg: &drm_amdgpu_gem_create) -> u32 {
    // SAFETY: both union members are plain integers, so every bit pattern is a valid
    // `drm_amdgpu_gem_create_out`; after a successful ioctl the kernel has written `out`.
    unsafe { arg.out.handle }
}

/// `DRM_IOCTL_VGEM_FENCE_ATTACH`.
pub fn vgem_fence_attach(dev: BorrowedFd<'_>, arg: &mut drm_vgem_fence_attach) -> io::Result<()> {
    // SAFETY: DRM_IOWR(0x41, struct drm_vgem_fence_attach); `arg` is live and writable.
    restart(|| unsafe { raw_vgem_fence_attach(dev.as_raw_fd(), arg) }).map(drop)
}

/// `DRM_IOCTL_VGEM_FENCE_SIGNAL`.
pub fn vgem_fence_signal(dev: BorrowedFd<'_>, fence: u32) -> io::Result<()> {
    let arg = drm_vgem_fence_signal { fence, flags: 0 };
    // SAFETY: DRM_IOW(0x42, struct drm_vgem_fence_signal); `arg` lives on this frame.
    restart(|| unsafe { raw_vgem_fence_signal(dev.as_raw_fd(), &arg) }).map(drop)
}

/// A shared read-write mapping of a whole dma-buf; unmapped on drop.
#[derive(Debug)]
pub struct Mmap {
    ptr: std::ptr::NonNull<std::ffi::c_void>,
    len: usize,
}

// SAFETY: the mapping is shared memory that anyone may change at any time; `Mmap` never hands
// out a reference into it, only volatile copies (`VolatileSlice`), which are sound whatever
// other threads, processes or devices do to the bytes. Moving or sharing it across threads
// adds nothing to that.
unsafe impl Send for Mmap {}
// SAFETY: as above: `&Mmap` gives only volatile access.
unsafe impl Sync for Mmap {}

impl Mmap {
    /// `mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)`.
    pub fn new(fd: BorrowedFd<'_>, len: usize) -> io::Result<Mmap> {
        let nz = std::num::NonZeroUsize::new(len)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        use nix::sys::mman::{MapFlags, ProtFlags};
        // SAFETY: a fresh mapping chosen by the kernel (no fixed address), so it aliases no
        // Rust object; its lifetime is tied to the returned `Mmap`, which unmaps on drop.
        let ptr = unsafe {
            nix::sys::mman::mmap(
                None,
                nz,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd,
                0,
            )
        }?;
        Ok(Mmap { ptr, len })
    }

    /// The mapped length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The mapping as volatile memory: every access is a volatile copy, never a Rust
    /// reference, because other mappings, processes, the GPU and the NIC may change these bytes
    /// at any time (a `&[u8]` over them would let the compiler assume they cannot).
    pub fn volatile(&self) -> vm_memory::VolatileSlice<'_> {
        // SAFETY: `ptr..ptr+len` is a live read-write mapping until `self` drops, and the slice
        // borrows `self`. Everyone else who touches these bytes is either another mapping or
        // process (outside Rust's model: memory shared with the outside is reached only through
        // volatile accesses here, which is exactly what `VolatileSlice` does) or a device; no
        // Rust reference to the mapping exists anywhere in this crate.
        unsafe { vm_memory::VolatileSlice::new(self.ptr.as_ptr().cast(), self.len) }
    }
}

impl Drop for Mmap {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, and no slice of it outlives
        // `self` (slices borrow `self`).
        if let Err(e) = unsafe { nix::sys::mman::munmap(self.ptr, self.len) } {
            eprintln!("drm-export: munmap failed: {e}");
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
}
