// A region shared for NIC reads cannot be lent to a request whose NIC writes the local
// bytes: a source is not an exclusive part, so an RDMA read into one does not compile.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>, remote: RemoteRegion) {
    let shared = region.share();
    let _writing = qp.post_read_parts([shared.lease(0..64)], remote);
}
fn main() {}
