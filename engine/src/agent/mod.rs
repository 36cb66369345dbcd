//! [`Agent`]: one per process; owns the RDMA devices it uses, its segments, its
//! connections to peers, and the control listener.

mod observe;
mod peers;

use crate::address::resolve;
use crate::auth::{Auth, Credentials, INSECURE_ENV};
use crate::batch::{Batch, Notification};
use crate::descriptor::{AgentDescriptor, SegmentDescriptor};
use crate::devices;
use crate::error::{Error, Result, Side};
use crate::inbox::Inbox;
use crate::limits::Counters;
use crate::metadata::{Dialer, EmbeddedMetadata, MetadataService};
use crate::metrics::endpoint::Endpoint;
use crate::metrics::{prometheus, Recorder};
use crate::notifier::Notifier;
use crate::peer_pool::PeerPool;
use crate::plan::plan;
use crate::progress::{Progress, Transfer};
use crate::segment::{self, describe, Memory, Region, Segments};
use crate::server::Server;
use crate::settings::Settings;
use crate::shared::Shared;
use crate::worker::{self, Job};
use gpu_rdma_topology::{Near, Ranked};
use rdma_dmabuf::CacheStats;
use std::hash::{BuildHasher, Hasher};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A transfer engine's agent. See the crate's documentation.
pub struct Agent {
    pub(crate) shared: Arc<Shared>,
    pub(crate) embedded: Arc<EmbeddedMetadata>,
    jobs: Option<Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    server: Option<Server>,
    pub(crate) notifier: Notifier,
    /// The Prometheus endpoint, when asked for.
    endpoint: Option<Endpoint>,
    /// The number the next batch gets (in traces).
    batches: AtomicU64,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.shared.name)
            .field(
                "incarnation",
                &format_args!("{:#x}", self.shared.incarnation),
            )
            .field("address", &self.address())
            .finish()
    }
}

/// A random 64-bit number (std's per-instance random hasher keys, the time and the pid).
fn random_u64() -> u64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

impl Agent {
    /// Opens the devices of `settings` (default: every device with an active port), one
    /// protection domain each, binds the control listener and starts the worker.
    ///
    /// The NIC override is [`Settings::nics`] or, when that is `None`, the environment
    /// variable `GPU_RDMA_NICS`, read here once.
    ///
    /// # Errors
    /// [`Error::Settings`] for a `name` that is empty, holds control characters (a newline,
    /// NUL) or is longer than 255 bytes (it names the agent's threads and its keys in the
    /// metadata service), and for settings out of range (a `GPU_RDMA_NICS` that does not
    /// parse among them), [`Error::NoDevice`], [`Error::Io`] when the listener cannot bind.
    pub fn new(name: &str, settings: Settings) -> Result<Agent> {
        Agent::start(name, settings, None)
    }

    /// As [`Agent::new`], with `metadata` as the agent's metadata service instead of the
    /// embedded one ([`Agent::add_peer`] then only names peers to the embedded one, which
    /// goes unused).
    ///
    /// # Errors
    /// As [`Agent::new`].
    pub fn with_metadata(
        name: &str,
        settings: Settings,
        metadata: Arc<dyn MetadataService>,
    ) -> Result<Agent> {
        Agent::start(name, settings, Some(metadata))
    }

