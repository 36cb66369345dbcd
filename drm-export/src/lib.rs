//! GPU and host buffers exported as dma-buf file descriptors.
//!
//! * [`device`]: DRM card and render nodes, driver identity.
//! * [`dumb`]: dumb buffers (any KMS driver; vgem in the testbed), exported with [`prime`].
//! * [`udmabuf`]: host memory (a sealed memfd) as a dma-buf.
//! * [`DmaBuf`]: an owned, validated dma-buf fd with its size and exporter.
//!
//! Only the private `sys` module uses `unsafe`.

#![deny(unsafe_code)]

pub mod device;
pub mod dmabuf;
pub mod dumb;
pub mod error;
pub mod prime;
mod sys;
pub mod udmabuf;

pub use device::{DrmDevice, NodeKind};
pub use dmabuf::DmaBuf;
pub use dumb::DumbBuffer;
pub use error::{Error, Op, Result};
pub use udmabuf::Udmabuf;
