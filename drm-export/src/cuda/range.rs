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
//! that cross from one physical mapping or allocation into the next (a `cuMemMap`ped range
//! of several physical allocations, or neighbouring allocations: one dma-buf, and one memory
//! region, covers one; register the part in each separately).
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

    /// The allocation's buffer id when exported (see [`PointerInfo::buffer_id`]).
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
    /// pointer may be anywhere in an allocation of this device; the dma-buf may start before
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
    /// crosses a physical mapping's end. [`Error::Os`] with the CUDA error name if the driver
    /// refuses the export.
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
        // inside one live allocation of device memory (not host, not managed) of this device,
        // within one physical mapping, with the device's context bound on this thread by
        // `bind`. Device memory is never behind a CPU reference of this process, so handing
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

/// The checks of [`CudaDevice::export_range`], with the context bound.
fn pointer_info(d: &Driver, ordinal: i32, ptr: u64, len: u64) -> Result<PointerInfo> {
    let no = |why| refuse(ptr, len, why);
    let Some(end) = ptr.checked_add(len).filter(|_| len > 0) else {
        return Err(no(CudaRefusal::EmptyOrWrapping));
    };
    let unknown = |r| {
        no(CudaRefusal::NotCudaMemory {
            driver: d.error_name(r),
        })
    };
    let kind = d.pointer_u32(cuda::PTR_MEMORY_TYPE, ptr).map_err(unknown)?;
    if d.pointer_u32(cuda::PTR_IS_MANAGED, ptr).map_err(unknown)? != 0 {
        return Err(no(CudaRefusal::ManagedMemory));
    }
    if kind == cuda::MEMORYTYPE_HOST {
        return Err(no(CudaRefusal::HostMemory));
    }
    if kind != cuda::MEMORYTYPE_DEVICE {
        return Err(unknown(1));
    }
    let dev = d
        .pointer_u32(cuda::PTR_DEVICE_ORDINAL, ptr)
        .map_err(unknown)? as i32;
    if dev != ordinal {
        return Err(no(CudaRefusal::OtherDevice { ordinal: dev }));
    }
    let buffer_id = d.pointer_u64(cuda::PTR_BUFFER_ID, ptr).map_err(unknown)?;
    let (base, size) = d.address_range(ptr).map_err(unknown)?;
    let (base, size) = (base, size as u64);
    // Drivers before CUDA 11.7 know no mapping attributes: the allocation is one mapping.
    let mapping = match (
        d.pointer_u64(cuda::PTR_MAPPING_BASE_ADDR, ptr),
        d.pointer_u64(cuda::PTR_MAPPING_SIZE, ptr),
    ) {
        (Ok(b), Ok(s)) => (b, s),
        _ => (base, size),
    };
    // The range must stay inside the allocation and inside one physical mapping. NVIDIA's
    // driver (580, H200) reports a `cuMemAlloc` allocation inside a larger mapping (its 2 MiB
    // block), and each `cuMemMap`ped part of a virtual range as an allocation of its own.
    let lo = base.max(mapping.0);
    let hi = (base + size).min(mapping.0 + mapping.1);
    if ptr < lo || end > hi {
        // Device memory of this GPU right after: the range crosses from one mapping (or
        // allocation) into the next, e.g. the seam of a virtual range mapped from several
        // physical allocations. Anything else: it runs off the end of its allocation.
        let next_is_ours = || {
            d.pointer_u32(cuda::PTR_MEMORY_TYPE, hi) == Ok(cuda::MEMORYTYPE_DEVICE)
                && d.pointer_u32(cuda::PTR_DEVICE_ORDINAL, hi) == Ok(ordinal as u32)
        };
        return Err(no(if ptr < lo || hi < base + size || next_is_ours() {
            CudaRefusal::SpansSegments {
                base: lo,
                size: hi.saturating_sub(lo),
            }
        } else {
            CudaRefusal::PastAllocation { base, size }
        }));
    }
    Ok(PointerInfo {
        alloc_base: base,
        alloc_size: size,
        buffer_id,
        mapping,
    })
}
