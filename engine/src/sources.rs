//! A segment shared by several batches at once for what the NIC only reads: RDMA writes from
//! it. Each device's region becomes an [`SharedSource`], which every worker running such a
//! batch leases ranges of, one [`rdma_dmabuf::Source`] per chunk; the CPU and the NIC cannot
//! write it meanwhile, and it turns back into the segment's regions when the last batch
//! returns it.
//!
//! A CUDA segment's regions are checkouts of the registration caches: they are lent whole to
//! one batch at a time, as for reads into a segment.

use crate::segment::Region;
use rdma_dmabuf::{Backing, MemoryRegion, SharedDmaBuf, SharedHostBuffer, SharedSource};

/// A segment's regions, shared for NIC reads, by device index (`None` where the segment
/// has none).
pub(crate) enum Sources {
    DmaBuf(Vec<Option<SharedSource<SharedDmaBuf>>>),
    Host(Vec<Option<SharedSource<SharedHostBuffer>>>),
}

fn share<B: Backing>(rs: Vec<Option<MemoryRegion<B>>>) -> Vec<Option<SharedSource<B>>> {
    rs.into_iter().map(|r| r.map(MemoryRegion::share)).collect()
}

/// Every region back, or `None` (and every region dropped: each deregisters once its last
/// lease is gone) if a lease is still out.
fn back<B: Backing>(ss: Vec<Option<SharedSource<B>>>) -> Option<Vec<Option<MemoryRegion<B>>>> {
    let mut out = Vec::with_capacity(ss.len());
    for s in ss {
        out.push(match s {
            Some(s) => Some(s.try_into_region().ok()?),
            None => None,
        });
    }
    Some(out)
}

fn has<B: Backing>(ss: &[Option<SharedSource<B>>], device: usize) -> bool {
    ss.get(device).is_some_and(Option::is_some)
}

impl Sources {
    /// Shares `region` for NIC reads; a CUDA segment's back (lent whole instead).
    pub fn share(region: Region) -> Result<Sources, Region> {
        match region {
            Region::DmaBuf(rs) => Ok(Sources::DmaBuf(share(rs))),
            Region::Host(rs) => Ok(Sources::Host(share(rs))),
            cuda @ Region::Cuda { .. } => Err(cuda),
        }
    }

    /// The segment's regions again, once no lease is out; `None` if one still is (never
    /// expected: every lease comes back with its completion), when the segment is lost.
    pub fn into_region(self) -> Option<Region> {
        match self {
            Sources::DmaBuf(ss) => back(ss).map(Region::DmaBuf),
            Sources::Host(ss) => back(ss).map(Region::Host),
        }
    }

    /// Whether it has a region on device `device`.
    pub fn has_device(&self, device: usize) -> bool {
        match self {
            Sources::DmaBuf(ss) => has(ss, device),
            Sources::Host(ss) => has(ss, device),
        }
    }
}
