//! Safe RDMA verbs with owned, typed memory regions, including dma-buf (GPU) regions.
//!
//! * [`device`]: devices, contexts, ports, GIDs (the RoCEv2 IPv4 GID picked automatically).
//! * [`ProtectionDomain`], and [`MemoryRegion<B>`] typed by its backing: [`HostBuffer`]
//!   (`ibv_reg_mr`) or [`DmaBuf`] (`ibv_reg_dmabuf_mr`); [`supports_dmabuf`] probes a device.
//! * [`QueuePairBuilder`] -> [`PreparedQp`] -> [`QueuePair`]: RC queue pairs connected by
//!   exchanging [`Endpoint`]s out of band.
//! * Posts take ownership: a region (or a [`Local`] part of one) moves into the request, and
//!   [`Pending::wait`] hands it back with the completion.
//!
//! The crate's example `rdma_dmabuf_quickstart`, which `cargo xtask test` runs in the testbed
//! VM (`RDMA_DEVICE=mlx5_0 cargo run -p rdma-dmabuf --example rdma_dmabuf_quickstart` on a
//! machine with a NIC):
//!
//! ```no_run
#![doc = include_str!("../examples/rdma_dmabuf_quickstart.rs")]
//! ```
//!
//! The compiler enforces the rules. A posted region cannot be touched by the CPU until its
//! completion hands it back:
//!
//! ```compile_fail,E0382
//! # use rdma_dmabuf::*;
//! # fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
//! let pending = qp.post_send(region, None).unwrap();
//! let first = region.bytes().unwrap()[0]; // error: `region` moved into the request
//! # }
//! ```
//!
//! One region (or part) cannot be posted twice at once:
//!
//! ```compile_fail,E0382
//! # use rdma_dmabuf::*;
//! # fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
//! let first = qp.post_send(region, None).unwrap();
//! let second = qp.post_send(region, None).unwrap(); // error: use of moved value
//! # }
//! ```
//!
//! A queue pair cannot be dropped while a request posted on it is pending (the handle borrows
//! it):
//!
//! ```compile_fail,E0505
//! # use rdma_dmabuf::*;
//! # fn f(qp: QueuePair, region: MemoryRegion<HostBuffer>) {
//! let pending = qp.post_send(region, None).unwrap();
//! drop(qp); // error: cannot move out of `qp` because it is borrowed
//! let done = pending.wait();
//! # }
//! ```
//!
//! A dma-buf region has no CPU slice at all (CPU access goes through the `DmaBuf`'s mapping
//! and its sync guards, and only while no peer may write the region):
//!
//! ```compile_fail,E0599
//! # use rdma_dmabuf::*;
//! # fn f(region: MemoryRegion<DmaBuf>) {
//! let bytes = region.bytes(); // error: no method `bytes` on MemoryRegion<DmaBuf>
//! # }
//! ```
//!
//! In the scoped layer a region is borrowed until the scope ends, so the CPU cannot write what
//! the NIC is reading:
//!
//! ```compile_fail,E0502
//! # use rdma_dmabuf::*;
//! # fn f(qp: &QueuePair, mut region: MemoryRegion<HostBuffer>) {
//! scope(|s| {
//!     let p = s.send(qp, &region, 0, 64, None).unwrap();
//!     region.bytes_mut().unwrap()[0] = 1; // error: `region` is borrowed by the scope
//!     p.wait()
//! });
//! # }
//! ```
//!
//! The same lines without the offending statement compile:
//!
//! ```no_run
//! # use rdma_dmabuf::*;
//! # fn f(qp: QueuePair, region: MemoryRegion<HostBuffer>, d: MemoryRegion<DmaBuf>) {
//! let pending = qp.post_send(region, None).unwrap();
//! let done = pending.wait();
//! drop(qp);
//! let map = d.dmabuf().map(|buf| buf.size());
//! # }
//! # fn g(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
//! scope(|s| {
//!     let p = s.send(qp, &region, 0, 64, None).unwrap();
//!     p.wait()
//! });
//! # }
//! ```
//!
//! [`DmaBuf`]: drm_export::DmaBuf

pub mod cm;
pub mod device;
pub mod dm;
pub mod endpoint;
pub mod error;
pub mod fence;
pub mod host;
pub mod mr;
pub mod multi;
pub mod pd;
pub mod qp;
pub mod remote;
pub mod scope;
mod slots;
pub mod wr;

pub use cm::{CmConnector, CmListener};
pub use device::{Context, Gid, Mtu};
pub use dm::DeviceMemory;
pub use drm_export::DmaBuf;
pub use endpoint::Endpoint;
pub use error::{Error, Op, Result};
pub use fence::{wait_for_fences, FencedOp};
pub use host::HostBuffer;
pub use mr::{supports_dmabuf, Access, MemoryRegion};
pub use multi::{MultiChannel, MultiChannelBuilder, PreparedMulti};
pub use pd::ProtectionDomain;
pub use qp::{Done, Local, Outcome, Pending, PreparedQp, QueuePair, QueuePairBuilder, WorkError};
pub use remote::RemoteRegion;
pub use scope::{scope, Scope, ScopedPending};
pub use wr::{WorkCompletion, WorkKind};