    fn start(
        name: &str,
        mut settings: Settings,
        metadata: Option<Arc<dyn MetadataService>>,
    ) -> Result<Agent> {
        // First: the name goes into thread names (a NUL would panic there) and keys.
        crate::names::check_agent_name(name)?;
        if settings.chunk_size == 0 || settings.in_flight == 0 {
            return Err(Error::Settings(
                "chunk_size and in_flight must be above 0".into(),
            ));
        }
        // An unusable RDMA_DMABUF_* retry variable fails here, typed, not at the first
        // transfer's connection.
        settings
            .resolved_retry()
            .map_err(|e| Error::rdma("read the transport retry settings", &e))?;
        if settings.queue_pairs == 0 || settings.workers == 0 {
            return Err(Error::Settings(
                "queue_pairs and workers must be above 0".into(),
            ));
        }
        // The NIC override is read once: a bad GPU_RDMA_NICS fails here, typed.
        settings.nics = settings.resolved_nics()?;
        // Authentication first of what touches the outside: no key, no listener.
        settings.auth = settings.auth.resolve()?;
        let creds = Arc::new(Credentials::load(&settings.auth, Some(name))?);
        if let Some(field) = settings.limits.zero_field() {
            return Err(Error::Settings(format!("limits.{field} must be above 0")));
        }
        let devices = devices::open(settings.devices.as_deref(), settings.cache_limits)?;
        let listener =
            TcpListener::bind(settings.bind).map_err(|e| Error::io("bind", settings.bind, e))?;
        let dialer = Dialer {
            me: name.into(),
            creds,
            timeout: settings.io_timeout,
        };
        let embedded = Arc::new(EmbeddedMetadata::with_dialer(dialer.clone()));
        let inbox = Inbox::new(
            settings.limits.notifications_per_sender,
            settings.limits.notifications,
        );
        let shared = Arc::new(Shared {
            name: name.into(),
            incarnation: random_u64(),
            weights: devices::weights(&devices),
            devices,
            segments: Segments::default(),
            metadata: metadata.unwrap_or_else(|| embedded.clone()),
            dialer,
            peers: Mutex::default(),
            inbox,
            counters: Counters::default(),
            metrics: Arc::new(Recorder::new(settings.metrics)),
            settings,
        });
        let server = Server::start(shared.clone(), listener)?;
        if shared.settings.auth == Auth::InsecureNoAuthentication {
            eprintln!(
                "WARNING: gpu-rdma agent {name:?}: authentication is OFF \
                 (Auth::InsecureNoAuthentication, {INSECURE_ENV}=1): anyone who reaches {} can \
                 read and write every byte of every segment it registers. Use a cluster key \
                 (docs/engine.md, \"Security\").",
                server.addr()
            );
        }
        let endpoint = match shared.settings.metrics_address {
            Some(addr) => {
                // Weak: the endpoint never keeps the agent's segments registered.
                let (s, gauges) = (Arc::downgrade(&shared), server.gauges_reader());
                let scrape = move || {
                    let s = s.upgrade()?;
                    Some(prometheus::render(&s.name, observe::snapshot(&s, gauges())))
                };
                let kind = prometheus::CONTENT_TYPE;
                Some(Endpoint::start(name, addr, kind, scrape)?)
            }
            None => None,
        };
        let (jobs, rx) = channel();
        let rx = Arc::new(Mutex::new(rx));
        let mut agent = Agent {
            shared,
            embedded,
            jobs: Some(jobs),
            workers: Vec::new(),
            server: Some(server),
            notifier: Notifier::default(),
            endpoint,
            batches: AtomicU64::new(0),
        };
        // The connections to peers no batch uses now, shared by the workers.
        let idle = Arc::new(PeerPool::default());
        for k in 0..agent.shared.settings.workers {
            let (s, rx, idle) = (agent.shared.clone(), rx.clone(), idle.clone());
            let w = std::thread::Builder::new()
                .name(format!("{name}-worker{k}"))
                .spawn(move || worker::run(&s, &rx, &idle))
                .map_err(|e| Error::io("start a worker thread of", name, e))?;
            agent.workers.push(w);
        }
        Ok(agent)
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// This start's incarnation: random, different for every [`Agent::new`].
    pub fn incarnation(&self) -> u64 {
        self.shared.incarnation
    }

    /// The control listener's address (peers pass it to [`Agent::add_peer`]).
    pub fn address(&self) -> SocketAddr {
        self.server
            .as_ref()
            .map_or(self.shared.settings.bind, Server::addr)
    }

    /// The devices in use, in the order descriptors number them.
    pub fn devices(&self) -> Vec<String> {
        self.shared.devices.iter().map(|d| d.name.clone()).collect()
    }

    /// This agent's descriptor as peers get it.
    pub fn descriptor(&self) -> AgentDescriptor {
        self.shared.descriptor()
    }

    /// Registers `memory` (a [`DmaBuf`](rdma_dmabuf::DmaBuf), a
    /// [`HostBuffer`](rdma_dmabuf::HostBuffer), or a CUDA range, [`Memory::Cuda`]) whole as
    /// segment `name`, readable and writable by peers, and publishes it. It is registered on
    /// every device of the agent (one region each, all in the descriptor; a CUDA range
    /// through the devices' registration caches, see [`Agent::register_cuda`]); a dma-buf
    /// or host buffer is shared between its regions with no CPU access until
    /// [`Agent::unregister`] hands it back. Each region carries its device's tier for where
    /// the memory is (a CUDA range: its GPU's PCI address; host memory: the NUMA node of its
    /// first page; a dma-buf: unknown, so tier 0 on every device unless the NIC override has
    /// a `*` rule: [`Agent::register_near`] names its place).
    ///
    /// # Errors
    /// [`Error::Settings`] for an empty name or one with control characters (it becomes a
    /// key of the metadata service); [`Error::SegmentExists`] (the memory is dropped),
    /// [`Error::CudaRange`] for CUDA memory that cannot be a segment, [`Error::Rdma`] for the
    /// registration; the metadata service's error when it cannot publish the segment: the
    /// segment is then deregistered again and its memory dropped (a CUDA range's
    /// registrations evicted), so no peer can reach it (unless a transfer of this agent
    /// already uses it, when it stays registered: unregister it).
    pub fn register(&self, name: &str, memory: impl Into<Memory>) -> Result<SegmentDescriptor> {
        self.register_at(name, memory.into(), None)
    }

    /// As [`Agent::register`], with the memory's place given: each device's region gets its
    /// tier for memory at `near` ([`Agent::nic_ranking`]) instead of for the place
    /// `register` finds (a CUDA range: its GPU's PCI address; host memory: the NUMA node of
    /// its first page; a dma-buf: unknown, every device tier 0). Pass a dma-buf's exporting
    /// device, e.g. `Near::Pci(drm_device.pci_address()?)`
    /// ([`DrmDevice::pci_address`](drm_export::DrmDevice::pci_address)).
    ///
    /// # Errors
    /// As [`Agent::register`].
    pub fn register_near(
        &self,
        name: &str,
        memory: impl Into<Memory>,
        near: Near,
    ) -> Result<SegmentDescriptor> {
        self.register_at(name, memory.into(), Some(near))
    }

    /// The devices in use ranked for memory at `near`, nearest first, after the NIC
    /// override ([`Settings::nics`] or `GPU_RDMA_NICS`): each with its index in
    /// [`Agent::devices`], its tier (0 the nearest: the devices a segment there stripes its
    /// transfers over) and the reason. The tiers [`Agent::register_near`] gives a segment's
    /// regions.
    pub fn nic_ranking(&self, near: &Near) -> Vec<Ranked> {
        devices::rank(
            &self.shared.devices,
            near,
            self.shared.settings.nics.as_ref(),
        )
    }

    fn register_at(
        &self,
        name: &str,
        memory: Memory,
        near: Option<Near>,
    ) -> Result<SegmentDescriptor> {
        crate::names::check_name(name)?;
        if self.shared.segments.lock().contains_key(name) {
            return Err(Error::SegmentExists(name.into()));
        }
        let devices = &self.shared.devices;
        let region = Region::register(devices, memory)?;
        let near = near.unwrap_or_else(|| segment::near(&region));
        let tiers = devices::tiers(devices, &near, self.shared.settings.nics.as_ref());
        let desc = describe(name, devices, &region, &tiers);
        if let Err((e, region)) = self.shared.segments.insert(desc.clone(), region) {
            let _ = self.release(region);
            return Err(e);
        }
        if let Err(e) = self.publish() {
            if let Ok(region) = self.shared.segments.remove(&self.shared.name, name) {
                let _ = self.release(region);
            }
            tracing::warn!(agent = %self.shared.name, segment = name, error = %e, "registration undone: not published");
            return Err(e);
        }
        tracing::info!(
            agent = %self.shared.name,
            segment = name,
            len = desc.len,
            regions = desc.regions.len(),
            "segment registered",
        );
        Ok(desc)
    }

    /// Registers `[ptr, ptr + len)` of `device`'s memory as segment `name` on every device
    /// of the agent, through each device's registration cache
    /// ([`RegistrationCache::checkout_cuda`](rdma_dmabuf::RegistrationCache::checkout_cuda)):
    /// a range registered before and unregistered since is served by its cached
    /// registrations, with no export and no registration (GPU registration is slow). Peers
    /// address it by device pointer: each device's region has `addr = ptr`. The range must
    /// lie inside one allocation, which is looked up on every call, so memory freed and
    /// allocated again at the same address is registered afresh. The same as
    /// `register(name, Memory::Cuda { device, ptr, len })`.
    ///
    /// # Errors
    /// [`Error::CudaRange`] for memory that is not `device`'s (unknown, freed, host,
    /// managed), a range across the seams of `cuMemMap`ped allocations or past its
    /// allocation, or pages shared with other allocations; otherwise as [`Agent::register`].
    pub fn register_cuda(
        &self,
        name: &str,
        device: &Arc<drm_export::cuda::CudaDevice>,
        ptr: u64,
        len: u64,
    ) -> Result<SegmentDescriptor> {
        let device = device.clone();
        self.register(name, Memory::Cuda { device, ptr, len })
    }

    /// The counters of each device's registration cache, in the order of
    /// [`Agent::devices`]: hits (CUDA segments registered from a cached registration),
    /// misses (exported and registered), evictions, and what the cache holds now.
    pub fn cache_stats(&self) -> Vec<CacheStats> {
        self.shared
            .devices
            .iter()
            .map(|d| d.cache.stats())
            .collect()
    }

    /// Deregisters every idle registration of the caches (those of registered segments
    /// stay), giving the GPU memory they pinned back to its allocator.
    pub fn clear_registration_caches(&self) {
        for d in &self.shared.devices {
            d.cache.clear();
        }
    }

    /// Deregisters segment `name` (every device's region) and hands its memory back: no
    /// peer can reach it any more. A CUDA segment's [`Memory::Cuda`] description comes back
    /// (the memory is the CUDA allocator's); its registrations go back to the registration
    /// caches only with [`Settings::keep_cuda_registrations`], and then stay open to peers
    /// (see there). The segment is deregistered first, then the metadata service is told;
    /// if it cannot be (etcd unreachable, a backend's error), the memory still comes back:
    /// peers that hold the old descriptor are refused by their NICs and fetch it again (their
    /// entries fail with [`Error::UnknownSegment`] when the new one lacks the segment, else
    /// [`Error::RemoteAccess`]), and the next publication carries the removal.
    ///
    /// # Errors
    /// [`Error::SegmentBusy`] while a transfer that uses it has not finished (nothing
    /// changes); [`Error::UnknownSegment`]; [`Error::Rdma`] if deregistration fails;
    /// [`Error::Protocol`] for a segment whose regions were lost after a failure (never
    /// expected): it is removed and unpublished, its memory not handed back.
    pub fn unregister(&self, name: &str) -> Result<Memory> {
        let region = match self.shared.segments.remove(&self.shared.name, name) {
            Ok(region) => region,
            Err(e) => {
                if matches!(e, Error::Protocol(_)) {
                    // Removed, its memory lost: peers must not look for it any more.
                    let _ = self.publish();
                }
                return Err(e);
            }
        };
        let memory = self.release(region);
        tracing::info!(agent = %self.shared.name, segment = name, ok = memory.is_ok(), "segment unregistered");
        // Deregistered whatever the metadata service answers: see above.
        let _ = self.publish();
        memory
    }

    /// Deregisters a segment's regions (a CUDA segment's registrations evicted from the
    /// caches unless kept): no peer reaches its memory any more.
    fn release(&self, region: Region) -> Result<Memory> {
        if !self.shared.settings.keep_cuda_registrations {
            region.evict_cached(&self.shared.devices);
        }
        region.into_memory()
    }

    fn publish(&self) -> Result<()> {
        let descriptor = if self.shared.metadata.stores_descriptors() {
            self.shared.descriptor()
        } else {
            // Served live by the listener: copying every segment's descriptor per
            // registration would make registering N segments cost N^2.
            AgentDescriptor {
                agent: self.shared.name.clone(),
                incarnation: self.shared.incarnation,
                segments: Vec::new(),
            }
        };
        let r = self.shared.metadata.publish(&descriptor, self.address());
        self.shared.metrics.published(r.is_err());
        match &r {
            Ok(()) => tracing::debug!(
                agent = %self.shared.name,
                segments = descriptor.segments.len(),
                "descriptor published",
            ),
            Err(e) => {
                tracing::warn!(agent = %self.shared.name, error = %e, "descriptor not published")
            }
        }
        r
    }

    /// Checks every entry of `batch` against this agent's segments and the remote agents'
    /// descriptors, then hands it to the worker, which cuts it into chunks
    /// ([`Settings::chunk_size`]) and posts them with up to [`Settings::in_flight`] in flight
    /// per queue pair. Connections are made on the first transfer to a peer and reused.
    ///
    /// # Errors
    /// Before anything is posted: [`Error::EmptyBatch`], [`Error::ZeroLength`],
    /// [`Error::UnknownSegment`], [`Error::NoSegmentAt`] (an address no segment holds),
    /// [`Error::UnknownAgent`], [`Error::OutOfRange`],
    /// [`Error::Access`], [`Error::Overlap`] (a read's local range overlapping another
    /// entry's), [`Error::NotificationTooLong`], [`Error::BatchTooLarge`]; the metadata
    /// service's errors ([`Error::IncompatibleVersion`], [`Error::Io`]). Failures after
    /// that are reported per entry by the [`Transfer`].
    pub fn transfer(&self, batch: &Batch) -> Result<Transfer> {
        let started = std::time::Instant::now();
        batch.check_notification()?;
        let mut records = self.peer_records(batch, false)?;
        let mut refreshed = false;
        let plan = loop {
            let mut table = self.shared.segments.lock();
            let descriptor = |a: &str| records.get(a).map(|r| &r.descriptor);
            let local = table.values().map(|s| &s.desc);
            let me = &self.shared.name;
            let checked = resolve(&batch.entries, me, local, descriptor).and_then(|entries| {
                plan(
                    &entries,
                    me,
                    |n| table.get(n).map(|s| &s.desc),
                    descriptor,
                    self.shared.settings.chunk_size,
                    &self.shared.weights,
                )
            });
            match checked {
                Ok(p) => {
                    for name in &p.segments {
                        table.get_mut(name).expect("checked").users += 1;
                    }
                    break p;
                }
                // A peer's descriptor may be older than its segments: ask again, once.
                Err(e) if !refreshed && stale(&e, &self.shared.name) => {
                    drop(table);
                    records = self.peer_records(batch, true)?;
                    refreshed = true;
                }
                Err(e) => return Err(e),
            }
        };
        let controls = plan
            .peers
            .iter()
            .map(|t| records[&t.agent].control)
            .collect();
        let progress = Progress::new(&plan.chunks_per_entry, started);
        let id = self.batches.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            agent = %self.shared.name,
            id,
            entries = batch.entries.len(),
            chunks = plan.chunks.len(),
            peers = plan.peers.len(),
            rounds = plan.rounds,
            "batch checked and planned",
        );
        let job = Job {
            id,
            plan,
            controls,
            progress: progress.clone(),
            notification: batch.notification.clone(),
        };
        progress.submitted();
        let refused = match &self.jobs {
            Some(jobs) => jobs.send(job).err().map(|e| e.0.plan),
            None => Some(job.plan),
        };
        if let Some(plan) = refused {
            for name in &plan.segments {
                self.shared.segments.release(name);
            }
            return Err(Error::ShuttingDown);
        }
        Ok(Transfer { progress })
    }

