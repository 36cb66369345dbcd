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
//! Refused with [`Error::CudaPointer`]: unknown or freed pointers, ranges past their
//! allocation, page-locked host memory, managed memory, memory of another GPU, and ranges
//! that cross from one allocation into a neighbouring one (register each part separately).
//! A range across the seams of a `cuMemMap`ped virtual range (several physical allocations
//! side by side, as PyTorch's expandable segments are) is exported as one dma-buf, as
//! NVIDIA's driver allows.
//!
//! Checked against NVIDIA's driver on a GPU (`tests/cuda_driver`, feature `gpu-tests`) and,
//! with RDMA, against a stand-in libcuda in the testbed.
//!
//! [`CudaBuffer`]: super::CudaBuffer

use super::{cu_err, CudaDevice};
use crate::dmabuf::DmaBuf;
use crate::error::{CudaRefusal, Error, Result};
use crate::sys::cuda::{self, Driver};

/// What a CUDA pointer points into, from the pointer attributes and `cuMemGetAddressRange`.
///
/// As NVIDIA's driver reports them (580, on an H200): a `cuMemAlloc` allocation is its own
/// `alloc_base`/`alloc_size`, inside a larger `mapping` (the driver's block, 2 MiB for small
/// allocations, which other allocations may share); stream-ordered pool memory
/// (`cuMemAllocAsync`) likewise, inside the pool's chunk; each `cuMemMap`ped part of a
/// virtual range is an allocation of its own, equal to its mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PointerInfo {
    /// The allocation's base address.
    pub alloc_base: u64,
    /// The allocation's size in bytes.
    pub alloc_size: u64,
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID`: unique per allocation for the life of the process,
    /// so memory freed and allocated again at the same address has a new id.
    pub buffer_id: u64,
    /// The physical mapping holding the pointer, `(base, size)`, as the driver reports it
    /// (see above); the allocation itself for drivers that report none.
    pub mapping: (u64, u64),
}

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

    /// The dma-buf, the offset of `ptr` in it, the length and the iova (`ptr`): the arguments
    /// of a dma-buf registration of exactly the range.
    pub fn into_parts(self) -> (DmaBuf, u64, u64, u64) {
        (self.dmabuf, self.offset, self.len, self.ptr)
    }
}

fn refuse(ptr: u64, len: u64, why: CudaRefusal) -> Error {
    Error::CudaPointer { ptr, len, why }
}

impl CudaDevice {
    /// The allocation holding `ptr`, if it is device memory of this device.
    ///
    /// # Errors
    /// [`Error::CudaPointer`] for a pointer the driver does not know (never allocated, or
    /// freed), host memory, managed memory or another device's memory.
    pub fn pointer_info(&self, ptr: u64) -> Result<PointerInfo> {
        let d = self.bind()?;
        pointer_info(d, self.ordinal, ptr, 1)
    }

    /// Exports the page-aligned range that covers `[ptr, ptr + len)` as a dma-buf. The
    /// pointer may be anywhere in an allocation of this device, and the range may run on
    /// across the seams of virtual memory mapped from several physical allocations with
    /// `cuMemMap` (PyTorch's expandable segments: NVIDIA's driver exports such a range as one
    /// dma-buf), but not into a neighbouring allocation. The dma-buf may start before
    /// `ptr` and end after `ptr + len` (to the page boundaries), and may cover bytes past the
    /// allocation's ends when these are not page-aligned, but a region registered with
    /// [`CudaRange::into_parts`] reaches exactly `[ptr, ptr + len)`.
    ///
    /// The memory is checked to be device memory (not host, not managed) of this device, so
    /// that no CPU access of this process goes through it: what peers write there is for
    /// the GPU's users to synchronise with, as any DMA into device memory is.
    ///
    /// # Errors
    /// [`Error::CudaPointer`] with a [`CudaRefusal`]: length 0, unknown or freed pointer,
    /// host, managed or another device's memory, a range past the allocation, or one that
    /// crosses into a neighbouring allocation. [`Error::Os`] with the CUDA error name if the
    /// driver refuses the export.
    pub fn export_range(&self, ptr: u64, len: u64) -> Result<CudaRange> {
        let d = self.bind()?;
        let info = pointer_info(d, self.ordinal, ptr, len)?;
        let page = crate::page_size();
        let start = ptr - ptr % page;
        // `pointer_info` checked that `ptr + len` does not wrap and ends inside the
        // allocation, whose end the driver keeps below the top of the address space.
        let end = (ptr + len).div_ceil(page) * page;
        let size = usize::try_from(end - start)
            .map_err(|_| refuse(ptr, len, CudaRefusal::EmptyOrWrapping))?;
        // SAFETY: `[start, end)` covers `[ptr, ptr + len)`, which the driver reported to be
        // live device memory (not host, not managed) of this device, every byte of it: one
        // allocation within its physical mapping, or `cuMemMap`ped mappings of this device
        // that follow one another without a gap (`pointer_info` looked at each), with the
        // device's context bound on this thread by `bind`. Device memory is never behind a CPU reference of this process, so handing
        // it to DMA cannot break any of Rust's rules here; the page-rounding bytes beyond the
        // range are in the dma-buf but outside the region registered from it. Exporting the
        // memory is what the caller asked for.
        let fd = unsafe { d.dmabuf_fd(start, size) }
            .map_err(|r| cu_err(d, "cuMemGetHandleForAddressRange", r))?;
        Ok(CudaRange {
            dmabuf: DmaBuf::try_from(fd)?,
            offset: ptr - start,
            ptr,
            len,
            buffer_id: info.buffer_id,
        })
    }
}

/// The memory holding one address: its allocation and physical mapping, and the part of both
/// (`lo..hi`) a range through the address may cover without crossing into other memory.
struct Piece {
    info: PointerInfo,
    lo: u64,
    hi: u64,
}

/// The piece holding `p`, which must be device memory (not host, not managed) of device
/// `ordinal`; refusals are made by `no`.
fn piece(d: &Driver, ordinal: i32, p: u64, no: &dyn Fn(CudaRefusal) -> Error) -> Result<Piece> {
    let unknown = |r| {
        no(CudaRefusal::NotCudaMemory {
            driver: d.error_name(r),
        })
    };
    let kind = d.pointer_u32(cuda::PTR_MEMORY_TYPE, p).map_err(unknown)?;
    if d.pointer_u32(cuda::PTR_IS_MANAGED, p).map_err(unknown)? != 0 {
        return Err(no(CudaRefusal::ManagedMemory));
    }
    if kind == cuda::MEMORYTYPE_HOST {
        return Err(no(CudaRefusal::HostMemory));
    }
    if kind != cuda::MEMORYTYPE_DEVICE {
        return Err(unknown(1));
    }
    let dev = d
        .pointer_u32(cuda::PTR_DEVICE_ORDINAL, p)
        .map_err(unknown)? as i32;
    if dev != ordinal {
        return Err(no(CudaRefusal::OtherDevice { ordinal: dev }));
    }
    let buffer_id = d.pointer_u64(cuda::PTR_BUFFER_ID, p).map_err(unknown)?;
    let (base, size) = d.address_range(p).map_err(unknown)?;
    let (base, size) = (base, size as u64);
    // Drivers before CUDA 11.7 know no mapping attributes: the allocation is one mapping.
    let mapping = match (
        d.pointer_u64(cuda::PTR_MAPPING_BASE_ADDR, p),
        d.pointer_u64(cuda::PTR_MAPPING_SIZE, p),
    ) {
        (Ok(b), Ok(s)) => (b, s),
        _ => (base, size),
    };
    // NVIDIA's driver (580, H200) reports a `cuMemAlloc` allocation inside a larger mapping
    // (its 2 MiB block), and each `cuMemMap`ped part of a virtual range as an allocation of
    // its own: the range must stay inside both.
    Ok(Piece {
        info: PointerInfo {
            alloc_base: base,
            alloc_size: size,
            buffer_id,
            mapping,
        },
        lo: base.max(mapping.0),
        hi: base
            .saturating_add(size)
            .min(mapping.0.saturating_add(mapping.1)),
    })
}

/// The checks of [`CudaDevice::export_range`], with the context bound: the piece holding
/// `ptr`, after checking that all of `[ptr, ptr + len)` is device memory of device `ordinal`
/// in it or in the `cuMemMap`ped mappings that follow it without a gap.
fn pointer_info(d: &Driver, ordinal: i32, ptr: u64, len: u64) -> Result<PointerInfo> {
    let no = |why| refuse(ptr, len, why);
    let Some(end) = ptr.checked_add(len).filter(|_| len > 0) else {
        return Err(no(CudaRefusal::EmptyOrWrapping));
    };
    let first = piece(d, ordinal, ptr, &no)?;
    let info = first.info;
    let crossing = |p: &Piece| {
        no(CudaRefusal::CrossesAllocations {
            base: p.lo,
            size: p.hi.saturating_sub(p.lo),
        })
    };
    if ptr < first.lo {
        return Err(crossing(&first));
    }
    // A range may go on from one physical mapping into the next where both are parts of
    // virtual memory mapped with `cuMemMap` (e.g. PyTorch's expandable segments): NVIDIA's
    // driver exports such a range as one dma-buf. It may not go on from one allocation into
    // a neighbouring one (`cuMemAlloc`s side by side, or pool allocations in one mapping).
    let mut last = first;
    let mut mapped = None;
    while end > last.hi {
        let at_seam = last.hi == last.info.mapping.0.saturating_add(last.info.mapping.1);
        let next = piece(d, ordinal, last.hi, &no).ok();
        let Some(next) = next else {
            return Err(no(CudaRefusal::PastAllocation {
                base: last.info.alloc_base,
                size: last.info.alloc_size,
            }));
        };
        let vmm = *mapped.get_or_insert_with(|| d.is_mapped(ptr));
        if !(at_seam && vmm && next.lo == last.hi && next.hi > next.lo && d.is_mapped(last.hi)) {
            return Err(crossing(&last));
        }
        last = next;
    }
    Ok(info)
}
