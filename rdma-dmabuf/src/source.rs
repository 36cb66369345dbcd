//! One region lent to many requests at once, for the NIC to read: [`MemoryRegion::share`].
//!
//! An owned post moves its part into the request, so a part serves one request at a time;
//! shards ([`MemoryRegion::split`]) serve many, but over disjoint ranges. What the NIC only
//! reads (the source of an RDMA write, a send) can serve any number of requests at once,
//! over any ranges, overlapping or not: a KV-cache block written to several peers, one
//! pool read by concurrent batches. [`SharedSource`] holds the region; each [`Source`] is a
//! lease of a range of it, an owned part posted like any other, and moved back out with its
//! completion.
//!
//! What keeps this sound, with no check at run time:
//! * the CPU cannot write the region while it is shared: neither type hands out
//!   `&mut MemoryRegion`, and `&MemoryRegion` gives no way to write (host bytes are read
//!   only, a dma-buf has no CPU view without `&mut`);
//! * no local request writes it: a [`Source`] is not an [`ExclusivePart`](crate::ExclusivePart),
//!   the bound of the posts whose NIC writes the local bytes (receives, RDMA reads);
//! * the registration stays while any lease lives (in a request in flight, a handle, an
//!   abandoned request's slot): [`SharedSource::try_into_region`] gives the region back only
//!   when no lease is left, and the last one to go deregisters it.
//!
//! What it does not promise: the rule is this region's, not its memory's. Peers holding its
//! rkey may still write it if it was registered with `REMOTE_WRITE` (the CPU cannot read it
//! then: [`MemoryRegion::bytes`] refuses a remotely writable region), and another
//! registration of the same shared buffer is a region of its own.

use crate::mr::{Backing, MemoryRegion};
use crate::part::{sealed, OwnedPart};
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// A region shared for NIC reads: lend ranges of it with [`SharedSource::lease`].
pub struct SharedSource<B: Backing> {
    region: Arc<MemoryRegion<B>>,
}

/// A lease of a range of a [`SharedSource`]: an owned part for the posts whose NIC reads
/// the local bytes (sends, RDMA writes, write batches). Cloning it makes another lease of
/// the same range.
pub struct Source<B: Backing> {
    region: Arc<MemoryRegion<B>>,
    start: u64,
    end: u64,
}

impl<B: Backing> MemoryRegion<B> {
    /// Shares the region for NIC reads by many requests at once (see [`SharedSource`]).
    pub fn share(self) -> SharedSource<B> {
        SharedSource {
            region: Arc::new(self),
        }
    }
}

impl<B: Backing> SharedSource<B> {
    /// A lease of `range` of the region (checked when posted, as any part's range).
    pub fn lease(&self, range: Range<u64>) -> Source<B> {
        Source {
            region: Arc::clone(&self.region),
            start: range.start,
            end: range.end,
        }
    }

    /// A lease of the whole region.
    pub fn lease_all(&self) -> Source<B> {
        self.lease(0..self.region.len())
    }

    /// The region, shared: its keys, address and length (and, for host memory not
    /// remotely writable, its bytes to read).
    pub fn region(&self) -> &MemoryRegion<B> {
        &self.region
    }

    /// How many leases are out (in requests, handles, or held by the program).
    pub fn leases(&self) -> usize {
        Arc::strong_count(&self.region) - 1
    }

    /// The region back, once no lease is left; while one is (a request may still be
    /// reading the region), `Err` with `self` unchanged.
    pub fn try_into_region(self) -> Result<MemoryRegion<B>, SharedSource<B>> {
        Arc::try_unwrap(self.region).map_err(|region| SharedSource { region })
    }
}

impl<B: Backing> Source<B> {
    /// The range of the region this lease stands for.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }

    /// The region, shared (as [`SharedSource::region`]).
    pub fn region(&self) -> &MemoryRegion<B> {
        &self.region
    }

    /// Whether `self` and `other` lease the same region.
    pub fn same_region(&self, other: &Source<B>) -> bool {
        Arc::ptr_eq(&self.region, &other.region)
    }
}

impl<B: Backing> Clone for Source<B> {
    fn clone(&self) -> Self {
        Source {
            region: Arc::clone(&self.region),
            start: self.start,
            end: self.end,
        }
    }
}

impl<B: Backing> fmt::Debug for SharedSource<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "SharedSource({:?}, {} leases)",
            self.region,
            self.leases()
        )
    }
}

impl<B: Backing> fmt::Debug for Source<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Source({:?}, {}..{})", self.region, self.start, self.end)
    }
}

impl<B: Backing> sealed::Sealed for Source<B> {}
impl<B: Backing> OwnedPart for Source<B> {
    type Backing = B;
    const SHARED: bool = true;
    fn lent(&self, _: sealed::Token) -> (&MemoryRegion<B>, Range<u64>) {
        (&self.region, self.range())
    }
}
