// The regions of a batch of writes cannot be touched by the CPU until the batch's one
// completion hands them all back.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, a: MemoryRegion<HostBuffer>, b: MemoryRegion<HostBuffer>, r: RemoteRegion) {
    let pending = qp.post_write_batch([a, b], [r, r]).unwrap();
    let _first = a.bytes().unwrap()[0];
    drop(pending);
}
fn main() {}
