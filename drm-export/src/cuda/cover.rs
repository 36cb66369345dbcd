//! What memory a CUDA pointer range covers, as the driver reports it: the checks behind
//! [`CudaDevice::export_range`](super::CudaDevice::export_range) and
//! [`CudaDevice::pointer_info`](super::CudaDevice::pointer_info). Only looks addresses up in
//! the driver's tables; no `unsafe`.

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

/// The refusal of `[ptr, ptr + len)` for `why`.
pub(super) fn refuse(ptr: u64, len: u64, why: CudaRefusal) -> Error {
    Error::CudaPointer { ptr, len, why }
}

/// The memory holding one address: its allocation and physical mapping, and the part of both
/// (`lo..hi`) a range through the address may cover without reaching other memory.
struct Piece {
    info: PointerInfo,
    lo: u64,
    hi: u64,
}

/// What a range covers: the allocation holding its pointer, and every allocation it reaches
/// as `(an address in it, its buffer id)`, for checking after an export that none changed.
pub(super) struct Cover {
    pub(super) info: PointerInfo,
    pieces: Vec<(u64, u64)>,
}

/// The piece holding `p`, which must be device memory (not host, not managed) of device
/// `ordinal`; refusals are made by `no`.
fn piece(d: &Driver, ordinal: i32, p: u64, no: &dyn Fn(CudaRefusal) -> Error) -> Result<Piece> {
    let unknown = |r| {
        no(CudaRefusal::NotCudaMemory {
            driver: d.error_name(r),
        })
    };
    // The buffer id first: if it is the same after everything else is read (and, for an
    // export, after the export), everything read in between was of that one allocation.
    let buffer_id = d.pointer_u64(cuda::PTR_BUFFER_ID, p).map_err(unknown)?;
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
    // (its 2 MiB block, shared with other allocations), and each `cuMemMap`ped part of a
    // virtual range as an allocation of its own: a range must stay inside both.
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

/// Checks that every byte of `[ptr, ptr + len)` rounded out to `page` boundaries is device
/// memory of device `ordinal`: inside the allocation holding `ptr`, or in the `cuMemMap`ped
/// allocations that follow it without a gap in the same reserved range (NVIDIA's driver
/// exports such a range as one dma-buf: PyTorch's expandable segments). It may not reach a
/// neighbouring allocation (`cuMemAlloc`s side by side, pool allocations in one mapping) or
/// another reserved range, nor, for an export
/// (`page` > 1), share a page with one.
pub(super) fn cover(d: &Driver, ordinal: i32, ptr: u64, len: u64, page: u64) -> Result<Cover> {
    let no = |why| refuse(ptr, len, why);
    let end = ptr.checked_add(len).filter(|_| len > 0);
    let Some((end, end_page)) = end.and_then(|e| Some((e, e.checked_next_multiple_of(page)?)))
    else {
        return Err(no(CudaRefusal::EmptyOrWrapping));
    };
    let first = piece(d, ordinal, ptr, &no)?;
    let crossing = |p: &Piece| {
        no(CudaRefusal::CrossesAllocations {
            base: p.lo,
            size: p.hi.saturating_sub(p.lo),
        })
    };
    let shared = |p: &Piece| {
        no(CudaRefusal::SharesPages {
            base: p.info.alloc_base,
            size: p.info.alloc_size,
        })
    };
    // A refusal made from what was read is the caller's answer only if that memory stayed
    // as it was: memory another thread freed or remade meanwhile is said to have changed.
    let settled = |why: Error, seen: &[(u64, u64)]| {
        if ids_unchanged(d, seen) {
            why
        } else {
            no(CudaRefusal::ChangedMeanwhile)
        }
    };
    let mut pieces = vec![(ptr, first.info.buffer_id)];
    if ptr < first.lo {
        return Err(settled(crossing(&first), &pieces));
    }
    if ptr - ptr % page < first.lo {
        return Err(settled(shared(&first), &pieces));
    }
    let info = first.info;
    let mut last = first;
    let mut mapped = None;
    // The `cuMemAddressReserve`d range holding `p`: two reserved side by side (two owners)
    // are not one virtual range, though the driver would export across them too. Read after
    // the buffer id of the part holding `p`, so covered by its re-check (a reservation
    // cannot be freed while a part of it is mapped).
    let reservation = |p| {
        Some((
            d.pointer_u64(cuda::PTR_RANGE_START_ADDR, p).ok()?,
            d.pointer_u64(cuda::PTR_RANGE_SIZE, p).ok()?,
        ))
    };
    let mut reserved = None;
    while end_page > last.hi {
        // Only the rounding to whole pages reaches past the allocation: its pages hold
        // other memory.
        let rounding = end <= last.hi;
        let at_seam = last.hi == last.info.mapping.0.saturating_add(last.info.mapping.1);
        let Ok(next) = piece(d, ordinal, last.hi, &no) else {
            let why = if rounding {
                shared(&last)
            } else {
                no(CudaRefusal::PastAllocation {
                    base: last.info.alloc_base,
                    size: last.info.alloc_size,
                })
            };
            return Err(settled(why, &pieces));
        };
        pieces.push((last.hi, next.info.buffer_id));
        let vmm = *mapped.get_or_insert_with(|| d.is_mapped(ptr));
        let first_range = *reserved.get_or_insert_with(|| reservation(ptr));
        let one_range = first_range.is_some() && reservation(last.hi) == first_range;
        if !(at_seam
            && vmm
            && next.lo == last.hi
            && next.hi > next.lo
            && d.is_mapped(last.hi)
            && one_range)
        {
            let why = if rounding {
                shared(&last)
            } else {
                crossing(&last)
            };
            return Err(settled(why, &pieces));
        }
        last = next;
    }
    Ok(Cover { info, pieces })
}

fn ids_unchanged(d: &Driver, pieces: &[(u64, u64)]) -> bool {
    pieces
        .iter()
        .all(|&(p, id)| d.pointer_u64(cuda::PTR_BUFFER_ID, p) == Ok(id))
}

/// Whether every allocation `cover` found still has the buffer id it had. Buffer ids are
/// never reused, and `piece` reads an allocation's id before its other attributes: so if
/// this holds, each allocation was live from before its attributes were read until now, and
/// all of them were its own.
pub(super) fn unchanged(d: &Driver, cover: &Cover) -> bool {
    ids_unchanged(d, &cover.pieces)
}
