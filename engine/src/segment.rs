//! Segments: named registered memory, and the table that lends them to transfers.
//!
//! A segment's region is in the table ("home"), lent whole to the worker of one batch, or
//! shared by the workers of batches that only read it (RDMA writes from it:
//! [`crate::sources`]); while any accepted transfer uses a segment, `users` counts it and
//! unregistering is refused. The
//! engine gives the CPU no access to a segment's memory: it comes back only through
//! [`Agent::unregister`](crate::Agent::unregister), which deregisters it first.

use crate::descriptor::{DeviceRegion, SegmentDescriptor};
use crate::devices::Device;
use crate::error::{Error, Result};
use crate::metadata::lock;
use crate::sources::{self, Sources};
use drm_export::cuda::CudaDevice;
use gpu_rdma_topology::Near;
use rdma_dmabuf::{
    Access, Backing, Checkout, DmaBuf, HostBuffer, MemoryRegion, SharedDmaBuf, SharedHostBuffer,
};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Memory to register as a segment, and what unregistering hands back.
#[derive(Debug)]
pub enum Memory {
    /// A dma-buf from any exporter (GPU buffer, udmabuf, dma-heap, CUDA range).
    DmaBuf(DmaBuf),
    /// Page-aligned host memory.
    Host(HostBuffer),
    /// `[ptr, ptr + len)` of CUDA device memory the program has (a tensor, a slice of a
    /// pool), inside one allocation of `device`: registered through each device's
    /// registration cache, so that registering it again after
    /// [`Agent::unregister`](crate::Agent::unregister) reuses the registrations (see
    /// [`Agent::register_cuda`](crate::Agent::register_cuda)). Unregistering hands the same
    /// description back: the memory stays the CUDA allocator's throughout.
    Cuda {
        /// The GPU whose memory it is.
        device: Arc<CudaDevice>,
        /// The device address of the first byte (peers address the segment by it).
        ptr: u64,
        /// The length in bytes.
        len: u64,
    },
}

impl From<DmaBuf> for Memory {
    fn from(d: DmaBuf) -> Memory {
        Memory::DmaBuf(d)
    }
}

impl From<HostBuffer> for Memory {
    fn from(h: HostBuffer) -> Memory {
        Memory::Host(h)
    }
}

/// A registered segment's regions, by device index.
///
/// A dma-buf or host buffer is shared ([`SharedDmaBuf`], [`SharedHostBuffer`]: no CPU
/// access while registered) and registered in every device's protection domain, one
/// region each. A slot is `None` only while its region is lent to `exec::run`.
#[derive(Debug)]
pub(crate) enum Region {
    DmaBuf(Vec<Option<MemoryRegion<SharedDmaBuf>>>),
    Host(Vec<Option<MemoryRegion<SharedHostBuffer>>>),
    /// A CUDA range: one checkout of each device's registration cache, back to the caches
    /// when unregistered.
    Cuda {
        device: Arc<CudaDevice>,
        ptr: u64,
        len: u64,
        regions: Vec<Option<Checkout>>,
    },
}

/// Every access a segment is registered with: peers read and write it.
const ACCESS: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);

impl Region {
    /// Registers `memory` whole on every one of `devices`. On failure the regions made so
    /// far are deregistered and dropped (and the memory with them).
    pub fn register(devices: &[Device], memory: Memory) -> Result<Region> {
        let fail = |e: rdma_dmabuf::Error| Error::rdma("register a segment", &e);
        Ok(match memory {
            Memory::DmaBuf(d) => {
                let len = d.size();
                let shared = SharedDmaBuf::new(d);
                let mut regions = Vec::with_capacity(devices.len());
                for device in devices {
                    regions.push(Some(
                        MemoryRegion::register_shared_dmabuf(
                            &device.pd, &shared, 0, len, None, ACCESS,
                        )
                        .map_err(fail)?,
                    ));
                }
                Region::DmaBuf(regions)
            }
            Memory::Host(h) => {
                let shared = SharedHostBuffer::new(h);
                let mut regions = Vec::with_capacity(devices.len());
                for device in devices {
                    regions.push(Some(
                        MemoryRegion::register_shared_host(&device.pd, &shared, ACCESS)
                            .map_err(fail)?,
                    ));
                }
                Region::Host(regions)
            }
            Memory::Cuda { device, ptr, len } => {
                let mut regions = Vec::with_capacity(devices.len());
                for d in devices {
                    let c = d.cache.checkout_cuda(&device, ptr, len, ACCESS);
                    regions.push(Some(c.map_err(|e| cuda_error(ptr, len, e))?));
                }
                Region::Cuda {
                    device,
                    ptr,
                    len,
                    regions,
                }
            }
        })
    }

