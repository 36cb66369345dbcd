// A task that holds a Pending across an await borrows a QueuePair, which is not Sync: it is
// not Send, so tokio::spawn refuses it (run it with spawn_local on a LocalSet instead).
use rdma_dmabuf::*;
fn f(qp: QueuePair, region: MemoryRegion<HostBuffer>) {
    tokio::spawn(async move {
        let pending = qp.post_send(region, None).unwrap();
        pending.await
    });
}
fn main() {}
