// A shard posted in a request of several parts cannot be touched by the CPU until the
// completion hands it back.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, region: MemoryRegion<HostBuffer>, remote: RemoteRegion) {
    let mut shards = region.split_into_chunks(64).unwrap();
    let (b, a) = (shards.pop().unwrap(), shards.pop().unwrap());
    let _pending = qp.post_write_parts([a, b], remote, None).unwrap();
    let _first = a.bytes().unwrap()[0];
}
fn main() {}
