//! [`HostBuffer`]: page-aligned, zero-filled host memory to register as a region.

use crate::error::Result;
pub use crate::sys::host::HostBuffer;

impl HostBuffer {
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

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
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
