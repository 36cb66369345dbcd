// A posted region cannot be touched by the CPU until its completion hands it back.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
    let _pending = qp.post_send(region, None).unwrap();
    let _first = region.bytes().unwrap()[0];
}
fn main() {}
