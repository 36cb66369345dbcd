// A queue pair cannot be dropped while a request posted on it is pending.
use rdma_dmabuf::*;
fn f(qp: QueuePair, region: MemoryRegion<HostBuffer>) {
    let pending = qp.post_send(region, None).unwrap();
    drop(qp);
    let _done = pending.spin();
}
fn main() {}
