// A cached region lends no CPU access: no mapping through the checkout, nor through a region
// over a shared dma-buf (another region of the buffer may be in the NIC's hands).
use rdma_dmabuf::*;
fn f(mut c: Checkout) {
    let _m = c.map();
}
fn g(mut r: MemoryRegion<SharedDmaBuf>) {
    let _m = r.map();
}
fn main() {}
