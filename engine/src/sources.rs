//! A segment shared by several batches at once for what the NIC only reads: RDMA writes from
//! it. Each device's region becomes an [`SharedSource`], which every worker running such a
//! batch leases ranges of, one [`rdma_dmabuf::Source`] per chunk; the CPU and this agent's
//! requests cannot write it meanwhile (peers still may: a segment is registered for remote
//! writes, and the engine's CPU never reads a segment), and it turns back into the
//! segment's regions when the last batch returns it.
//!
//! A CUDA segment's regions are checkouts of the registration caches: they are lent whole to
//! one batch at a time, as for reads into a segment.

use rdma_dmabuf::{Backing, MemoryRegion, SharedDmaBuf, SharedHostBuffer, SharedSource};

/// A segment's regions, shared for NIC reads, by device index (`None` where the segment
/// has none).
pub(crate) enum Sources {
    DmaBuf(Vec<Option<SharedSource<SharedDmaBuf>>>),
    Host(Vec<Option<SharedSource<SharedHostBuffer>>>),
}

/// Each region shared.
pub(crate) fn share<B: Backing>(rs: Vec<Option<MemoryRegion<B>>>) -> Vec<Option<SharedSource<B>>> {
    rs.into_iter().map(|r| r.map(MemoryRegion::share)).collect()
}

/// Every region back (each turned back from its share), or `None` (and every region dropped: each deregisters once its last
/// lease is gone) if a lease is still out.
pub(crate) fn back<B: Backing>(
    ss: Vec<Option<SharedSource<B>>>,
) -> Option<Vec<Option<MemoryRegion<B>>>> {
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
    /// Whether it has a region on device `device`.
    pub fn has_device(&self, device: usize) -> bool {
        match self {
            Sources::DmaBuf(ss) => has(ss, device),
            Sources::Host(ss) => has(ss, device),
        }
    }
}
