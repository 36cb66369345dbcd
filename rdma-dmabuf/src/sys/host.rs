//! Host memory: the anonymous mappings behind [`HostBuffer`] (`mmap`, `munmap`) and the
//! memory of other owners it may hold instead, the only host memory this crate registers by
//! address; its slices, and volatile reads of memory a peer may be writing.

use crate::error::{Error, Op, Result};
use nix::sys::mman;
use std::any::Any;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Host memory to register as a region: page-aligned memory from an anonymous mapping,
/// zero-filled, unmapped on drop ([`HostBuffer::new`]); or memory another owner holds, kept
/// by that owner until this value drops ([`HostBuffer::from_foreign`]).
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
    /// `None`: the mapping is this value's own (unmapped on drop). `Some`: what keeps
    /// another owner's memory allocated, dropped with this value.
    owner: Option<Box<dyn Any + Send + Sync>>,
}

// SAFETY: plain owned memory, like a `Box<[u8]>` (a foreign buffer's owner is `Send + Sync`).
unsafe impl Send for HostBuffer {}
// SAFETY: `&HostBuffer` gives only shared `&[u8]` access.
unsafe impl Sync for HostBuffer {}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("foreign", &self.owner.is_some())
            .finish()
    }
}

impl HostBuffer {
    /// Maps `len` bytes (rounded up to the page size) of zeroed memory.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for length 0; [`Error::Verbs`] if `mmap` fails.
    pub fn new(len: usize) -> Result<HostBuffer> {
        if len == 0 {
            return Err(Error::invalid(Op::AllocHost, "length 0"));
        }
        let page = drm_export::page_size() as usize;
        let Some(len) = len.checked_next_multiple_of(page) else {
            return Err(Error::invalid(
                Op::AllocHost,
                format!("{len} bytes: rounded up to the {page}-byte page size, past usize::MAX"),
            ));
        };
        if isize::try_from(len).is_err() {
            return Err(Error::invalid(
                Op::AllocHost,
                format!("{len} bytes: more than isize::MAX, the largest Rust slice"),
            ));
        }
        let size = std::num::NonZeroUsize::new(len).expect("checked above: at least a page");
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing aliases
        // nothing of this process; it is unmapped exactly once, in Drop.
        let p = unsafe {
            mman::mmap_anonymous(
                None,
                size,
                mman::ProtFlags::PROT_READ | mman::ProtFlags::PROT_WRITE,
                mman::MapFlags::MAP_PRIVATE,
            )
        }
        .map_err(|e| Error::from_errno(Op::AllocHost, format!("mmap of {len} bytes"), e as i32))?;
        let ptr = p.cast::<u8>();
        Ok(HostBuffer {
            ptr,
            len,
            owner: None,
        })
    }

    /// `len` bytes at `ptr` that another owner holds (a Python object's buffer, a C
    /// allocation), as a buffer to register without a copy; `owner` keeps them allocated and
    /// is dropped with this value (after every region over it has been deregistered, since
    /// a region owns its buffer). The memory has the owner's alignment (a region does not
    /// need pages).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for length 0, more than `isize::MAX` bytes, or a range
    /// that wraps around the address space.
    ///
    /// # Safety
    /// `ptr..ptr + len` is memory of this process, readable and writable, that stays
    /// allocated at that address (not freed, unmapped, moved or resized) until `owner` is
    /// dropped. For as long as this buffer lives, no Rust reference (`&`/`&mut`, a slice, a
    /// `&T` of any type) to any of those bytes exists outside this buffer: a region over it
    /// lets a NIC, or a peer, write them at any time, which no reference held elsewhere may
    /// see. Code outside this buffer reaches them only through raw pointers and volatile or
    /// atomic access, or from outside Rust (C, Python's own objects). And while a slice made
    /// through this buffer is alive ([`as_slice`], [`as_mut_slice`], a region's
    /// `bytes`/`bytes_mut`, a shard's), nothing else writes those bytes (nor reads them,
    /// for a `&mut [u8]`): no other code of this process, no device. (An owner like
    /// `Arc<Mutex<Box<[u8]>>>` whose other clones lock it and slice the box breaks the
    /// first rule: the bytes would change under that safe `&mut [u8]`.)
    ///
    /// [`as_slice`]: HostBuffer::as_slice
    /// [`as_mut_slice`]: HostBuffer::as_mut_slice
    pub unsafe fn from_foreign(
        ptr: NonNull<u8>,
        len: usize,
        owner: Box<dyn Any + Send + Sync>,
    ) -> Result<HostBuffer> {
        let bad = |what: String| Err(Error::invalid(Op::AllocHost, what));
        if len == 0 {
            return bad("foreign memory of length 0".into());
        }
        if isize::try_from(len).is_err() {
            return bad(format!(
                "{len} bytes of foreign memory: more than isize::MAX, the largest Rust slice"
            ));
        }
        if (ptr.as_ptr() as usize).checked_add(len).is_none() {
            return bad(format!(
                "{len} bytes of foreign memory at {ptr:p} wrap around the address space"
            ));
        }
        Ok(HostBuffer {
            ptr,
            len,
            owner: Some(owner),
        })
    }

