//! Disjoint owned parts of one region: [`MemoryRegion::split`] and [`Shard::join`].
//!
//! An owned post takes its region for the time of the request, so one region carries one
//! request at a time. To keep many requests in flight from one large registration (128
//! writes out of one GPU buffer), split it into shards: each is an owned, disjoint range of
//! the region that can be posted on its own, on any queue pair of the region's protection
//! domain and from any thread, and comes back with its completion. The registration stays
//! until the last shard is gone; [`Shard::join`] gives the whole region back once every shard
//! has come home.
//!
//! A shard never hands out the whole region (its bytes may be in the NIC's hands through a
//! sibling), only its own range: the keys, its address and length, and for host memory its
//! own bytes.

use crate::error::{Error, Op, Result};
use crate::host::HostBuffer;
use crate::mr::{Access, Backing, MemoryRegion};
use crate::part::{sealed, OwnedPart};
use crate::remote::RemoteRegion;
use crate::sys::pd::ProtectionDomain;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Weak};

/// One of the disjoint owned parts of a region ([`MemoryRegion::split`]).
pub struct Shard<B: Backing> {
    region: Arc<Shared<B>>,
    start: u64,
    end: u64,
}

/// The region behind its shards, and whether it was split from a
/// [`Checkout`](crate::Checkout) (then only its [`Lent`](crate::Lent) joins it). `Sync`
/// exactly when the region is (its backing is), so a shard crosses threads under the
/// region's own rules.
struct Shared<B: Backing>(MemoryRegion<B>, bool);

/// Where the shards of a checked-out region belong: the region's own allocation, kept by a
/// weak reference so that its address is never another region's while this lives.
pub(crate) struct Home<B: Backing>(Weak<Shared<B>>);

/// The shards of a split region, and where they belong.
pub(crate) type Lending<B> = (Vec<Shard<B>>, Home<B>);

impl<B: Backing> fmt::Debug for Shard<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Shard({:?}, {}..{})",
            self.region.0, self.start, self.end
        )
    }
}

/// A split that was refused, with the region back.
#[derive(Debug)]
pub struct SplitError<B: Backing> {
    /// Why.
    pub error: Error,
    /// The region, unchanged.
    pub region: MemoryRegion<B>,
}

/// A join that was refused, with the shards back.
#[derive(Debug)]
pub struct JoinError<B: Backing> {
    /// Why.
    pub error: Error,
    /// The shards, unchanged.
    pub shards: Vec<Shard<B>>,
}

impl<B: Backing> fmt::Display for SplitError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: Backing> fmt::Display for JoinError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: Backing> std::error::Error for SplitError<B> {}
impl<B: Backing> std::error::Error for JoinError<B> {}

impl<B: Backing> MemoryRegion<B> {
    /// Splits the region into owned shards, one per range (in the order given). The ranges
    /// must be non-empty, inside the region and pairwise disjoint; they need not cover it.
    ///
    /// # Errors
    /// A [`SplitError`] with the region back: no range, an empty or reversed one, one past
    /// the end, or two that overlap (each named).
    pub fn split(
        self,
        ranges: impl IntoIterator<Item = Range<u64>>,
    ) -> std::result::Result<Vec<Shard<B>>, SplitError<B>> {
        split(self, ranges.into_iter().collect(), false).map(|(shards, _)| shards)
    }

    /// Splits the region into consecutive shards of `size` bytes (the last one shorter if
    /// `size` does not divide the length).
    ///
    /// # Errors
    /// A [`SplitError`] with the region back for a size of 0.
    pub fn split_into_chunks(self, size: u64) -> std::result::Result<Vec<Shard<B>>, SplitError<B>> {
        if size == 0 {
            return Err(SplitError {
                error: Error::invalid(Op::Split, "chunks of 0 bytes"),
                region: self,
            });
        }
        let len = self.len();
        let starts = (0..len.div_ceil(size)).map(|i| i * size);
        self.split(starts.map(|s| s..(s + size).min(len)).collect::<Vec<_>>())
    }
}

