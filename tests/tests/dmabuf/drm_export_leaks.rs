//! drm-export leak check, alone in its process (the VM runs each test file's tests in a process
//! of their own): descriptor and dma-buf counts are process- and kernel-wide, so no other test
//! may run beside it. Runs in the testbed VM.

use drm_export::{DmaHeap, DumbBuffer, Udmabuf};
use integration_tests::counts::{dmabuf_objects, open_fds};
use integration_tests::exporters::vgem_card;
use integration_tests::testbed::Testbed;

#[test]
#[ignore = "needs the testbed VM"]
fn ten_thousand_buffers_leak_no_descriptor_and_no_buffer() {
    Testbed::get();
    let card = vgem_card();
    let heap = DmaHeap::system().unwrap();
    // Warm up lazily opened descriptors, then take the baseline.
    drop(DumbBuffer::new(&card, 4096).unwrap().export().unwrap());
    let (fds, objects) = (open_fds(), dmabuf_objects());
    for i in 0..10_000u64 {
        let d = match i % 3 {
            0 => DumbBuffer::new(&card, 4096).unwrap().export().unwrap(),
            1 => Udmabuf::new(4096).unwrap().into_parts().1,
            _ => heap.allocate(4096).unwrap(),
        };
        assert_eq!(d.size(), 4096);
    }
    assert_eq!(open_fds(), fds, "descriptors back to the baseline");
    assert_eq!(
        dmabuf_objects(),
        objects,
        "dma-buf objects back to the baseline"
    );
}
