//! A transfer engine over [`rdma_dmabuf`]: agents, named segments of GPU or host memory,
//! batches of RDMA reads and writes between agents, and notifications.
//!
//! * [`Agent::new`]: one per process. Opens the RDMA devices of its [`Settings`] (default:
//!   every device with an active port), one protection domain each, and listens on TCP for
//!   peers (the embedded metadata service, queue-pair set-up, notifications).
//! * [`Agent::register`]: a [`DmaBuf`](rdma_dmabuf::DmaBuf) from any exporter or a
//!   [`HostBuffer`](rdma_dmabuf::HostBuffer) becomes a named segment, described to peers by
//!   a [`SegmentDescriptor`] (inside the agent's [`AgentDescriptor`], with its random
//!   incarnation and [`FORMAT_VERSION`]). [`Agent::unregister`] refuses while a transfer uses
//!   the segment and hands the memory back otherwise.
//! * [`Agent::register_cuda`]: CUDA device memory the program has (`[ptr, ptr + len)` inside
//!   one allocation) becomes a segment through each device's registration cache
//!   ([`Settings::cache_limits`]). [`Agent::unregister`] deregisters it, unless
//!   [`Settings::keep_cuda_registrations`] keeps the registrations (still open to peers) so
//!   that registering it again reuses them ([`Agent::cache_stats`] counts the hits).
//! * Topology: each region of a segment carries a tier ([`DeviceRegion::tier`], 0 the
//!   devices nearest to the memory: behind its PCIe switch, then its host bridge, then its
//!   NUMA node), from where the memory is ([`Near`]: found for CUDA and host memory, given
//!   with [`Agent::register_near`] for a dma-buf) and the NIC override ([`Settings::nics`],
//!   `GPU_RDMA_NICS`); [`Agent::nic_ranking`] says why.
//! * [`MetadataService`]: where descriptors are published and found; [`EmbeddedMetadata`]
//!   asks peers named with [`Agent::add_peer`] directly.
//!   With the cargo feature `etcd`, `EtcdMetadata` keeps them in etcd (keys under a lease,
//!   watches; [`Agent::with_metadata`]).
//! * [`Agent::transfer`] of a [`Batch`]: every [`Entry`] is checked against both
//!   descriptors before anything is posted, then cut into chunks that a worker thread posts
//!   with many in flight, round-robin over [`Settings::queue_pairs`] queue pairs per peer
//!   and device; [`Settings::workers`] batches run at once. The [`Transfer`] handle gives
//!   each entry's [`EntryStatus`] and a bounded [`Transfer::wait`] (with the `tokio`
//!   feature, a bounded `Transfer::finished(timeout).await`, woken by the worker). A
//!   batch's notification reaches the remote agents ([`Agent::wait_notification`]) once
//!   every entry has landed.
//!
//! # Operating it
//! [`Agent::metrics`] counts what moved over each rail, what failed and why, failovers,
//! latencies, queue pairs, registration caches and metadata look-ups, cheaply enough to
//! stay on ([`Settings::metrics`]); [`Settings::metrics_address`] serves them to
//! Prometheus. The engine emits [`tracing`](https://docs.rs/tracing) spans and events (a
//! batch's life, peers and rails marked down and back, registrations, metadata) for any
//! subscriber. [`Agent::wait_for_peer`] waits, bounded, until a peer is known.
//!
//! # Security
//! Every control connection is authenticated both ways before anything is served
//! ([`Settings::auth`]: a [`ClusterKey`], mutual TLS under the cluster's CA ([`TlsFiles`]),
//! or, said explicitly, none; the default reads the environment and refuses to start
//! without one), a notification's sender is the name its connection authenticated, and
//! every resource a client can make an agent hold is bounded ([`Settings::limits`], refusals
//! [`Error::LimitReached`], counted by [`Agent::control_stats`]). The RDMA fabric itself is
//! not protected: docs/engine.md, "Security".
//!
//! # Soundness
//! The crate has no `unsafe`. A segment's region is lent to the worker for a batch and split
//! into owned [`Shard`](rdma_dmabuf::Shard)s, one per chunk, that move into their requests
//! and come back with their completions; the engine gives the CPU no access to a segment's
//! memory at all (it comes back from [`Agent::unregister`], deregistered).
//!
//! # Failures
//! A peer whose requests fail (dead, unreachable, restarted) is marked down once: every
//! pending entry to it fails with [`Error::PeerDown`] within
//! [`Settings::peer_failure_bound`], later chunks to it are not posted, and the next
//! transfer to it fetches its descriptor again. A peer that restarted is a new incarnation:
//! entries checked against the old one fail with [`Error::IncarnationChanged`] before any
//! is posted. An entry is [`EntryStatus::Done`] only when every one of its chunks completed
//! successfully.
//!
//! # Limits (this slice)
//! A dma-buf segment is registered on every device of the agent: the buffer is shared
//! ([`SharedDmaBuf`](rdma_dmabuf::SharedDmaBuf), no CPU access), one region per protection
//! domain, each in the descriptor's `regions`; each chunk goes through the region of the
//! local device it is planned on (a device both segments are registered on, the same index
//! on both sides where there is one, spread over those). [`Agent::unregister`] deregisters
//! every region and hands the [`DmaBuf`](rdma_dmabuf::DmaBuf) or
//! [`HostBuffer`](rdma_dmabuf::HostBuffer) back (an error, never a silent leak, if some
//! handle still held it). A CUDA segment is a checkout of each device's
//! [`RegistrationCache`](rdma_dmabuf::RegistrationCache), split into shards per round
//! (`Checkout::split`) and joined back (`Lent::join`); unregistered, the checkouts go back
//! to the caches. A `HostBuffer` segment is shared the same way as a dma-buf
//! ([`SharedHostBuffer`](rdma_dmabuf::SharedHostBuffer), one region per device). Batches that use the same local segment take turns on it, one
//! round at a time (a segment's regions are lent together to one worker).
#![forbid(unsafe_code)]

