// In a scope, the CPU cannot write a host region the NIC is reading.
use rdma_dmabuf::*;
fn f(qp: &QueuePair, mut region: MemoryRegion<HostBuffer>) {
    scope(|s| {
        let p = s.send(qp, region.part(0..64), None).unwrap();
        region.bytes_mut().unwrap()[0] = 1;
        p.spin()
    });
}
fn main() {}
