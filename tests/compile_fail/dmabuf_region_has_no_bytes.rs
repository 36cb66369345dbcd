// A dma-buf region has no CPU slice.
use rdma_dmabuf::*;
fn f(region: MemoryRegion<DmaBuf>) {
    let _bytes = region.bytes();
}
fn main() {}
