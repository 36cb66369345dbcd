//! Verbs fixtures: a device, a protection domain, and pairs of connected queue pairs.

use crate::testbed::Testbed;
use rdma_dmabuf::{
    Access, Context, HostBuffer, MemoryRegion, ProtectionDomain, QueuePair, QueuePairBuilder,
};
use std::sync::Arc;

/// The testbed's RDMA device and a protection domain on it.
pub fn pd(tb: &Testbed) -> Arc<ProtectionDomain> {
    let ctx = Context::open(&tb.device).expect("open the testbed's rdma device");
    ProtectionDomain::new(&ctx).expect("protection domain")
}

/// Two RC queue pairs in `pd`, connected to each other over the device's loopback.
pub fn loopback_pair(pd: &Arc<ProtectionDomain>) -> (QueuePair, QueuePair) {
    let a = QueuePairBuilder::new(pd).build().expect("qp a");
    let b = QueuePairBuilder::new(pd).build().expect("qp b");
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (
        a.connect(&eb).expect("connect a"),
        b.connect(&ea).expect("connect b"),
    )
}

/// A host region of `len` bytes filled with `data` (zero-padded) and the given access.
pub fn host_region(
    pd: &Arc<ProtectionDomain>,
    data: &[u8],
    len: usize,
    access: Access,
) -> MemoryRegion<HostBuffer> {
    let mut buf = HostBuffer::new(len).expect("host buffer");
    buf.as_mut_slice()[..data.len()].copy_from_slice(data);
    MemoryRegion::register(pd, buf, access).expect("register host buffer")
}

/// Distinct bytes per offset and seed, so shifted or stale data shows.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 10) as u8)
        .collect()
}
