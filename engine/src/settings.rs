//! [`Settings`]: what an agent is given, every field with a finite default.

use crate::auth::Auth;
use crate::error::{Error, Result};
use crate::limits::Limits;
use gpu_rdma_topology::{NicOverride, NICS_ENV};
use rdma_dmabuf::{CacheLimits, TransportRetry};
use std::net::SocketAddr;
use std::time::Duration;

/// An agent's settings. `Settings::default()` uses every RDMA device with an active port
/// and listens on `0.0.0.0:0`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The RDMA devices to use, by name; `None`: every device whose port 1 is active.
    pub devices: Option<Vec<String>>,
    /// Where the control listener (metadata, connections, notifications) binds.
    pub bind: SocketAddr,
    /// The largest request an entry is cut into. Default 256 KiB: large enough that one
    /// post and one completion per chunk cost little next to moving it (256 KiB take 20 µs
    /// at 100 Gb/s), small enough that one large entry keeps many requests in flight and
    /// that a window of [`Settings::in_flight`] chunks bounds the bytes a queue pair has
    /// outstanding (64 × 256 KiB = 16 MiB, past the bandwidth-delay product of one link).
    pub chunk_size: u64,
    /// How many chunks each queue pair has in flight at most (its send queue's depth).
    pub in_flight: u32,
    /// The queue pairs' ACK timeout exponent (4.096 µs × 2^t) and retry count, which bound
    /// how long a dead peer keeps a chunk pending ([`Settings::peer_failure_bound`]).
    /// `None` (the default): rdma-dmabuf's defaults with its environment variables applied
    /// (`RDMA_DMABUF_ACK_TIMEOUT`, `RDMA_DMABUF_RETRY_COUNT`: slow fabrics such as emulated
    /// machines set them), as every queue pair of rdma-dmabuf starts from.
    pub transport_retry: Option<TransportRetry>,
    /// Bounds each connect, request and reply of the control channel.
    pub io_timeout: Duration,
    /// Queue pairs per (peer, local device, remote device); a batch's chunks are spread
    /// over them round-robin, each with its own window of [`Settings::in_flight`]. Default
    /// 2, as Mooncake's `num_qp_per_ep`: a NIC works on different queue pairs in parallel
    /// (one is processed in order, by one engine at a time) while each costs NIC memory
    /// and a connection round trip, so two give most of the gain; more rarely help on one
    /// link, and soft-RoCE runs each in the kernel's tasklet context anyway.
    pub queue_pairs: u32,
    /// Worker threads: how many batches an agent runs at once (they share the connections
    /// to peers: see [`Settings::release_idle_after`]). Default 2, so that a batch stuck on a dead peer for up to
    /// [`Settings::peer_failure_bound`] does not hold up batches to healthy peers; a worker
    /// busy-polls while it has a batch, so more workers than cores cost more than they give.
    /// Batches are not ordered with more than one: a later batch may land before an earlier
    /// one (each notification still follows its own batch's entries); 1 runs them in order.
    pub workers: u32,
    /// How long a connection to a peer (its control channel and the queue pairs made over
    /// it) may go unused before it is closed, the peer's side of its queue pairs with it; a
    /// later batch to that peer makes new ones. Default 300 s; `Duration::MAX`: never. The
    /// workers share these connections: a batch takes one per peer for its time, so an agent
    /// holds per peer as many as batches to it ran at once.
    pub release_idle_after: Duration,
    /// Bounds of each device's registration cache, which keeps the registrations of CUDA
    /// segments ([`Agent::register_cuda`](crate::Agent::register_cuda)) after they are
    /// unregistered, so that registering the same range again reuses them. Registered bytes
    /// and registrations count those in use; past either, the least recently unregistered
    /// idle ones are deregistered. Default: rdma-dmabuf's, 1 GiB and 1,024 registrations per
    /// device. An idle registration pins its GPU memory (even after the program frees it,
    /// until it is evicted or [`Agent::clear_registration_caches`](crate::Agent::clear_registration_caches)),
    /// so the bound in bytes is GPU memory the allocator may not get back; raise it for large
    /// segments registered again and again (a segment larger than the bound is deregistered
    /// when unregistered).
    pub cache_limits: CacheLimits,
    /// Whether a CUDA segment's registrations stay in the caches when it is unregistered
    /// (default `false`: they are deregistered, as every other segment's are).
    ///
    /// Kept, registering the same range again is a cache hit (no export, no registration),
    /// but the registrations keep their remote access: a peer that still holds the old
    /// descriptor can read and write that GPU memory after `unregister` returned, until the
    /// cache evicts the registration or [`Agent::clear_registration_caches`](crate::Agent::clear_registration_caches)
    /// runs. Turn it on only for memory that serves the agent alone for its life (a KV-cache
    /// pool registered again and again), never for memory the program hands to other uses.
    pub keep_cuda_registrations: bool,
    /// How long a rail (a pair of local and remote devices) that failed is left out of
    /// later batches to the same peer before one tries it again (default 2 s), doubled each
    /// time it fails again, up to 32 times. Within a batch a failed rail's chunks move to
    /// the peer's other rails at once; a rail whose link is still down would otherwise cost
    /// every batch the time to find out again (up to [`Settings::peer_failure_bound`] when
    /// the far end is gone).
    pub rail_probe_after: Duration,
    /// Which devices to rank first for memory at a given place, overriding the topology
    /// (clusters whose firmware misreports it, or operators who pin each GPU's NIC): per PCI
    /// address, NUMA node or `*`, a list of device names, e.g.
    /// `"0000:22:00.0=rxe1,rxe3;numa0=rxe0;*=rxe2".parse()`. The devices listed for a
    /// segment's place are its tier 0, in that order; the others follow, one tier further
    /// (docs/engine.md, "Topology"). `None` (the default): the environment variable
    /// `GPU_RDMA_NICS` in the same syntax, read when the agent starts, or no override.
    pub nics: Option<NicOverride>,
    /// How control connections are authenticated, both ways (docs/engine.md, "Security").
    /// Default [`Auth::FromEnvironment`]: the cluster key file named by
    /// `GPU_RDMA_CLUSTER_KEY_FILE`, or mutual TLS with the files named by `GPU_RDMA_TLS_CA`,
    /// `GPU_RDMA_TLS_CERT` and `GPU_RDMA_TLS_KEY`, or, when `GPU_RDMA_INSECURE_NO_AUTH=1`,
    /// none; with none of them, [`Agent::new`](crate::Agent::new) refuses to start.
    pub auth: Auth,
    /// The control listener's bounds on what clients can make the agent hold.
    pub limits: Limits,
    /// Whether the workers time and count each chunk for [`Agent::metrics`](crate::Agent::metrics)
    /// (default `true`): per rail bytes and requests, the chunk latency histogram and the
    /// in-flight gauge. It costs two clock reads and a few relaxed atomic adds per chunk, no
    /// lock and no allocation; off, those stay at zero (batches, failures, failovers, queue
    /// pairs, caches and metadata are counted either way).
    pub metrics: bool,
    /// Where to serve the metrics over HTTP for Prometheus (`GET /metrics`, the OpenMetrics
    /// text of [`Agent::metrics_text`](crate::Agent::metrics_text)); `None` (the default):
    /// no endpoint. It serves anyone who reaches it, unauthenticated: bind it to a loopback
    /// or management address. Port 0 picks a free port ([`Agent::metrics_address`](crate::Agent::metrics_address)).
    pub metrics_address: Option<SocketAddr>,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            devices: None,
            bind: SocketAddr::from(([0, 0, 0, 0], 0)),
            chunk_size: 256 << 10,
            in_flight: 64,
            transport_retry: None,
            io_timeout: Duration::from_secs(10),
            queue_pairs: 2,
            workers: 2,
            release_idle_after: Duration::from_secs(300),
            cache_limits: CacheLimits::default(),
            keep_cuda_registrations: false,
            rail_probe_after: Duration::from_secs(2),
            nics: None,
            auth: Auth::FromEnvironment,
            limits: Limits::default(),
            metrics: true,
            metrics_address: None,
        }
    }
}

