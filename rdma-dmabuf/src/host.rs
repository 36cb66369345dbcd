//! [`HostBuffer`]: page-aligned, zero-filled host memory to register as a region.

use crate::error::{Error, Op, Result};
use nix::sys::mman;
use std::fmt;
use std::ptr::NonNull;

/// Page-aligned host memory from an anonymous mapping, zero-filled; unmapped on drop.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: plain owned memory, like a `Box<[u8]>`.
unsafe impl Send for HostBuffer {}
// SAFETY: `&HostBuffer` gives only shared `&[u8]` access.
unsafe impl Sync for HostBuffer {}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
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
        let page = page_size();
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
        Ok(HostBuffer { ptr, len })
    }

    /// A buffer holding a copy of `data` (rounded up to the page size, zero-padded).
    ///
    /// The buffer is a whole page or more: a region of it posted whole sends (or writes)
    /// every byte of it, 4,096 for `from_slice(b"done")`. Post only the bytes you mean with
    /// [`Local::new`](crate::Local::new)`(region, 0..data.len())` (or a
    /// [`part`](crate::MemoryRegion::part) in a scope):
    ///
    /// ```no_run
    /// # fn f(qp: &rdma_dmabuf::QueuePair, pd: &std::sync::Arc<rdma_dmabuf::ProtectionDomain>)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// use rdma_dmabuf::{Access, HostBuffer, Local, MemoryRegion};
    /// let msg = b"done";
    /// let region = MemoryRegion::register(pd, HostBuffer::from_slice(msg)?, Access::empty())?;
    /// // 4 bytes on the wire, not the page.
    /// let sent = qp.post_send(Local::new(region, 0..msg.len() as u64), None)?.spin()?;
    /// let _region = sent.region;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`HostBuffer::new`].
    pub fn from_slice(data: &[u8]) -> Result<HostBuffer> {
        let mut b = HostBuffer::new(data.len())?;
        b.as_mut_slice()[..data.len()].copy_from_slice(data);
        Ok(b)
    }

    /// The length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
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

    pub(crate) fn addr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping made in `new`, unmapped once; no slice outlives `self`,
        // and a region over it deregisters before dropping it (MemoryRegion's Drop).
        if let Err(e) = unsafe { mman::munmap(self.ptr.cast(), self.len) } {
            crate::diag::warn(format_args!(
                "munmap of a {}-byte host buffer: {e}",
                self.len
            ));
        }
    }
}

/// The CPU page size.
pub(crate) fn page_size() -> usize {
    drm_export::page_size() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_round_up_to_pages_and_start_zeroed() {
        let b = HostBuffer::new(10).unwrap();
        assert_eq!(b.len(), page_size());
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert!((b.addr() as usize).is_multiple_of(page_size()));
        assert!(HostBuffer::new(0).is_err());
    }

    #[test]
    fn lengths_past_the_address_space_are_refused_with_the_figure() {
        for len in [
            usize::MAX,
            usize::MAX - page_size() + 2,
            isize::MAX as usize + 1,
        ] {
            let e = HostBuffer::new(len).unwrap_err().to_string();
            assert!(e.contains(&len.to_string()), "{e}");
            assert!(!e.contains(" 0 bytes"), "{e}");
        }
    }

    #[test]
    fn from_slice_copies() {
        let b = HostBuffer::from_slice(b"hello").unwrap();
        assert_eq!(&b.as_slice()[..5], b"hello");
    }
}
