//! Safe RDMA verbs with owned, typed memory regions, including dma-buf (GPU) regions.
//!
//! * [`devices`] and [`Context`]: devices, contexts, ports, GIDs (the RoCEv2 IPv4 GID picked
//!   automatically).
//! * [`ProtectionDomain`], and [`MemoryRegion<B>`] typed by its backing: [`HostBuffer`]
//!   (`ibv_reg_mr`) or [`DmaBuf`] (`ibv_reg_dmabuf_mr`); [`supports_dmabuf`] probes a device.
//! * [`QueuePairBuilder`] -> [`PreparedQp`] -> [`QueuePair`]: RC queue pairs connected by
//!   exchanging [`Endpoint`]s out of band.
//! * Posts take ownership: a region (or a [`Local`] part of one) moves into the request, and
//!   [`Pending::spin`] hands it back with the completion.
//! * Several parts per request: [`QueuePair::post_write_parts`] and its siblings gather from
//!   or scatter into up to [`QueuePairBuilder::max_sge`] owned parts, all handed back
//!   together; [`MemoryRegion::split`] cuts one registration into disjoint [`Shard`]s that
//!   are posted independently (many requests in flight from one GPU buffer) and
//!   [`Shard::join`]ed back.
//! * [`RegistrationCache`]: dma-buf registrations reused by buffer identity, range and
//!   access, within byte and entry bounds; a [`Checkout`] is posted as an owned part and goes
//!   back to the cache when dropped.
//! * Async: [`reactor`] exposes the completion channel, rdma_cm event channels, a device's
//!   asynchronous events and a dma-buf's fences as borrowed non-blocking fds with
//!   non-blocking steps, for any reactor; the `tokio` feature (module `tokio_rt`) makes
//!   [`Pending`] a future, with async fenced posts, rdma_cm connections and device events.
//!   Dropping a future leaves its region with the queue pair until the NIC is done with it.
//!
//! Two machines: the example `two_node` (the README's "Two nodes") connects over rdma_cm
//! with [`CmConnector::connect_retrying`] (the server may start later), passes the
//! [`RemoteRegion`] in the accept's private data, signals "done" by disconnecting
//! ([`QueuePair::wait_disconnected`], or `wait_disconnected_async` with tokio) and verifies
//! after deregistering. [`Error::kind`] tells refused, unreachable, timed out and peer gone
//! apart. Import by name: `use rdma_dmabuf::*` also brings this crate's [`Result`] and
//! [`Error`], which hide `std`'s.
//!
//! The crate's example `rdma_dmabuf_quickstart`, which `cargo xtask test` runs in the testbed
//! VM (`RDMA_DEVICE=mlx5_0 cargo run -p rdma-dmabuf --example rdma_dmabuf_quickstart` on a
//! machine with a NIC):
//!
//! ```no_run
#![doc = include_str!("../examples/rdma_dmabuf_quickstart.rs")]
// `eprintln!` panics on a closed stderr, and notices come from drops and drains: see `diag`.
#![deny(clippy::print_stderr, clippy::print_stdout)]
// Unsafe code lives in `sys`, the raw layer, and in the few places docs/safety.md lists.
#![deny(unsafe_code)]
//! ```
//!
//! The compiler enforces the ownership rules: a posted region cannot be touched by the CPU
//! until its completion hands it back (it was moved into the request); one region cannot be
//! posted twice at once; a pending request cannot outlive its queue pair; a dma-buf region has
//! no CPU slice at all, and mapping it ([`MemoryRegion::map`]) takes it exclusively, so a
//! scope's borrow or an owned post blocks it; a dma-buf mapping copies bytes in and out and
//! never hands out a slice. Each rule is proven by a compile-fail test checked against the
//! compiler's exact output (`tests/compile_fail/` in the repository, run with `trybuild`).
//! What compiles:
//!
//! ```no_run
//! # use rdma_dmabuf::*;
//! # fn f(qp: QueuePair, region: MemoryRegion<HostBuffer>, mut d: MemoryRegion<DmaBuf>) {
//! let pending = qp.post_send(region, None).unwrap();
//! let done = pending.spin();
//! drop(qp);
//! let mut first = [0u8; 1];
//! d.map().unwrap().read().unwrap().read_at(0, &mut first).unwrap();
//! # }
//! # fn g(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
//! scope(|s| {
//!     let p = s.send(qp, region.part(0..64), None).unwrap();
//!     p.spin()
//! });
//! # }
//! ```
//!
//! [`DmaBuf`]: drm_export::DmaBuf

mod cache;
mod cm;
mod cm_id;
mod cm_retry;
mod cq;
mod deadline;
mod device;
mod diag;
mod dm;
mod endpoint;
mod error;
mod fence;
mod host;
mod mr;
mod multi;
mod part;
mod qp;
pub mod reactor;
mod remote;
mod scope;
mod shard;
mod shared_dmabuf;
mod shared_host;
mod slots;
mod source;
mod spin;
mod sys;
#[cfg(feature = "tokio")]
pub mod tokio_rt;
mod unwind;
mod waiters;
mod watch;
mod wr;

pub use cache::{
    BufferKey, CacheKey, CacheLimits, CacheStats, Checkout, Lent, LentJoinError, LentSplitError,
    RegistrationCache,
};
pub use cm::{release_removed_devices, CmConnector, CmListener, MAX_PRIVATE_DATA};
pub use device::{
    devices, AtomicCap, Context, DeviceAttr, DeviceInfo, Gid, Mtu, PortAttr, PortState,
};
pub use dm::DeviceMemory;
pub use drm_export::DmaBuf;
pub use endpoint::Endpoint;
pub use error::{Error, ErrorKind, Op, Result, DMABUF_HINT, ENOTSUPP};
pub use fence::{export_fences, wait_for_fences, FencedOp};
pub use host::HostBuffer;
pub use mr::{dmabuf_probe_errno, supports_dmabuf, Access, Backing, MemoryRegion};
pub use multi::{MultiChannel, MultiChannelBuilder, PreparedMulti};
pub use part::{ExclusivePart, Local, OwnedPart, Part, PartMut};
pub use qp::{
    BatchError, Done, InlinePending, Outcome, PartsDone, PartsError, PartsOutcome, PartsPending,
    Pending, PreparedQp, QueuePair, QueuePairBuilder, SharedReceiveQueue, SrqPending,
    TransportRetry, WorkError, ACK_TIMEOUT_ENV, DEFAULT_ACK_TIMEOUT, DEFAULT_BUSY_POLL,
    DEFAULT_HOP_LIMIT, DEFAULT_MIN_RNR_TIMER, DEFAULT_RETRY_COUNT, DEFAULT_RNR_RETRY, MAX_BATCH,
    MAX_BUSY_POLL, MAX_ENV_ACK_TIMEOUT, MAX_ENV_RETRY_COUNT, RETRY_COUNT_ENV,
};
pub use remote::RemoteRegion;
pub use scope::{scope, scope_with_deadline, Scope, ScopedPending, DEFAULT_DRAIN_DEADLINE};
pub use shard::{JoinError, Shard, SplitError};
pub use shared_dmabuf::SharedDmaBuf;
pub use shared_host::SharedHostBuffer;
pub use source::{SharedSource, Source};
pub use spin::SpinPolicy;
pub use sys::pd::ProtectionDomain;
pub use wr::{AtomicOp, WorkCompletion, WorkKind};

// The README's examples are compiled as doc tests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
