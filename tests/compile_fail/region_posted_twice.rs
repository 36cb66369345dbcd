// One region cannot be in two requests at once.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
    let _first = qp.post_send(region, None).unwrap();
    let _second = qp.post_send(region, None).unwrap();
}
fn main() {}
