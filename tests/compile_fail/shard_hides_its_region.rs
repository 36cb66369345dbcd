// A shard never hands out its whole region (a sibling's bytes may be with the NIC): the
// accessor the posts use cannot be called from outside the crate.
use rdma_dmabuf::*;
fn f(shard: &Shard<HostBuffer>) {
    let (region, _range) = shard.lent(rdma_dmabuf::part::sealed::TOKEN);
    let _all = region.bytes();
}
fn main() {}
