// While a region is shared for NIC reads, the CPU cannot write it: neither the share nor
// a lease hands out the region exclusively, even with every lease in flight.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>, remote: RemoteRegion) {
    let shared = region.share();
    let _reading = qp.post_write_parts([shared.lease(0..64)], remote, None).unwrap();
    shared.region().bytes_mut().unwrap()[0] = 1;
}
fn main() {}
