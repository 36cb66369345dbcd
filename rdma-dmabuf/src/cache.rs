//! [`RegistrationCache`]: reuse of dma-buf registrations.

use crate::error::{Error, Op, Result};
use crate::mr::{reg_dmabuf, Access, MemoryRegion};
use crate::part::{self, OwnedPart};
use crate::shared_dmabuf::SharedDmaBuf;
use crate::sys::pd::ProtectionDomain;
use drm_export::DmaBuf;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::ops::{Deref, Range};
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

#[cfg(feature = "cuda")]
mod cuda;
mod lent;
pub use lent::{Lent, LentJoinError, LentSplitError};

/// Which memory a cached registration is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BufferKey {
    /// A dma-buf: its file's `(st_dev, st_ino)` ([`DmaBuf::buffer_id`]).
    DmaBuf {
        /// `st_dev`.
        dev: u64,
        /// `st_ino`.
        ino: u64,
    },
    /// A CUDA allocation: its `CU_POINTER_ATTRIBUTE_BUFFER_ID`
    /// (`drm_export::cuda::PointerInfo::buffer_id`), never reused by another allocation.
    Cuda {
        /// The buffer id.
        buffer_id: u64,
    },
}

/// What a cached registration is: the memory, the range and how it is registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The memory.
    pub buffer: BufferKey,
    /// The range's start: the offset in the dma-buf, or for CUDA memory the device address.
    pub offset: u64,
    /// The range's length.
    pub len: u64,
    /// The iova work requests use for the first byte.
    pub iova: u64,
    /// The access granted.
    pub access: Access,
}

/// A cache's bounds: registered bytes and registrations, those checked out included. Past
/// either, the least recently returned regions in the cache are deregistered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Registered bytes at most (pinned memory).
    pub max_bytes: u64,
    /// Registrations at most.
    pub max_entries: usize,
}

impl Default for CacheLimits {
    /// 1 GiB and 1024 registrations.
    fn default() -> Self {
        CacheLimits {
            max_bytes: 1 << 30,
            max_entries: 1024,
        }
    }
}

/// Counters of a cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Checkouts served by a cached registration.
    pub hits: u64,
    /// Checkouts that registered.
    pub misses: u64,
    /// Regions deregistered to stay within the limits.
    pub evictions: u64,
    /// Regions deregistered by [`RegistrationCache::invalidate`] (at once, or when they
    /// came back).
    pub invalidations: u64,
    /// Registrations now, checked out or not.
    pub entries: usize,
    /// Of which checked out.
    pub checked_out: usize,
    /// Registered bytes now.
    pub bytes: u64,
}

type Region = MemoryRegion<SharedDmaBuf>;

struct State {
    limits: CacheLimits,
    /// Regions back in the cache, by key, each with its place in `lru`.
    idle: HashMap<CacheKey, Vec<(u64, Region)>>,
    /// Return order: the first is the least recently used.
    lru: BTreeMap<u64, CacheKey>,
    tick: u64,
    /// Bumped by `invalidate`: a region checked out under an older epoch is not taken back.
    epochs: HashMap<BufferKey, u64>,
    /// The dma-buf of each buffer with cached regions, for adopting further fds of it.
    buffers: HashMap<(u64, u64), Weak<DmaBuf>>,
    stats: CacheStats,
}

impl State {
    /// Takes a cached region of `key`, if one is in.
    fn take(&mut self, key: &CacheKey) -> Option<Region> {
        let list = self.idle.get_mut(key)?;
        let (tick, region) = list.pop()?;
        if list.is_empty() {
            self.idle.remove(key);
        }
        self.lru.remove(&tick);
        self.stats.hits += 1;
        self.stats.checked_out += 1;
        Some(region)
    }

    fn epoch(&self, buffer: BufferKey) -> u64 {
        self.epochs.get(&buffer).copied().unwrap_or(0)
    }

    /// The least recently used regions past the limits, out of the cache (dropped by the
    /// caller, after the lock).
    fn over_limits(&mut self) -> Vec<Region> {
        let mut out = Vec::new();
        while self.stats.bytes > self.limits.max_bytes
            || self.stats.entries > self.limits.max_entries
        {
            let Some((tick, key)) = self.lru.pop_first() else {
                break;
            };
            if let Some(r) = self.remove_idle(&key, tick) {
                self.stats.evictions += 1;
                out.push(r);
            }
        }
        out
    }

    fn remove_idle(&mut self, key: &CacheKey, tick: u64) -> Option<Region> {
        let list = self.idle.get_mut(key)?;
        let at = list.iter().position(|(t, _)| *t == tick)?;
        let (_, r) = list.swap_remove(at);
        if list.is_empty() {
            self.idle.remove(key);
        }
        self.forget(&r);
        Some(r)
    }

