//! Any CUDA device pointer as a dma-buf range: memory the program already has (a tensor from
//! a framework's caching allocator, a slice of a large pool), not only [`CudaBuffer`]s.
//!
//! [`CudaDevice::export_range`] looks the pointer up (`cuPointerGetAttribute`: memory type,
//! managed or not, device, buffer id, physical mapping; `cuMemGetAddressRange`: the
//! allocation), exports the smallest page-aligned range that covers `[ptr, ptr + len)` with
//! `cuMemGetHandleForAddressRange`, and returns it with the offset of `ptr` inside the
//! dma-buf, so that exactly `[ptr, ptr + len)` can be registered with `iova = ptr` (peers then
//! address GPU memory by device pointer, as NCCL does).
//!
//! Refused with [`Error::CudaPointer`](crate::Error::CudaPointer): unknown or freed pointers, ranges past their
//! allocation, page-locked host memory, managed memory, memory of another GPU, and ranges
//! that cross from one allocation into a neighbouring one (register each part separately)
//! or whose pages hold other allocations' memory (the dma-buf covers whole pages, and the
//! caller gets all of it); an export during which another thread freed the memory is closed
//! and refused. A range across the seams of a `cuMemMap`ped virtual range (several physical allocations
//! side by side, as PyTorch's expandable segments are) is exported as one dma-buf, as
//! NVIDIA's driver allows.
//!
//! Checked against NVIDIA's driver on a GPU (`tests/cuda_driver`, feature `gpu-tests`) and,
//! with RDMA, against a stand-in libcuda in the testbed.
//!
//! [`CudaBuffer`]: super::CudaBuffer

use super::cover::{self, refuse, PointerInfo};
use super::{cu_err, CudaDevice};
use crate::dmabuf::DmaBuf;
use crate::error::{CudaRefusal, Result};
use std::sync::atomic::Ordering;

/// A dma-buf exported for `[ptr, ptr + len)` of CUDA device memory, with what registering
/// exactly that range needs.
#[derive(Debug)]
pub struct CudaRange {
    dmabuf: DmaBuf,
    offset: u64,
    ptr: u64,
    len: u64,
    buffer_id: u64,
}

impl CudaRange {
    /// The dma-buf, which covers the pages holding the range.
    pub fn dmabuf(&self) -> &DmaBuf {
        &self.dmabuf
    }

    /// The offset of `ptr` inside the dma-buf (the `offset` of `ibv_reg_dmabuf_mr`).
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The device pointer, the iova to register with.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The length asked for.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Never empty (length 0 is refused).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The buffer id of the allocation holding `ptr` when exported (see
    /// [`PointerInfo::buffer_id`]); a range across several `cuMemMap`ped allocations has
    /// more, one per allocation, of which this is the first.
    pub fn buffer_id(&self) -> u64 {
        self.buffer_id
    }

    /// The dma-buf, the offset of `ptr` in it, the length and the iova (`ptr`), by name: the
    /// arguments of a dma-buf registration of exactly the range.
    pub fn into_parts(self) -> RangeParts {
        RangeParts {
            dmabuf: self.dmabuf,
            offset: self.offset,
            len: self.len,
            iova: self.ptr,
        }
    }
}

/// A [`CudaRange`] taken apart: the arguments of a dma-buf registration (`ibv_reg_dmabuf_mr`)
/// of exactly `[ptr, ptr + len)`, each by name.
#[derive(Debug)]
#[non_exhaustive]
pub struct RangeParts {
    /// The dma-buf, which covers the pages holding the range.
    pub dmabuf: DmaBuf,
    /// The offset of `ptr` inside the dma-buf.
    pub offset: u64,
    /// The length asked for.
    pub len: u64,
    /// The iova to register with: the device pointer.
    pub iova: u64,
}

impl CudaDevice {
    /// The allocation holding `ptr`, if it is device memory of this device.
    ///
    /// # Errors
    /// [`Error::CudaPointer`](crate::Error::CudaPointer) for a pointer the driver does not know (never allocated, or
    /// freed), host memory, managed memory or another device's memory, or memory another
    /// thread freed or replaced while it was looked up.
    pub fn pointer_info(&self, ptr: u64) -> Result<PointerInfo> {
        let d = self.bind()?;
        let cover = cover::cover(d, self.ordinal, ptr, 1, 1)?;
        // Everything was read of the allocation with this buffer id (see `cover::unchanged`).
        if !cover::unchanged(d, &cover) {
            return Err(refuse(ptr, 1, CudaRefusal::ChangedMeanwhile));
        }
        Ok(cover.info)
    }

