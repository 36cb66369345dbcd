//! Parts of a region: the bytes a request reads or writes, one vocabulary for every layer.
//!
//! * [`Local`]: an owned region and a range of it, moved into an owned post
//!   ([`QueuePair::post_send`](crate::QueuePair::post_send) and the rest) and handed back with
//!   the completion. `Local::new(region, 0..64)`, [`MemoryRegion::into_part`], or a whole
//!   region through `From`.
//! * [`Part`]: a shared borrow of a region and a range, for what the NIC reads (sends,
//!   writes) in the scoped and multi-peer layers: [`MemoryRegion::part`], or `&region`.
//! * [`PartMut`]: an exclusive borrow and a range, for what the NIC writes (receives,
//!   reads): [`MemoryRegion::part_mut`], or `&mut region`.
//! * [`Shard`](crate::Shard): one of several disjoint owned parts of one region
//!   ([`MemoryRegion::split`]), each posted on its own and joined back afterwards.
//! * [`Source`](crate::Source): a lease of a range of a region shared for NIC reads
//!   ([`MemoryRegion::share`]), posted by many requests at once.
//!
//! The owned posts of several parts (`QueuePair::post_write_parts` and the rest) take an
//! array of any [`OwnedPart`]: regions, `Local`s, shards or sources; those whose NIC writes
//! the local bytes (`post_recv_parts`, `post_read_parts`) take only an [`ExclusivePart`],
//! which a source is not.
//!
//! Ranges are byte offsets within the region (`start..end`, `end` exclusive). They are
//! checked when posted: an empty or reversed range, or one past the region's end, is an
//! [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming the range and the
//! region's length.

use crate::mr::{Backing, MemoryRegion};
use std::fmt;
use std::ops::Range;

/// What an owned post can lend to the NIC and get back with the completion: a whole
/// [`MemoryRegion`], a [`Local`] range of one, or a [`Shard`](crate::Shard). Implemented by
/// the crate's types only.
pub trait OwnedPart: Send + 'static + sealed::Sealed {
    /// The region's backing.
    type Backing: Backing;

    /// The registration and the range of it the part stands for (checked when posted).
    /// Callable inside the crate only: a shard must not hand out its whole region.
    #[doc(hidden)]
    fn lent(&self, _: sealed::Token) -> (&MemoryRegion<Self::Backing>, Range<u64>);

    /// Whether other requests may hold the same part at once (a [`Source`](crate::Source)
    /// lease), so that the NIC must not write it. The owned entry refuses such a part for a
    /// receive or a read whatever the caller's bounds say ([`ExclusivePart`] keeps it from
    /// compiling first).
    #[doc(hidden)]
    const SHARED: bool = false;
}

/// An [`OwnedPart`] lent to one request at a time, so that the NIC may write it: every owned
/// part but a [`Source`](crate::Source), which many requests may read at once.
pub trait ExclusivePart: OwnedPart {}

impl<B: Backing> ExclusivePart for MemoryRegion<B> {}
impl<B: Backing> ExclusivePart for Local<B> {}

/// Keeps [`OwnedPart`] closed, and its accessor out of reach of other crates.
// Unnameable on purpose: the sealed-trait pattern.
#[allow(unnameable_types)]
pub(crate) mod sealed {
    /// Implemented by the crate's owned parts only.
    pub trait Sealed {}
    /// Proof that the caller is this crate: nothing outside can build one.
    pub struct Token(());
    /// The crate's token.
    pub(crate) const TOKEN: Token = Token(());
}

impl<B: Backing> sealed::Sealed for MemoryRegion<B> {}
impl<B: Backing> OwnedPart for MemoryRegion<B> {
    type Backing = B;
    fn lent(&self, _: sealed::Token) -> (&MemoryRegion<B>, Range<u64>) {
        (self, 0..self.len())
    }
}

impl<B: Backing> sealed::Sealed for Local<B> {}
impl<B: Backing> OwnedPart for Local<B> {
    type Backing = B;
    fn lent(&self, _: sealed::Token) -> (&MemoryRegion<B>, Range<u64>) {
        (&self.region, self.range())
    }
}

/// An owned region and the range of it a request uses (the owned layer's part).
#[derive(Debug)]
pub struct Local<B: Backing> {
    region: MemoryRegion<B>,
    start: u64,
    end: u64,
}