    fn forget(&mut self, r: &Region) {
        self.stats.entries -= 1;
        self.stats.bytes -= r.len();
    }
}

/// A cache of dma-buf registrations in one protection domain.
///
/// [`RegistrationCache`]: reuse of dma-buf registrations.
///
/// Services register the same memory over and over (a KV-cache block sent to each new peer,
/// a tensor written every step). A registration costs system calls and page pinning; a cache
/// hit costs a hash lookup. Entries are keyed on a [`CacheKey`]: the buffer's identity (the
/// dma-buf file's device and inode, or a CUDA allocation's buffer id), the offset, length,
/// iova and access.
///
/// Ownership is kept: [`RegistrationCache::checkout_fd`] and its siblings return a
/// [`Checkout`], an owned handle to one registration that no one else holds. It is posted as
/// an [`OwnedPart`] (moved into the request, back with the completion) and returns to the
/// cache when dropped. So a region is never handed out twice, and never deregistered while
/// a request uses it: eviction (least recently used first, when the bounds in bytes or
/// entries are passed) and invalidation only ever deregister regions that are back in the
/// cache. A second checkout of a key whose region is out registers a second region.
///
/// A cache must not hand out a stale registration. A dma-buf's identity names its memory
/// for as long as any fd of it is open, and the cache holds one, so a dma-buf key cannot go
/// stale. Device addresses can: CUDA gives a freed address to the next allocation. Key CUDA
/// memory on its allocation's buffer id ([`BufferKey::Cuda`], from the pointer attributes),
/// which a new allocation never shares, and ask for it again before each checkout.
/// [`RegistrationCache::invalidate`] drops a buffer's entries explicitly (memory you know
/// changed, e.g. remapped), and those checked out are deregistered when they come back.
///
/// The dma-bufs of cached regions are shared between the regions of one buffer and never
/// mapped by the CPU ([`SharedDmaBuf`] has no CPU access): memory in the cache is memory the
/// NIC may use. Locks are taken on checkout and return, never by posts or polls.
///
/// A registration back in the cache keeps the access it was made with: one with remote
/// access stays open to any peer holding its rkey until it is evicted. Before memory you
/// registered with remote access goes to another use (CUDA memory the program keeps and
/// reuses, which the cache cannot see), [`RegistrationCache::invalidate`] its buffer.
pub struct RegistrationCache {
    pd: Arc<ProtectionDomain>,
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for RegistrationCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistrationCache")
            .field("stats", &self.stats())
            .finish()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while locked leaves counters at worst; the maps stay consistent per step.
    state.lock().unwrap_or_else(|p| p.into_inner())
}