    /// Takes every notification received so far, oldest first.
    ///
    /// Each notification's [`Notification::from`] is the agent its connection was
    /// authenticated as. The queue holds at most [`Limits::notifications_per_sender`](crate::Limits::notifications_per_sender)
    /// of one sender and [`Limits::notifications`](crate::Limits::notifications) in all;
    /// past them a sender's notification is refused ([`Error::LimitReached`] on its side).
    pub fn notifications(&self) -> Vec<Notification> {
        self.shared.inbox.take_all()
    }

    /// Takes the oldest notification, waiting at most `timeout` for one.
    pub fn wait_notification(&self, timeout: Duration) -> Option<Notification> {
        self.shared.inbox.wait(timeout)
    }
}

/// Whether a refusal may come from a stale descriptor of a peer (then it is fetched again).
fn stale(e: &Error, me: &str) -> bool {
    match e {
        Error::UnknownSegment { agent, .. } => agent != me,
        Error::OutOfRange { side, .. }
        | Error::Access { side, .. }
        | Error::NoSegmentAt { side, .. } => *side == Side::Remote,
        _ => false,
    }
}

impl Drop for Agent {
    /// Waits for every accepted transfer (the worker finishes the queued batches and
    /// returns the segments), stops the listener, then deregisters the segments.
    fn drop(&mut self) {
        drop(self.endpoint.take());
        drop(self.jobs.take());
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        let _ = self.shared.metadata.withdraw(&self.shared.name);
        drop(self.server.take());
    }
}