    /// (device index, addr, len, rkey) of every region.
    fn remotes(&self) -> Vec<(u16, u64, u64, u32)> {
        let rows = |i: usize, addr, len, rkey| (i as u16, addr, len, rkey);
        fn of<B: Backing>(rs: &[Option<MemoryRegion<B>>]) -> Vec<(u16, u64, u64, u32)> {
            rs.iter()
                .enumerate()
                .filter_map(|(i, r)| r.as_ref().map(|r| (i as u16, r.addr(), r.len(), r.rkey())))
                .collect()
        }
        match self {
            Region::DmaBuf(rs) => of(rs),
            Region::Host(rs) => of(rs),
            Region::Cuda { regions, .. } => regions
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.as_ref().map(|r| rows(i, r.addr(), r.len(), r.rkey())))
                .collect(),
        }
    }

    /// The address of the memory's first byte in this process, for memory that has one: a
    /// host buffer's virtual address (its regions' iova), a CUDA range's device pointer.
    fn base(&self) -> Option<u64> {
        match self {
            Region::DmaBuf(_) => None,
            Region::Host(rs) => rs.iter().flatten().next().map(MemoryRegion::addr),
            Region::Cuda { ptr, .. } => Some(*ptr),
        }
    }

    /// Shares it for NIC reads ([`crate::sources`]); a CUDA segment's back (lent whole
    /// instead).
    pub fn share(self) -> std::result::Result<Sources, Region> {
        match self {
            Region::DmaBuf(rs) => Ok(Sources::DmaBuf(sources::share(rs))),
            Region::Host(rs) => Ok(Sources::Host(sources::share(rs))),
            cuda @ Region::Cuda { .. } => Err(cuda),
        }
    }

    /// The regions of `sources` again, once no lease is out; `None` if one still is (never
    /// expected: every lease comes back with its completion), when the segment is lost.
    fn unshare(sources: Sources) -> Option<Region> {
        match sources {
            Sources::DmaBuf(ss) => sources::back(ss).map(Region::DmaBuf),
            Sources::Host(ss) => sources::back(ss).map(Region::Host),
        }
    }

    /// Whether it has a region on device `device` (at home, not lent).
    pub fn has_device(&self, device: usize) -> bool {
        match self {
            Region::DmaBuf(rs) => rs.get(device).is_some_and(Option::is_some),
            Region::Host(rs) => rs.get(device).is_some_and(Option::is_some),
            Region::Cuda { regions, .. } => regions.get(device).is_some_and(Option::is_some),
        }
    }

    /// Marks a CUDA segment's registrations to be deregistered as they go back to the
    /// caches (every cached registration of the same allocations with them), so that no
    /// peer reaches the memory after `unregister`; nothing for other segments.
    pub fn evict_cached(&self, devices: &[Device]) {
        if let Region::Cuda { regions, .. } = self {
            for (c, d) in regions.iter().zip(devices) {
                if let Some(c) = c {
                    d.cache.invalidate(c.key().buffer);
                }
            }
        }
    }

    /// Whether every region is home (none lent, none lost).
    pub fn whole(&self) -> bool {
        match self {
            Region::DmaBuf(rs) => rs.iter().all(Option::is_some),
            Region::Host(rs) => rs.iter().all(Option::is_some),
            Region::Cuda { regions, .. } => regions.iter().all(Option::is_some),
        }
    }

    /// Deregisters every region; the memory back. A dma-buf or host buffer comes back once
    /// its last region is deregistered; if some handle still held it, that is a bug,
    /// reported as [`Error::Protocol`] rather than leaked silently.
    pub fn into_memory(self) -> Result<Memory> {
        let missing = || Error::Protocol("a segment's region was lost".into());
        let held = |what: &str, holders: usize| {
            Error::Protocol(format!(
                "a deregistered {what} segment is still held ({holders} handles)"
            ))
        };
        match self {
            Region::DmaBuf(rs) => deregister_all(rs)?
                .try_into_inner()
                .map(Memory::DmaBuf)
                .map_err(|s| held("dma-buf", s.holders())),
            Region::Host(rs) => deregister_all(rs)?
                .try_into_inner()
                .map(Memory::Host)
                .map_err(|s| held("host", s.holders())),
            Region::Cuda {
                device,
                ptr,
                len,
                regions,
            } => {
                // Each checkout goes back to its device's cache as it drops.
                let lost = regions.iter().any(Option::is_none);
                drop(regions);
                if lost {
                    return Err(missing());
                }
                Ok(Memory::Cuda { device, ptr, len })
            }
        }
    }
}