/// Splits `region` into shards of `ranges`; `lent` marks a checkout's region, which
/// [`Shard::join`] refuses and [`join_home`] alone takes back.
pub(crate) fn split<B: Backing>(
    region: MemoryRegion<B>,
    ranges: Vec<Range<u64>>,
    lent: bool,
) -> std::result::Result<Lending<B>, SplitError<B>> {
    if let Err(error) = check_disjoint(&ranges, region.len()) {
        return Err(SplitError { error, region });
    }
    let region = Arc::new(Shared(region, lent));
    let home = Home(Arc::downgrade(&region));
    let shards = ranges
        .into_iter()
        .map(|r| Shard {
            region: region.clone(),
            start: r.start,
            end: r.end,
        })
        .collect();
    Ok((shards, home))
}

/// The region back from every one of its shards, which must be shards of `home`'s region.
pub(crate) fn join_home<B: Backing>(
    home: &Home<B>,
    shards: Vec<Shard<B>>,
) -> std::result::Result<MemoryRegion<B>, JoinError<B>> {
    if !shards
        .iter()
        .all(|s| std::ptr::eq(Arc::as_ptr(&s.region), home.0.as_ptr()))
    {
        return Err(JoinError {
            error: Error::invalid(Op::Split, "shards of another region than the one lent"),
            shards,
        });
    }
    join(shards)
}

/// Refuses an empty list, empty or reversed ranges, ranges past `len`, and overlaps.
fn check_disjoint(ranges: &[Range<u64>], len: u64) -> Result<()> {
    let refuse = |why: String| Err(Error::invalid(Op::Split, why));
    if ranges.is_empty() {
        return refuse("no range to split the region into".into());
    }
    for r in ranges {
        if r.end <= r.start {
            return refuse(format!(
                "{}..{}: an empty or reversed range",
                r.start, r.end
            ));
        }
        if r.end > len {
            return refuse(format!(
                "{}..{} outside the region's {len} bytes",
                r.start, r.end
            ));
        }
    }
    let mut sorted: Vec<&Range<u64>> = ranges.iter().collect();
    sorted.sort_by_key(|r| r.start);
    for w in sorted.windows(2) {
        if w[1].start < w[0].end {
            return refuse(format!(
                "{}..{} and {}..{} overlap: shards must be disjoint",
                w[0].start, w[0].end, w[1].start, w[1].end
            ));
        }
    }
    Ok(())
}

impl<B: Backing> Shard<B> {
    /// The shard's range of the region (byte offsets).
    pub fn range(&self) -> Range<u64> {
        self.start..self.end
    }

    /// Its length in bytes (never 0).
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Never empty (empty ranges are refused by the split).
    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// The address of its first byte in work requests (the region's address plus the
    /// shard's start).
    pub fn addr(&self) -> u64 {
        self.region.0.addr() + self.start
    }

    /// The region's local key.
    pub fn lkey(&self) -> u32 {
        self.region.0.lkey()
    }

    /// The region's remote key.
    pub fn rkey(&self) -> u32 {
        self.region.0.rkey()
    }

    /// The access the region was registered with.
    pub fn access(&self) -> Access {
        self.region.0.access()
    }

    /// The region's protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        self.region.0.pd()
    }

    /// What a peer needs to RDMA-read or -write this shard's bytes (`None` without remote
    /// access). The rkey is the region's: it opens the whole region to the peer, as any
    /// remote access does; the range is what the peer is told.
    pub fn remote(&self) -> Option<RemoteRegion> {
        self.region.0.remote().map(|r| RemoteRegion {
            addr: r.addr + self.start,
            len: self.len(),
            rkey: r.rkey,
        })
    }

    /// Whether `other` is a shard of the same split region.
    pub fn same_region(&self, other: &Shard<B>) -> bool {
        Arc::ptr_eq(&self.region, &other.region)
    }

    /// The whole region back, from every one of its shards: refused while a shard is
    /// elsewhere (in another thread's hands, or lent to the NIC in a request whose handle was
    /// dropped, until its completion frees it).
    ///
    /// # Errors
    /// A [`JoinError`] with the shards back: none given, shards of different regions, or not
    /// all of the region's shards.
    ///
    /// The shards of a [`Checkout`](crate::Checkout)'s region are refused too: they go back
    /// to their checkout with [`Lent::join`](crate::Lent::join), so that the region stays
    /// the cache's.
    pub fn join(
        shards: impl IntoIterator<Item = Shard<B>>,
    ) -> std::result::Result<MemoryRegion<B>, JoinError<B>> {
        let shards: Vec<Shard<B>> = shards.into_iter().collect();
        if shards.iter().any(|s| s.region.1) {
            return Err(JoinError {
                error: Error::invalid(
                    Op::Split,
                    "shards of a checked-out region: Lent::join gives them back to their checkout",
                ),
                shards,
            });
        }
        join(shards)
    }
}