    /// Whether the memory is another owner's ([`HostBuffer::from_foreign`]).
    pub fn is_foreign(&self) -> bool {
        self.owner.is_some()
    }

    /// The length in bytes (a multiple of the page size for a buffer of
    /// [`HostBuffer::new`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes until drop; `&self` excludes `&mut` views.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The first byte's address: for registration, and as a value (logs, checks).
    pub(crate) fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Copies `out.len()` bytes at `offset` with volatile reads, making no reference to
    /// them; `false` (nothing copied) if the range is not inside the buffer.
    pub(crate) fn read_volatile_at(&self, offset: usize, out: &mut [u8]) -> bool {
        if offset
            .checked_add(out.len())
            .is_none_or(|end| end > self.len)
        {
            return false;
        }
        // Pointer arithmetic without `unsafe`: every address is checked above to be in the
        // buffer.
        let base = self.ptr.as_ptr().wrapping_add(offset);
        for (i, byte) in out.iter_mut().enumerate() {
            // SAFETY: `offset + i` is inside the mapping (checked above), which stays mapped
            // while `self` lives; a volatile read of a `u8` is never torn and makes no
            // reference, so a concurrent write by a device or peer changes only the value.
            *byte = unsafe { std::ptr::read_volatile(base.wrapping_add(i)) };
        }
        true
    }

    /// `len` bytes at `start`, for a holder of that range of the buffer that nothing writes
    /// meanwhile.
    ///
    /// # Safety
    /// `start..start + len` is inside the buffer, and nothing writes those bytes while the
    /// returned slice lives, neither the CPU (no `&mut` to them) nor a device.
    pub(crate) unsafe fn range(&self, start: usize, len: usize) -> &[u8] {
        debug_assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        let first = self.ptr.as_ptr().wrapping_add(start);
        // SAFETY: in bounds and not written meanwhile (this function's contract).
        unsafe { std::slice::from_raw_parts(first, len) }
    }

    /// `len` bytes at `start`, for the one holder of that range of the buffer.
    ///
    /// # Safety
    /// `start..start + len` is inside the buffer, and no other reference to those bytes is
    /// used while the returned slice lives, by the CPU or by a device (the caller owns that
    /// range exclusively: a [`Shard`](crate::Shard) borrowed exclusively).
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn range_mut(&self, start: usize, len: usize) -> &mut [u8] {
        debug_assert!(start.checked_add(len).is_some_and(|end| end <= self.len));
        let first = self.ptr.as_ptr().wrapping_add(start);
        // SAFETY: in bounds and exclusive (this function's contract).
        unsafe { std::slice::from_raw_parts_mut(first, len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // Another owner's memory: released when `owner` drops, after this.
            return;
        }
        // SAFETY: exactly the mapping made in `new`, unmapped once; no slice outlives `self`,
        // and a region over it deregisters before dropping it (a registration owns it).
        if let Err(e) = unsafe { mman::munmap(self.ptr.cast(), self.len) } {
            crate::diag::warn(format_args!(
                "munmap of a {}-byte host buffer: {e}",
                self.len
            ));
        }
    }
}

/// A [`HostBuffer`] that several regions hold at once: one per protection domain when one
/// buffer is registered on several devices
/// ([`MemoryRegion::register_shared_host`](crate::MemoryRegion::register_shared_host)).
///
/// It gives the CPU no access at all (no bytes, neither shared nor mutable): the regions
/// over it lend it to NICs independently, so any of them may be in use at any time, and a
/// peer may write it through any of them. The [`HostBuffer`] comes back from
/// [`SharedHostBuffer::try_into_inner`] only once nothing else holds it, that is, after
/// every region over it has been deregistered.
#[derive(Debug, Clone)]
pub struct SharedHostBuffer(pub(crate) Arc<HostBuffer>);
