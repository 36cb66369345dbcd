// What the NIC writes (a receive, a read) needs the region exclusively: a shared part does
// not convert into the PartMut a scoped receive takes.
use rdma_dmabuf::{scope, HostBuffer, MemoryRegion, QueuePair};
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>) {
    scope(|s| {
        let p = s.recv(qp, region.part(0..64)).unwrap();
        p.spin()
    })
    .unwrap();
}
fn main() {}
