//! [`RegistrationCache::checkout_cuda`] (feature `cuda`): a CUDA range's cached registration,
//! keyed on its allocation's buffer id by the cache itself, so that no caller has to vouch
//! for the key.

use super::{BufferKey, CacheKey, Checkout, RegistrationCache};
use crate::error::{Error, Result};
use crate::mr::Access;
use drm_export::cuda::{CudaDevice, RangeParts};
use drm_export::CudaRefusal;

/// Refuses `[ptr, ptr + len)` unless it is non-empty and inside the allocation of
/// `alloc_size` bytes at `alloc_base`.
fn check_one_allocation(ptr: u64, len: u64, alloc_base: u64, alloc_size: u64) -> Result<()> {
    let end = ptr.checked_add(len).filter(|_| len > 0);
    let alloc_end = alloc_base.saturating_add(alloc_size);
    match end {
        Some(end) if ptr >= alloc_base && end <= alloc_end => Ok(()),
        _ => Err(Error::CudaRangeNotOneAllocation {
            ptr,
            len,
            alloc_base,
            alloc_size,
        }),
    }
}

impl RegistrationCache {
    /// A registration of exactly `[ptr, ptr + len)` of `cuda`'s device memory with
    /// `iova = ptr` and `access`: a cached one if one is back in the cache, else
    /// `cuda.export_range(ptr, len)` registered. The key is the allocation's buffer id
    /// ([`BufferKey::Cuda`], asked of the driver on every call with
    /// [`CudaDevice::pointer_info`], so memory freed and allocated again at the same address
    /// is never served an old registration), `offset = ptr`, `len`, `iova = ptr`, `access`.
    ///
    /// The range must lie inside the one allocation holding `ptr`: a buffer id names one
    /// allocation, and a range across the seams of `cuMemMap`ped allocations (which
    /// `export_range` exports) could not be keyed on one (register each allocation's part on
    /// its own, or register the range without the cache).
    ///
    /// # Errors
    /// [`Error::CudaRangeNotOneAllocation`] for an empty range or one past the allocation
    /// holding `ptr`; [`Error::Export`] with drm-export's
    /// [`Error::CudaPointer`](drm_export::Error::CudaPointer) for memory that is not this
    /// device's (unknown, freed, host, managed, another GPU's), pages shared with other
    /// allocations, or memory freed or replaced meanwhile
    /// ([`CudaRefusal::ChangedMeanwhile`]); the export's and the registration's errors.
    #[allow(unsafe_code)] // keeps checkout_with_unchecked's promise: see the SAFETY comment
    pub fn checkout_cuda(
        &self,
        cuda: &CudaDevice,
        ptr: u64,
        len: u64,
        access: Access,
    ) -> Result<Checkout> {
        let info = cuda.pointer_info(ptr)?;
        check_one_allocation(ptr, len, info.alloc_base, info.alloc_size)?;
        let key = CacheKey {
            buffer: BufferKey::Cuda {
                buffer_id: info.buffer_id,
            },
            offset: ptr,
            len,
            iova: ptr,
            access,
        };
        let export = || {
            let range = cuda.export_range(ptr, len)?;
            if range.buffer_id() != info.buffer_id {
                // Freed and allocated again between the look-up and the export.
                return Err(Error::from(drm_export::Error::CudaPointer {
                    ptr,
                    len,
                    why: CudaRefusal::ChangedMeanwhile,
                }));
            }
            let RangeParts { dmabuf, offset, .. } = range.into_parts();
            Ok((dmabuf, offset))
        };
        // SAFETY: the contract of `checkout_with_unchecked` for a `BufferKey::Cuda` key: the
        // dma-buf `export` gives holds the memory the key names. `export` gives the dma-buf of
        // `export_range(ptr, len)` of `cuda` and the offset of `ptr` in it, so the region,
        // `len` bytes from that offset, is exactly `[ptr, ptr + len)` of the memory
        // `export_range` checked, which is in the allocation holding `ptr` at the export,
        // whose buffer id is `range.buffer_id()` (drm-export checks it unchanged from its
        // look-up to after the export). That id is `info.buffer_id`, the key's (checked in
        // `export`), and buffer ids are never reused, so it is the allocation `pointer_info`
        // described, still live: `[info.alloc_base, info.alloc_base + info.alloc_size)`,
        // which holds all of `[ptr, ptr + len)` (`check_one_allocation`). So the range lies
        // inside that one allocation, not across `cuMemMap` seams into another, and the
        // key's buffer, offset (`ptr`) and length name exactly the registered memory. On a
        // hit nothing is exported: the region was registered under this same key, by this
        // function or by a caller of `checkout_with_unchecked` bound by the same contract.
        unsafe { self.checkout_with_unchecked(key, export) }
    }
}

#[cfg(test)]
mod tests {
    use super::check_one_allocation;
    use crate::Error;

    #[test]
    fn a_range_must_be_inside_its_one_allocation() {
        let (base, size) = (0x10000, 0x4000);
        for (ptr, len) in [(base, size), (base + 5, 100), (base + size - 1, 1)] {
            assert!(check_one_allocation(ptr, len, base, size).is_ok());
        }
        // Empty, past the end (into the next cuMemMap seam), before the base, wrapping.
        for (ptr, len) in [
            (base, 0),
            (base + size - 7, 20),
            (base - 1, 10),
            (u64::MAX - 2, 10),
        ] {
            let e = check_one_allocation(ptr, len, base, size).unwrap_err();
            assert!(
                matches!(e, Error::CudaRangeNotOneAllocation { ptr: p, len: l, .. } if (p, l) == (ptr, len)),
                "{e}"
            );
        }
    }
}