impl RegistrationCache {
    /// An empty cache for regions of `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>, limits: CacheLimits) -> RegistrationCache {
        RegistrationCache {
            pd: pd.clone(),
            state: Arc::new(Mutex::new(State {
                limits,
                idle: HashMap::new(),
                lru: BTreeMap::new(),
                tick: 0,
                epochs: HashMap::new(),
                buffers: HashMap::new(),
                stats: CacheStats::default(),
            })),
        }
    }

    /// A registration of `len` bytes from `offset` of the dma-buf behind `fd` (an fd of a
    /// buffer received again, e.g. over a unix socket), with `iova` (default `offset`) and
    /// `access`: a cached one if there is one back in the cache, else a new one. `fd` is
    /// closed on a hit, or when the cache already holds the buffer; otherwise it becomes the
    /// cache's dma-buf for the buffer (checked as [`DmaBuf::try_from`] checks it).
    ///
    /// # Errors
    /// [`Error::Adopt`] wrapping drm-export's refusal when `fd` is not a dma-buf, or when a
    /// live [`DmaBuf`] of this process outside the cache owns the buffer; the registration's
    /// errors ([`MemoryRegion::register_dmabuf`]).
    pub fn checkout_fd(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: u64,
        iova: Option<u64>,
        access: Access,
    ) -> Result<Checkout> {
        let st = nix::sys::stat::fstat(&fd)
            .map_err(|e| Error::from_errno(Op::RegDmabufMr, "fstat of the dma-buf fd", e as i32))?;
        // Both are u64 on Linux x86_64 and aarch64; `as` keeps other layouts compiling.
        #[allow(clippy::unnecessary_cast)]
        let id = (st.st_dev as u64, st.st_ino as u64);
        let key = dmabuf_key(id, offset, len, iova, access);
        if let Some(c) = self.hit(key) {
            return Ok(c);
        }
        let (shared, epoch) = {
            let st = lock(&self.state);
            let shared = st.buffers.get(&id).and_then(Weak::upgrade);
            (shared, st.epoch(key.buffer))
        };
        let shared = match shared {
            Some(s) => s,
            None => Arc::new(DmaBuf::try_from(fd).map_err(|e| Error::Adopt(Box::new(e)))?),
        };
        self.register(key, shared, offset, epoch)
    }

    /// As [`RegistrationCache::checkout_fd`], for a [`DmaBuf`] the caller owns: it becomes
    /// the cache's dma-buf for the buffer, shared by the buffer's cached regions, and is
    /// closed when the last of them is deregistered.
    ///
    /// # Errors
    /// The registration's errors.
    pub fn checkout_dmabuf(
        &self,
        dmabuf: DmaBuf,
        offset: u64,
        len: u64,
        iova: Option<u64>,
        access: Access,
    ) -> Result<Checkout> {
        let id = dmabuf.buffer_id();
        let key = dmabuf_key((id.dev, id.ino), offset, len, iova, access);
        if let Some(c) = self.hit(key) {
            return Ok(c);
        }
        let epoch = lock(&self.state).epoch(key.buffer);
        self.register(key, Arc::new(dmabuf), offset, epoch)
    }

    /// A registration for `key` (a [`BufferKey::DmaBuf`] key), cached or new; on a miss
    /// `export` gives the dma-buf and the offset of the key's range in it. The dma-buf must
    /// be the key's buffer at the key's offset: it is checked, so that a wrong key cannot
    /// file one buffer's registration under another's name.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a [`BufferKey::Cuda`] key (see
    /// [`RegistrationCache::checkout_with_unchecked`]) or a dma-buf that is not the key's;
    /// `export`'s, and the registration's.
    pub fn checkout_with(
        &self,
        key: CacheKey,
        export: impl FnOnce() -> Result<(DmaBuf, u64)>,
    ) -> Result<Checkout> {
        if let BufferKey::Cuda { buffer_id } = key.buffer {
            return Err(Error::invalid(
                Op::RegDmabufMr,
                format!(
                    "the cache cannot check that an export is CUDA buffer {buffer_id}: \
                     use checkout_with_unchecked"
                ),
            ));
        }
        self.miss_with(key, export)
    }

    /// As [`RegistrationCache::checkout_with`], for any key: for CUDA memory,
    /// `CudaDevice::export_range` of the key's device address and length, under
    /// [`BufferKey::Cuda`] with the buffer id that `CudaDevice::pointer_info` gave just
    /// before. A dma-buf key is still checked against the dma-buf.
    ///
    /// # Safety
    /// For a [`BufferKey::Cuda`] key, the dma-buf `export` gives must hold the memory the
    /// key names (that allocation, from the key's offset, for the key's length): the cache
    /// cannot check it, and a registration filed under another buffer's key would be handed
    /// out for that buffer, so that transfers would move the wrong memory while reporting
    /// success. A buffer id names one allocation, so the range must lie inside it: not a
    /// range that `CudaDevice::export_range` exports across the seams of several
    /// `cuMemMap`ped allocations, where remapping one of the others would go unseen (cache
    /// each allocation's part under its own key instead).
    ///
    /// # Errors
    /// As [`RegistrationCache::checkout_with`], but for the CUDA key.
    #[allow(unsafe_code)] // a promise the caller makes; no unsafe operation inside
    pub unsafe fn checkout_with_unchecked(
        &self,
        key: CacheKey,
        export: impl FnOnce() -> Result<(DmaBuf, u64)>,
    ) -> Result<Checkout> {
        self.miss_with(key, export)
    }

    fn miss_with(
        &self,
        key: CacheKey,
        export: impl FnOnce() -> Result<(DmaBuf, u64)>,
    ) -> Result<Checkout> {
        if let Some(c) = self.hit(key) {
            return Ok(c);
        }
        // The epoch before the export: an `invalidate` during the export or the
        // registration makes this region one not to be taken back.
        let epoch = lock(&self.state).epoch(key.buffer);
        let (dmabuf, offset) = export()?;
        self.register(key, Arc::new(dmabuf), offset, epoch)
    }

    fn hit(&self, key: CacheKey) -> Option<Checkout> {
        let mut st = lock(&self.state);
        let region = st.take(&key)?;
        let epoch = st.epoch(key.buffer);
        Some(self.checkout(key, region, epoch))
    }

    /// Registers `dmabuf` from `offset` for `key`; `epoch` is the key's buffer's epoch from
    /// before the dma-buf was obtained.
    fn register(
        &self,
        key: CacheKey,
        dmabuf: Arc<DmaBuf>,
        offset: u64,
        epoch: u64,
    ) -> Result<Checkout> {
        if let BufferKey::DmaBuf { dev, ino } = key.buffer {
            let id = dmabuf.buffer_id();
            if (id.dev, id.ino) != (dev, ino) || offset != key.offset {
                let (d, i) = (id.dev, id.ino);
                return Err(Error::invalid(
                    Op::RegDmabufMr,
                    format!(
                        "the key names dma-buf ({dev}, {ino}) at offset {}, the export is \
                         ({d}, {i}) at offset {offset}",
                        key.offset
                    ),
                ));
            }
        }
        // Registered without the lock: other threads' hits go on meanwhile.
        let reg = reg_dmabuf(
            &self.pd,
            SharedDmaBuf::from_arc(dmabuf.clone()),
            SharedDmaBuf::dmabuf,
            offset,
            key.len,
            Some(key.iova),
            key.access,
        )?;
        let region = MemoryRegion::from_registration(reg);
        let mut st = lock(&self.state);
        if let BufferKey::DmaBuf { dev, ino } = key.buffer {
            st.buffers.retain(|_, b| b.strong_count() > 0);
            st.buffers.insert((dev, ino), Arc::downgrade(&dmabuf));
        }
        st.stats.misses += 1;
        st.stats.entries += 1;
        st.stats.checked_out += 1;
        st.stats.bytes += key.len;
        Ok(self.checkout(key, region, epoch))
    }

    fn checkout(&self, key: CacheKey, region: Region, epoch: u64) -> Checkout {
        Checkout {
            region: Some(region),
            key,
            epoch,
            state: self.state.clone(),
        }
    }

    /// Deregisters `buffer`'s regions that are in the cache, and marks those checked out to
    /// be deregistered when they come back. Returns how many were deregistered now.
    pub fn invalidate(&self, buffer: BufferKey) -> usize {
        let gone = {
            let mut st = lock(&self.state);
            *st.epochs.entry(buffer).or_insert(0) += 1;
            let keys: Vec<CacheKey> = st
                .idle
                .keys()
                .filter(|k| k.buffer == buffer)
                .copied()
                .collect();
            let mut gone = Vec::new();
            for k in keys {
                for (tick, r) in st.idle.remove(&k).unwrap_or_default() {
                    st.lru.remove(&tick);
                    st.forget(&r);
                    gone.push(r);
                }
            }
            st.stats.invalidations += gone.len() as u64;
            gone
        };
        gone.len()
    }

    /// Deregisters every region in the cache (those checked out stay with their holders and
    /// come back as usual).
    pub fn clear(&self) {
        let gone: Vec<Region> = {
            let mut st = lock(&self.state);
            st.lru.clear();
            let all: Vec<_> = st.idle.drain().flat_map(|(_, v)| v).collect();
            for (_, r) in &all {
                st.forget(r);
            }
            all.into_iter().map(|(_, r)| r).collect()
        };
        drop(gone);
    }

    /// The counters.
    pub fn stats(&self) -> CacheStats {
        lock(&self.state).stats
    }
}

