//! A host region past 1 GiB registers on rxe (kernel-patches/linux/0003: rxe's per-page array
//! of such a region is past kmalloc's largest size, so registration failed with ENOMEM and a
//! page-allocator warning, which the testbed also counts as a kernel problem). Alone in its
//! process (the VM runs each test file's tests in a process of their own): it pins a GiB of
//! the guest's memory.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::pd;
use rdma_dmabuf::{Access, HostBuffer, MemoryRegion};

#[test]
#[ignore = "needs the testbed VM"]
fn a_region_past_one_gib_registers_on_rxe() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let len = (1 << 30) + (64 << 10);
    let buf = HostBuffer::new(len).expect("map a GiB");
    let mr = MemoryRegion::register(&pd, buf, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .expect("rxe registers a region of more than 262,144 pages");
    assert_eq!(mr.len(), len as u64);
    let back = mr.into_inner().expect("deregistered");
    assert_eq!(back.len(), len);
}