impl<B: Backing> Local<B> {
    /// `range` of `region` (checked when posted).
    pub fn new(region: MemoryRegion<B>, range: Range<u64>) -> Local<B> {
        Local {
            region,
            start: range.start,
            end: range.end,
        }
    }

    /// The region back.
    pub fn into_region(self) -> MemoryRegion<B> {
        self.region
    }

    /// The region.
    pub fn region(&self) -> &MemoryRegion<B> {
        &self.region
    }

    /// The range of the region.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }
}

impl<B: Backing> From<MemoryRegion<B>> for Local<B> {
    fn from(region: MemoryRegion<B>) -> Local<B> {
        let end = region.len();
        Local::new(region, 0..end)
    }
}

/// A shared borrow of a region and a range of it: what the NIC reads in a scoped or
/// multi-peer send or write. The borrow keeps the CPU from writing the region meanwhile.
pub struct Part<'a, B: Backing> {
    region: &'a MemoryRegion<B>,
    start: u64,
    end: u64,
}

impl<B: Backing> Clone for Part<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<B: Backing> Copy for Part<'_, B> {}

impl<B: Backing> fmt::Debug for Part<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Part({:?}, {}..{})", self.region, self.start, self.end)
    }
}

impl<'a, B: Backing> Part<'a, B> {
    /// The region.
    pub fn region(&self) -> &'a MemoryRegion<B> {
        self.region
    }

    /// The range of the region.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }
}

impl<'a, B: Backing> From<&'a MemoryRegion<B>> for Part<'a, B> {
    fn from(region: &'a MemoryRegion<B>) -> Part<'a, B> {
        region.part(0..region.len())
    }
}

/// An exclusive borrow of a region and a range of it: what the NIC writes in a scoped or
/// multi-peer receive or read. The borrow keeps the CPU from reading or writing the region
/// meanwhile.
pub struct PartMut<'a, B: Backing> {
    region: &'a mut MemoryRegion<B>,
    start: u64,
    end: u64,
}

impl<B: Backing> fmt::Debug for PartMut<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "PartMut({:?}, {}..{})",
            self.region, self.start, self.end
        )
    }
}

impl<B: Backing> PartMut<'_, B> {
    /// The same part, borrowed for a shorter time (to post it again later).
    pub fn reborrow(&mut self) -> PartMut<'_, B> {
        PartMut {
            region: self.region,
            start: self.start,
            end: self.end,
        }
    }

    /// The region.
    pub fn region(&self) -> &MemoryRegion<B> {
        self.region
    }

    /// The range of the region.
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }
}

impl<B: Backing> PartMut<'_, B> {
    /// A shared view of the same part, to check it before posting.
    pub(crate) fn shared(&self) -> Part<'_, B> {
        Part {
            region: self.region,
            start: self.start,
            end: self.end,
        }
    }
}

impl<'a, B: Backing> PartMut<'a, B> {
    /// The part as a shared one, for the time of the exclusive borrow (the NIC may write
    /// it: the borrow stays exclusive).
    pub(crate) fn into_shared(self) -> Part<'a, B> {
        Part {
            region: self.region,
            start: self.start,
            end: self.end,
        }
    }
}

impl<'a, B: Backing> From<&'a mut MemoryRegion<B>> for PartMut<'a, B> {
    fn from(region: &'a mut MemoryRegion<B>) -> PartMut<'a, B> {
        let end = region.len();
        region.part_mut(0..end)
    }
}

impl<B: Backing> MemoryRegion<B> {
    /// `range` of this region, shared: for a scoped or multi-peer send or write.
    pub fn part(&self, range: Range<u64>) -> Part<'_, B> {
        Part {
            region: self,
            start: range.start,
            end: range.end,
        }
    }

    /// `range` of this region, exclusive: for a scoped or multi-peer receive or read.
    pub fn part_mut(&mut self, range: Range<u64>) -> PartMut<'_, B> {
        PartMut {
            region: self,
            start: range.start,
            end: range.end,
        }
    }

    /// `range` of this region, owned: for an owned post.
    pub fn into_part(self, range: Range<u64>) -> Local<B> {
        Local::new(self, range)
    }
}
