//! Helpers shared by the examples, so that no example copies another's code.
//!
//! * [`args`]: `--name value` options and sizes like `16M`;
//! * [`gpu`]: finding a GPU (i915, xe, amdgpu, else vgem) and exporting a buffer from it;
//! * [`kinds`]: buffers of each kind a region can have (host, udmabuf, dma-heap, GPU);
//! * [`link`]: taking a network interface down or up in-process (a cut link);
//! * [`net`]: finding the RDMA device and its address, rdma_cm connects that wait for the
//!   server;
//! * [`side`]: a TCP side channel for examples that connect queue pairs by hand;
//! * [`pattern`]: a position-dependent test pattern;
//! * [`report`]: aligned output, sizes and rates.

pub mod args;
pub mod gpu;
pub mod kinds;
pub mod link;
pub mod net;
pub mod pattern;
pub mod report;
pub mod side;

pub use args::{fail, Args};
pub use side::SideChannel;

use rdma_dmabuf::{Access, HostBuffer, MemoryRegion, ProtectionDomain};

/// A zeroed host buffer of `len` bytes registered with `access`; exits with the error if that
/// fails.
pub fn host_region(
    pd: &std::sync::Arc<ProtectionDomain>,
    len: usize,
    access: Access,
) -> MemoryRegion<HostBuffer> {
    HostBuffer::new(len)
        .and_then(|b| MemoryRegion::register(pd, b, access))
        .unwrap_or_else(|e| fail(&e.to_string()))
}