mod address;
mod agent;
mod auth;
#[cfg(feature = "tokio")]
mod awaiting;
mod batch;
mod card;
mod channel;
mod codec;
mod conns;
mod descriptor;
mod devices;
mod error;
#[cfg(feature = "etcd")]
mod etcd;
mod exec;
mod failover;
mod gone;
mod health;
mod http_meta;
mod inbox;
mod limits;
mod metadata;
mod metrics;
mod names;
mod notifier;
mod peer;
mod peer_pool;
mod plan;
mod progress;
mod segment;
mod server;
#[cfg(test)]
mod server_tests;
mod serving;
mod settings;
mod shared;
mod signed;
mod sources;
mod wire;
mod worker;

pub use agent::Agent;
pub use auth::{Auth, ClusterKey, TlsFiles, CLUSTER_KEY_ENV, INSECURE_ENV, MIN_KEY_BYTES, TLS_ENV};
pub use batch::{Batch, Entry, Notification, Op, BY_ADDRESS, MAX_NOTIFICATION};
pub use card::{Card, CARD_VERSION};
pub use descriptor::{AgentDescriptor, DeviceRegion, SegmentDescriptor, FORMAT_VERSION};
pub use error::{Error, ErrorKind, Limit, Result, Side};
#[cfg(feature = "etcd")]
pub use etcd::{EtcdMetadata, EtcdSettings, EtcdTls, EtcdUser};
pub use gpu_rdma_topology::{Near, NicOverride, OverrideError, Proximity, Ranked};
pub use http_meta::{HttpMetadata, MetadataServer, HTTP_PREFIX};
pub use limits::{ControlStats, Limits};
pub use metadata::{EmbeddedMetadata, MetadataService, PeerRecord};
pub use metrics::{Histogram, MetadataMetrics, Metrics, RailMetrics};
pub use progress::{EntryStatus, Timing, Transfer};
pub use segment::Memory;
pub use settings::Settings;
