//! A checkout's region split into shards ([`Checkout::split`]) and given back to it
//! ([`Lent::join`]): many requests in flight from one cached registration, which stays the
//! cache's throughout.

use super::{lock, CacheKey, Checkout, State};
use crate::error::Error;
use crate::shard::{self, Home, Shard};
use crate::shared_dmabuf::SharedDmaBuf;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// What a [`Checkout`] leaves when split into shards ([`Checkout::split`]): the place its
/// region goes back to. [`Lent::join`] takes every shard of that region, and no other, and
/// gives the checkout back.
///
/// Dropped without being joined, the region leaves the cache for good: the cache's
/// counters no longer count it, and it is deregistered when its last shard is dropped (after
/// the completion of the last request that holds one), as any split region is. The shards
/// of a checkout never give the region itself back ([`Shard::join`] refuses them), so it
/// can be neither filed under another key nor taken from the cache, and its dma-buf is
/// never within the CPU's reach.
pub struct Lent {
    home: Home<SharedDmaBuf>,
    key: CacheKey,
    epoch: u64,
    len: u64,
    state: Arc<Mutex<State>>,
    /// The region came back ([`Lent::join`]): the drop leaves the counters alone.
    joined: bool,
}

impl fmt::Debug for Lent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("key", &self.key)
            .field("joined", &self.joined)
            .finish()
    }
}

/// A [`Checkout::split`] that was refused, with the checkout back.
#[derive(Debug)]
pub struct LentSplitError {
    /// Why (as [`MemoryRegion::split`](crate::MemoryRegion::split) refuses).
    pub error: Error,
    /// The checkout, unchanged.
    pub checkout: Checkout,
}

/// A [`Lent::join`] that was refused, with the shards and the [`Lent`] back.
#[derive(Debug)]
pub struct LentJoinError {
    /// Why: shards of another region, or not all of the region's shards.
    pub error: Error,
    /// The lent region's place, unchanged (join again once every shard is back).
    pub lent: Lent,
    /// The shards, unchanged.
    pub shards: Vec<Shard<SharedDmaBuf>>,
}

impl fmt::Display for LentSplitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl fmt::Display for LentJoinError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for LentSplitError {}
impl std::error::Error for LentJoinError {}

impl Checkout {
    /// Splits the checked-out region into owned shards, one per range, as
    /// [`MemoryRegion::split`](crate::MemoryRegion::split) does (non-empty, inside the
    /// region, pairwise disjoint), each posted on its own; [`Lent::join`] gives the checkout
    /// back once every shard has come home.
    ///
    /// # Errors
    /// A [`LentSplitError`] (boxed: it holds the checkout) with the checkout back, for the ranges `MemoryRegion::split`
    /// refuses.
    pub fn split(
        mut self,
        ranges: impl IntoIterator<Item = Range<u64>>,
    ) -> std::result::Result<(Vec<Shard<SharedDmaBuf>>, Lent), Box<LentSplitError>> {
        let region = self
            .region
            .take()
            .expect("a checkout holds its region until dropped");
        let len = region.len();
        match shard::split(region, ranges.into_iter().collect(), true) {
            Ok((shards, home)) => {
                let lent = Lent {
                    home,
                    key: self.key,
                    epoch: self.epoch,
                    len,
                    state: self.state.clone(),
                    joined: false,
                };
                // `self` drops without its region: nothing goes back to the cache yet.
                Ok((shards, lent))
            }
            Err(e) => {
                self.region = Some(e.region);
                Err(Box::new(LentSplitError {
                    error: e.error,
                    checkout: self,
                }))
            }
        }
    }
}

impl Lent {
    /// The key the region is cached under.
    pub fn key(&self) -> CacheKey {
        self.key
    }

    /// The checkout back, from every shard of its region (and nothing else): refused while
    /// a shard is elsewhere, or for shards of another region.
    ///
    /// # Errors
    /// A [`LentJoinError`] (boxed) with the shards and this `Lent` back: a shard of another region
    /// (another checkout's, or an uncached region's), none given, or not all of them.
    pub fn join(
        mut self,
        shards: impl IntoIterator<Item = Shard<SharedDmaBuf>>,
    ) -> std::result::Result<Checkout, Box<LentJoinError>> {
        match shard::join_home(&self.home, shards.into_iter().collect()) {
            Ok(region) => {
                self.joined = true;
                Ok(Checkout {
                    region: Some(region),
                    key: self.key,
                    epoch: self.epoch,
                    state: self.state.clone(),
                })
            }
            Err(e) => Err(Box::new(LentJoinError {
                error: e.error,
                lent: self,
                shards: e.shards,
            })),
        }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if self.joined {
            return;
        }
        // The region is no longer the cache's: its shards deregister it when the last one
        // goes.
        let mut st = lock(&self.state);
        st.stats.checked_out -= 1;
        st.stats.entries -= 1;
        st.stats.bytes -= self.len;
    }
}
