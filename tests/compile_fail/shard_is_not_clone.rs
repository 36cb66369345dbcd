// A shard is the only handle to its bytes: it cannot be cloned, so no two owners can post
// (or touch) the same bytes at once.
use rdma_dmabuf::*;
fn f(region: MemoryRegion<HostBuffer>) {
    let shards = region.split_into_chunks(64).unwrap();
    let _twin = shards[0].clone();
}
fn main() {}
