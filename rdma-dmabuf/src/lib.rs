//! Safe RDMA verbs with owned, typed memory regions, including dma-buf (GPU) regions.
//!
//! * [`device`]: devices, contexts, ports, GIDs (the RoCEv2 IPv4 GID picked automatically).
//! * [`ProtectionDomain`], and [`MemoryRegion<B>`] typed by its backing: [`HostBuffer`]
//!   (`ibv_reg_mr`) or [`DmaBuf`] (`ibv_reg_dmabuf_mr`); [`supports_dmabuf`] probes a device.
//! * [`QueuePairBuilder`] -> [`PreparedQp`] -> [`QueuePair`]: RC queue pairs connected by
//!   exchanging [`Endpoint`]s out of band.
//! * Posts take ownership: a region (or a [`Local`] part of one) moves into the request, and
//!   [`Pending::wait`] hands it back with the completion. The CPU cannot touch a buffer the NIC
//!   may be using:
//!
//! ```compile_fail
//! # use rdma_dmabuf::*;
//! # fn f(qp: &QueuePair, mut region: MemoryRegion<HostBuffer>) {
//! let pending = qp.post_send(region, None).unwrap();
//! region.bytes_mut().unwrap()[0] = 1; // error: `region` was moved into the request
//! # }
//! ```
//!
//! A dma-buf region has no CPU slice at all (CPU access goes through the `DmaBuf`'s mapping
//! and its sync guards):
//!
//! ```compile_fail
//! # use rdma_dmabuf::*;
//! # fn f(region: MemoryRegion<DmaBuf>) {
//! let bytes = region.bytes(); // error: no `bytes` on MemoryRegion<DmaBuf>
//! # }
//! ```
//!
//! [`DmaBuf`]: drm_export::DmaBuf

pub mod device;
pub mod endpoint;
pub mod error;
pub mod host;
pub mod mr;
pub mod pd;
pub mod qp;
pub mod remote;
mod slots;
pub mod wr;

pub use device::{Context, Gid, Mtu};
pub use drm_export::DmaBuf;
pub use endpoint::Endpoint;
pub use error::{Error, Op, Result};
pub use host::HostBuffer;
pub use mr::{supports_dmabuf, Access, MemoryRegion};
pub use pd::ProtectionDomain;
pub use qp::{Done, Local, Outcome, Pending, PreparedQp, QueuePair, QueuePairBuilder, WorkError};
pub use remote::RemoteRegion;
pub use wr::{WorkCompletion, WorkKind};