/// Deregisters every region of one shared backing; a handle of the backing back (the last
/// one, once every region is gone), or the first failure.
fn deregister_all<B: Backing>(rs: Vec<Option<MemoryRegion<B>>>) -> Result<B> {
    let mut back = None;
    let mut first_err = None;
    for r in rs {
        match r.map(MemoryRegion::into_inner) {
            Some(Ok(b)) => back = Some(b),
            Some(Err(e)) => {
                first_err.get_or_insert(Error::rdma("deregister a segment", &e));
            }
            None => {
                first_err
                    .get_or_insert_with(|| Error::Protocol("a segment's region was lost".into()));
            }
        }
    }
    match (first_err, back) {
        (Some(e), _) => Err(e),
        (None, Some(b)) => Ok(b),
        (None, None) => Err(Error::Protocol("a segment without regions".into())),
    }
}

/// A CUDA segment's registration error: [`Error::CudaRange`] for memory that cannot be one
/// (not the device's, freed, past one allocation), [`Error::Rdma`] otherwise.
fn cuda_error(ptr: u64, len: u64, e: rdma_dmabuf::Error) -> Error {
    let refused = match &e {
        rdma_dmabuf::Error::CudaRangeNotOneAllocation { .. } => true,
        rdma_dmabuf::Error::Export(x) => matches!(**x, drm_export::Error::CudaPointer { .. }),
        _ => false,
    };
    if refused {
        Error::CudaRange {
            ptr,
            len,
            why: e.to_string(),
        }
    } else {
        Error::rdma("register a CUDA segment", &e)
    }
}

/// Where a registered segment's memory is, as far as it tells: a CUDA range at its GPU's PCI
/// address, host memory on the NUMA node of its first page, a dma-buf unknown (its exporter
/// is not named: [`Agent::register_near`](crate::Agent::register_near)). A query that fails
/// leaves the place unknown.
pub(crate) fn near(region: &Region) -> Near {
    match region {
        Region::Cuda { device, .. } => device.pci_address().map_or(Near::Unknown, Near::Pci),
        Region::Host(rs) => rs
            .iter()
            .flatten()
            .next()
            .and_then(|r| gpu_rdma_topology::memory_numa_node(r.addr() as usize).ok())
            .flatten()
            .map_or(Near::Unknown, Near::Numa),
        Region::DmaBuf(_) => Near::Unknown,
    }
}

/// The descriptor of `region`, registered as `name` on `devices` (by index), each device's
/// region with its tier (`tiers`, by device index).
pub(crate) fn describe(
    name: &str,
    devices: &[Device],
    region: &Region,
    tiers: &[u8],
) -> SegmentDescriptor {
    let remotes = region.remotes();
    SegmentDescriptor {
        name: name.into(),
        len: remotes.first().map_or(0, |r| r.2),
        base: region.base(),
        remote_read: true,
        remote_write: true,
        regions: remotes
            .into_iter()
            .map(|(index, addr, _, rkey)| {
                let device = &devices[usize::from(index)];
                DeviceRegion {
                    device: index,
                    device_name: device.name.clone(),
                    gid: device.gid,
                    addr,
                    rkey,
                    tier: tiers.get(usize::from(index)).copied().unwrap_or(0),
                }
            })
            .collect(),
    }
}

/// One segment.
pub(crate) struct Slot {
    pub desc: SegmentDescriptor,
    state: State,
    /// Accepted transfers that use it and have not finished.
    pub users: usize,
    /// Workers waiting to take it whole: batches that would only read it wait behind them,
    /// so that a stream of readers does not keep a writer out.
    whole_waiting: usize,
}

/// Where a segment's regions are.
enum State {
    /// In the table.
    Home(Region),
    /// Lent whole to one worker.
    Lent,
    /// Shared for NIC reads with `readers` workers.
    Shared(Arc<Sources>, usize),
    /// Lost: a region a worker could not join again, or a lease that never came back
    /// (neither expected).
    Lost,
}

/// A segment's regions as lent to a worker for one round of one segment of its batch.
pub(crate) enum Lending {
    /// Whole, to this worker alone: for chunks the NIC writes into the segment (RDMA
    /// reads), and for a CUDA segment.
    Whole(Region),
    /// Shared with other workers' batches that only read it.
    Shared(Arc<Sources>),
}

/// The agent's segments, by name, and the condition a worker waits on for a lent one.
#[derive(Default)]
pub(crate) struct Segments(Mutex<HashMap<String, Slot>>, Condvar);

