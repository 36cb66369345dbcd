//! Verbs fixtures: a device, a protection domain, and pairs of connected queue pairs.

use crate::testbed::Testbed;
use rdma_dmabuf::{
    Access, Context, HostBuffer, MemoryRegion, MultiChannel, MultiChannelBuilder, ProtectionDomain,
    QueuePair, QueuePairBuilder,
};
use std::sync::Arc;

/// The testbed's RDMA device and a protection domain on it.
pub fn pd(tb: &Testbed) -> Arc<ProtectionDomain> {
    let ctx = Context::open(&tb.device).expect("open the testbed's rdma device");
    ProtectionDomain::new(&ctx).expect("protection domain")
}

/// Two RC queue pairs in `pd`, connected to each other over the device's loopback.
pub fn loopback_pair(pd: &Arc<ProtectionDomain>) -> (QueuePair, QueuePair) {
    connect_pair(QueuePairBuilder::new(pd), QueuePairBuilder::new(pd))
}

/// Builds `a` and `b` and connects them to each other over the device's loopback.
pub fn connect_pair(a: QueuePairBuilder, b: QueuePairBuilder) -> (QueuePair, QueuePair) {
    let a = a.build().expect("qp a");
    let b = b.build().expect("qp b");
    let (ea, eb) = (a.endpoint(), b.endpoint());
    (
        a.connect(&eb).expect("connect a"),
        b.connect(&ea).expect("connect b"),
    )
}

/// Two connected queue pairs with 64 entries in each queue and two SGEs per request: room for
/// scopes and handles of many requests at once.
pub fn deep_pair(pd: &Arc<ProtectionDomain>) -> (QueuePair, QueuePair) {
    let b = || {
        QueuePairBuilder::new(pd)
            .send_depth(64)
            .recv_depth(64)
            .max_sge(2)
    };
    connect_pair(b(), b())
}

/// Builds `hub` and connects it to `n` peers, each a queue pair in `pd` of this process
/// (`n` must be the hub's peer count).
pub fn hub_and_peers(
    pd: &Arc<ProtectionDomain>,
    hub: MultiChannelBuilder,
    n: usize,
) -> (MultiChannel, Vec<QueuePair>) {
    let hub = hub.build().expect("multi-peer channel");
    let peers: Vec<_> = (0..n)
        .map(|_| QueuePairBuilder::new(pd).build().expect("peer qp"))
        .collect();
    let hub_eps = hub.endpoints();
    let peer_eps: Vec<_> = peers.iter().map(|p| p.endpoint()).collect();
    let hub = hub.connect(&peer_eps).expect("connect the hub");
    let peers = peers
        .into_iter()
        .zip(&hub_eps)
        .map(|(p, e)| p.connect(e).expect("connect a peer"))
        .collect();
    (hub, peers)
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

/// The bytes of `remote`, RDMA-read by `qp` into a fresh host region of `pd`.
///
/// # Panics
/// If the read fails.
pub fn read_remote(
    pd: &Arc<ProtectionDomain>,
    qp: &QueuePair,
    remote: rdma_dmabuf::RemoteRegion,
) -> Vec<u8> {
    let n = remote.len;
    let back = host_region(pd, &[], n as usize, Access::LOCAL_WRITE);
    let done = qp
        .post_read(rdma_dmabuf::Local::new(back, 0..n), remote)
        .unwrap()
        .spin()
        .unwrap_or_else(|e| panic!("RDMA read of {n} bytes: {}", e.error));
    done.region.bytes().unwrap()[..n as usize].to_vec()
}
