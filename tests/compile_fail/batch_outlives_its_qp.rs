// A batch's handle borrows its queue pair: the regions cannot come back through a queue
// pair's drop while the batch is in flight.
use rdma_dmabuf::*;
fn f(qp: QueuePair, a: MemoryRegion<HostBuffer>, r: RemoteRegion) {
    let pending = qp.post_write_batch([a], [r]).unwrap();
    drop(qp);
    let _ = pending.spin();
}
fn main() {}