impl Segments {
    pub fn lock(&self) -> MutexGuard<'_, HashMap<String, Slot>> {
        lock(&self.0)
    }

    /// Adds a segment.
    pub fn insert(
        &self,
        desc: SegmentDescriptor,
        region: Region,
    ) -> std::result::Result<(), (Error, Region)> {
        let mut t = self.lock();
        if t.contains_key(&desc.name) {
            return Err((Error::SegmentExists(desc.name), region));
        }
        let slot = Slot {
            desc,
            state: State::Home(region),
            users: 0,
            whole_waiting: 0,
        };
        t.insert(slot.desc.name.clone(), slot);
        Ok(())
    }

    /// Removes a segment no transfer uses; its region back. A segment whose regions were
    /// lost (never expected) is removed too, with [`Error::Protocol`], so that its name and
    /// its place in the descriptor do not stay taken.
    pub fn remove(&self, agent: &str, name: &str) -> Result<Region> {
        let mut t = self.lock();
        let slot = t.get(name).ok_or_else(|| Error::UnknownSegment {
            agent: agent.into(),
            segment: name.into(),
        })?;
        if slot.users == 0 && matches!(slot.state, State::Lost) {
            t.remove(name);
            return Err(Error::Protocol(format!(
                "segment {name}'s regions were lost (not joined again after a failure): it \
                 is removed, deregistered; its memory cannot be handed back"
            )));
        }
        if slot.users > 0 || !matches!(slot.state, State::Home(_)) {
            return Err(Error::SegmentBusy {
                segment: name.into(),
                users: slot.users,
            });
        }
        match t.remove(name).map(|slot| slot.state) {
            Some(State::Home(region)) => Ok(region),
            _ => Err(Error::Protocol("a segment left the table meanwhile".into())),
        }
    }

    /// Lends a segment's regions to a worker for one round of one segment of its batch:
    /// shared with other such workers when the round only reads it (`reads_only`: RDMA
    /// writes from it) and it is not a CUDA segment, whole otherwise. Waits while another
    /// worker has it whole, or, to take it whole, while any has it (each for one round,
    /// which the queue pairs' retry budget bounds). `None` if the segment is gone or lost
    /// (neither expected: the batch counts as a user of the segment, and every shard and
    /// lease comes back with its completion).
    pub fn take(&self, name: &str, reads_only: bool) -> Option<Lending> {
        let mut t = self.lock();
        let mut waiting = false;
        loop {
            let slot = t.get_mut(name)?;
            match std::mem::replace(&mut slot.state, State::Lent) {
                // A round that would only read it waits behind one waiting to take it whole,
                // so that readers following one another do not keep it out.
                State::Home(region) if reads_only && slot.whole_waiting > 0 => {
                    slot.state = State::Home(region);
                }
                State::Home(region) => {
                    slot.whole_waiting -= usize::from(waiting);
                    if !reads_only {
                        return Some(Lending::Whole(region));
                    }
                    return Some(match region.share() {
                        Ok(sources) => {
                            let sources = Arc::new(sources);
                            slot.state = State::Shared(Arc::clone(&sources), 1);
                            Lending::Shared(sources)
                        }
                        Err(cuda) => Lending::Whole(cuda),
                    });
                }
                State::Shared(sources, readers) if reads_only && slot.whole_waiting == 0 => {
                    slot.state = State::Shared(Arc::clone(&sources), readers + 1);
                    return Some(Lending::Shared(sources));
                }
                State::Lost => {
                    slot.state = State::Lost;
                    slot.whole_waiting -= usize::from(waiting);
                    return None;
                }
                other => {
                    slot.state = other;
                    if !reads_only && !waiting {
                        slot.whole_waiting += 1;
                        waiting = true;
                    }
                }
            }
            t = self
                .1
                .wait(t)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Takes a region lent whole back (`None`: the worker lost it) and wakes the waiters.
    pub fn put_back(&self, name: &str, region: Option<Region>) {
        if let Some(slot) = self.lock().get_mut(name) {
            slot.state = region.map_or(State::Lost, State::Home);
        }
        self.1.notify_all();
    }

    /// Takes a shared lending back: the last worker to give it back turns it into the
    /// segment's regions again, and wakes the waiters.
    pub fn give_back(&self, name: &str, sources: Arc<Sources>) {
        let mut t = self.lock();
        drop(sources);
        let Some(slot) = t.get_mut(name) else { return };
        slot.state = match std::mem::replace(&mut slot.state, State::Lost) {
            State::Shared(sources, 1) => Arc::try_unwrap(sources)
                .ok()
                .and_then(Region::unshare)
                .map_or(State::Lost, State::Home),
            State::Shared(sources, readers) => State::Shared(sources, readers - 1),
            other => other,
        };
        drop(t);
        self.1.notify_all();
    }

    /// One transfer fewer uses `name`.
    pub fn release(&self, name: &str) {
        if let Some(slot) = self.lock().get_mut(name) {
            slot.users = slot.users.saturating_sub(1);
        }
    }

    /// Every segment's descriptor.
    pub fn descriptors(&self) -> Vec<SegmentDescriptor> {
        let mut d: Vec<_> = self.lock().values().map(|s| s.desc.clone()).collect();
        d.sort_by(|a, b| a.name.cmp(&b.name));
        d
    }
}