fn dmabuf_key(
    id: (u64, u64),
    offset: u64,
    len: u64,
    iova: Option<u64>,
    access: Access,
) -> CacheKey {
    CacheKey {
        buffer: BufferKey::DmaBuf {
            dev: id.0,
            ino: id.1,
        },
        offset,
        len,
        iova: iova.unwrap_or(offset),
        access,
    }
}

/// One cached registration, held by its user alone; back to the cache when dropped.
///
/// Post it as an [`OwnedPart`] (`post_write_parts([checkout], ..)` and the rest): it is
/// moved into the request and handed back with the completion. Shared access to the region
/// (keys, address, [`MemoryRegion::remote`], parts for scoped posts) through `Deref`.
pub struct Checkout {
    /// `Some` until dropped.
    region: Option<Region>,
    key: CacheKey,
    epoch: u64,
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for Checkout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkout")
            .field("key", &self.key)
            .field("region", &self.region)
            .finish()
    }
}

impl Checkout {
    /// The key it is cached under.
    pub fn key(&self) -> CacheKey {
        self.key
    }
}

impl Deref for Checkout {
    type Target = MemoryRegion<SharedDmaBuf>;
    fn deref(&self) -> &Self::Target {
        self.region
            .as_ref()
            .expect("a checkout holds its region until dropped")
    }
}

impl part::sealed::Sealed for Checkout {}
impl part::ExclusivePart for Checkout {}
impl OwnedPart for Checkout {
    type Backing = SharedDmaBuf;
    fn lent(&self, _: part::sealed::Token) -> (&MemoryRegion<SharedDmaBuf>, Range<u64>) {
        (self, 0..self.len())
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(region) = self.region.take() else {
            return;
        };
        // Regions to deregister are dropped after the lock is released.
        let _gone: Vec<Region> = {
            let mut st = lock(&self.state);
            st.stats.checked_out -= 1;
            if st.epoch(self.key.buffer) != self.epoch {
                st.forget(&region);
                st.stats.invalidations += 1;
                vec![region]
            } else {
                st.tick += 1;
                let tick = st.tick;
                st.lru.insert(tick, self.key);
                st.idle.entry(self.key).or_default().push((tick, region));
                st.over_limits()
            }
        };
    }
}
