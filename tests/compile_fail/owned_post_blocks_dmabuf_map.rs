// A dma-buf region moved into a request cannot be mapped until it comes back.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, mut region: MemoryRegion<DmaBuf>) {
    let _pending = qp.post_send(region, None).unwrap();
    let _map = region.map();
}
fn main() {}
