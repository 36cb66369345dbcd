// In a scope, the CPU cannot map (to read or write) a dma-buf region the NIC is reading.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, mut region: MemoryRegion<DmaBuf>) {
    scope(|s| {
        let p = s.send(qp, region.part(0..64), None).unwrap();
        region.map().unwrap().write().unwrap().fill(0);
        p.spin()
    });
}
fn main() {}