/// [`Shard::join`] without the check for a checkout's shards.
fn join<B: Backing>(
    mut shards: Vec<Shard<B>>,
) -> std::result::Result<MemoryRegion<B>, JoinError<B>> {
    let refuse = |why: String, shards| {
        Err(JoinError {
            error: Error::invalid(Op::Split, why),
            shards,
        })
    };
    let Some(first) = shards.first() else {
        return refuse("no shard to join".into(), shards);
    };
    if !shards.iter().all(|s| s.same_region(first)) {
        return refuse("shards of different regions".into(), shards);
    }
    let out = Arc::strong_count(&first.region) - shards.len();
    if out != 0 {
        return refuse(
            format!(
                "{} of the region's {} shards given: {out} are elsewhere (another \
                 thread, or a request still in flight)",
                shards.len(),
                shards.len() + out
            ),
            shards,
        );
    }
    // Every shard is here, and shards cannot be cloned: once the others are dropped,
    // the last one holds the only reference.
    let last = shards.pop().expect("not empty");
    drop(shards);
    match Arc::try_unwrap(last.region) {
        Ok(shared) => Ok(shared.0),
        Err(region) => refuse(
            "a shard was made meanwhile (cannot happen)".into(),
            vec![Shard { region, ..last }],
        ),
    }
}

impl Shard<HostBuffer> {
    /// The shard's bytes, for the CPU (the other shards' bytes stay out of reach).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region.
    #[allow(unsafe_code)] // the range is this shard's own: see the SAFETY comment
    pub fn bytes(&self) -> Result<&[u8]> {
        self.cpu_access()?;
        // SAFETY: `start..end` lies inside the host buffer the region owns (checked by the
        // split), which lives as long as the Arc; no other shard covers these bytes, the
        // region is reachable only through its shards, and this shard is borrowed shared,
        // so nothing writes them meanwhile (peers cannot: checked just above; the NIC
        // cannot: a posted shard is moved into its request).
        Ok(unsafe { self.host().range(self.start as usize, self.len() as usize) })
    }

    /// The shard's bytes, writable by the CPU.
    ///
    /// # Errors
    /// As [`Shard::bytes`].
    #[allow(unsafe_code)] // as `bytes`
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.cpu_access()?;
        // SAFETY: as in `bytes`, and the shard is borrowed exclusively, so nothing else reads
        // or writes these bytes meanwhile.
        Ok(unsafe {
            self.host()
                .range_mut(self.start as usize, self.len() as usize)
        })
    }

    /// The host buffer the shard's bytes are in: `start..start + len` of it, in bounds (the
    /// split checked `end <= len`).
    fn host(&self) -> &HostBuffer {
        self.region.0.backing_unchecked()
    }

    fn cpu_access(&self) -> Result<()> {
        if self.access().remotely_writable() {
            return Err(Error::invalid(
                Op::CpuAccess,
                "the region is remotely writable: a peer may change it at any time; join \
                 the shards and take the region back with into_inner() first",
            ));
        }
        Ok(())
    }
}

impl<B: Backing> crate::part::ExclusivePart for Shard<B> {}
impl<B: Backing> sealed::Sealed for Shard<B> {}
impl<B: Backing> OwnedPart for Shard<B> {
    type Backing = B;
    fn lent(&self, _: sealed::Token) -> (&MemoryRegion<B>, Range<u64>) {
        (&self.region.0, self.range())
    }
}

#[cfg(test)]
mod tests {
    use super::check_disjoint;

    #[test]
    fn ranges_are_checked() {
        assert!(check_disjoint(&[0..4, 4..8, 12..16], 16).is_ok());
        let e = |r: &[std::ops::Range<u64>]| check_disjoint(r, 16).unwrap_err().to_string();
        assert!(e(&[]).contains("no range"));
        assert!(e(&[4..4, 8..9]).contains("empty"));
        assert!(e(&[0..1, 8..17]).contains("outside"));
        assert!(e(&[8..12, 0..9]).contains("overlap"));
    }
}