impl Settings {
    /// The transport retry settings the agent's queue pairs use: [`Settings::transport_retry`]
    /// or rdma-dmabuf's defaults with the environment applied.
    ///
    /// # Errors
    /// An environment variable that is set but unusable ([`Error::Setting`](rdma_dmabuf::Error::Setting)).
    pub fn resolved_retry(&self) -> rdma_dmabuf::Result<TransportRetry> {
        self.transport_retry
            .map_or_else(TransportRetry::from_environment, Ok)
    }

    /// The NIC override the agent ranks its devices with: [`Settings::nics`], or the one in
    /// the environment variable `GPU_RDMA_NICS` when that is `None` (unset or blank: none).
    ///
    /// # Errors
    /// [`Error::Settings`] naming the variable and the offending part of its text.
    pub fn resolved_nics(&self) -> Result<Option<NicOverride>> {
        match &self.nics {
            Some(o) => Ok(Some(o.clone())),
            None => NicOverride::from_environment()
                .map_err(|e| Error::Settings(format!("{NICS_ENV}: {e}"))),
        }
    }

    /// How long after a peer dies its pending entries fail at most: every retry of one
    /// request (the transport's budget by the specification's bound,
    /// [`TransportRetry::budget`]; soft-RoCE takes about a quarter of it), plus a second for
    /// the flush of the rest. Each request in flight to the peer fails together, not one
    /// after another, since the first failure moves the queue pair to the error state; the
    /// rails in use fail together too, and a fallback rail of a further tier, tried only
    /// once the nearer ones failed, may add one such bound per tier. With
    /// an unusable environment (which `Agent::new` refuses) it states the defaults' bound.
    pub fn peer_failure_bound(&self) -> Duration {
        let retry = self.resolved_retry().unwrap_or(TransportRetry {
            ack_timeout: rdma_dmabuf::DEFAULT_ACK_TIMEOUT,
            retry_count: rdma_dmabuf::DEFAULT_RETRY_COUNT,
        });
        retry.budget() + Duration::from_secs(1)
    }
}