    /// Exports the page-aligned range that covers `[ptr, ptr + len)` as a dma-buf. The
    /// pointer may be anywhere in an allocation of this device, and the range may run on
    /// across the seams of virtual memory mapped from several physical allocations with
    /// `cuMemMap` (PyTorch's expandable segments: NVIDIA's driver exports such a range as one
    /// dma-buf), but not into a neighbouring allocation. The dma-buf starts at the page
    /// holding `ptr` and ends with the page holding the range's last byte, and these pages
    /// must lie in the allocation: a range in a page that other allocations share (the driver
    /// packs small allocations 512 bytes apart) is refused, since the dma-buf would hold
    /// their memory too. A region registered with [`CudaRange::into_parts`] reaches exactly
    /// `[ptr, ptr + len)`.
    ///
    /// The memory is checked to be device memory (not host, not managed) of this device, so
    /// that no CPU access of this process goes through it: what peers write there is for
    /// the GPU's users to synchronise with, as any DMA into device memory is.
    ///
    /// # Errors
    /// [`Error::CudaPointer`](crate::Error::CudaPointer) with a [`CudaRefusal`]: length 0, unknown or freed pointer,
    /// host, managed or another device's memory, a range past the allocation, one that
    /// crosses into a neighbouring allocation, pages the allocation does not fill, or memory
    /// freed by another thread during the export. [`Error::Os`](crate::Error::Os) with the CUDA error name if
    /// the driver refuses the export.
    pub fn export_range(&self, ptr: u64, len: u64) -> Result<CudaRange> {
        let d = self.bind()?;
        let page = crate::page_size();
        let cover = cover::cover(d, self.ordinal, ptr, len, page)?;
        // `cover` checked that the page-rounded range does not wrap and lies in memory the
        // driver maps, below the top of the address space.
        let start = ptr - ptr % page;
        let end = (ptr + len).div_ceil(page) * page;
        let size = usize::try_from(end - start)
            .map_err(|_| refuse(ptr, len, CudaRefusal::EmptyOrWrapping))?;
        // SAFETY: every byte of `[start, end)`, the pages holding `[ptr, ptr + len)`, was
        // reported by the driver to be live device memory (not host, not managed) of this
        // device, inside one allocation (within its physical mapping) or inside `cuMemMap`ped
        // allocations of this device that follow one another without a gap (`cover` looked
        // at each), with the device's context bound on this thread by `bind`; so the dma-buf
        // holds no other allocation's memory. Device memory is never behind a CPU reference
        // of this process, so handing it to DMA cannot break any of Rust's rules here.
        // Exporting the memory is what the caller asked for. That the allocations were not
        // freed meanwhile (by another thread) is checked just below.
        let fd = unsafe { d.dmabuf_fd(start, size) }.map_err(|r| {
            // The driver's refusal, unless the memory was freed meanwhile (then that).
            if cover::unchanged(d, &cover) {
                cu_err(d, "cuMemGetHandleForAddressRange", r)
            } else {
                refuse(ptr, len, CudaRefusal::ChangedMeanwhile)
            }
        })?;
        // Each allocation still has the buffer id it had when checked: ids are never reused,
        // so each stayed allocated from the check to after the export, and the dma-buf holds
        // the memory that was checked.
        if !cover::unchanged(d, &cover) {
            drop(fd);
            return Err(refuse(ptr, len, CudaRefusal::ChangedMeanwhile));
        }
        let mut dmabuf = DmaBuf::try_from(fd)?;
        if self.udmabuf_small_pages.load(Ordering::Relaxed) {
            // SAFETY: the caller of `assume_udmabuf_small_pages` promised that every udmabuf
            // this device exports has small pages only (a no-op for other exporters).
            unsafe { dmabuf.assume_udmabuf_small_pages() };
        }
        Ok(CudaRange {
            dmabuf,
            offset: ptr - start,
            ptr,
            len,
            buffer_id: cover.info.buffer_id,
        })
    }
}
