//! Host memory another owner holds (`HostBuffer::from_foreign`): registered in place, of any
//! alignment and length; the NIC writes the owner's own bytes; the owner is dropped only with
//! the buffer, after the region is deregistered. The VM tests run in the testbed; the
//! argument checks run anywhere.

use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::{Access, ErrorKind, HostBuffer, Local, MemoryRegion};
use std::ptr::NonNull;
use std::sync::Arc;

/// A heap allocation owned by a value that counts its holders: `Arc::strong_count` tells
/// when the buffer has dropped its owner.
struct Owned {
    bytes: Box<[u8]>,
    _alive: Arc<()>,
}

/// `len` bytes at an odd offset of a heap allocation, as foreign memory; the `Arc` whose count
/// says whether the owner is still held.
fn foreign(len: usize, offset: usize) -> (HostBuffer, Arc<()>) {
    let alive = Arc::new(());
    let mut owned = Owned {
        bytes: vec![0u8; len + offset].into_boxed_slice(),
        _alive: alive.clone(),
    };
    let ptr = NonNull::new(owned.bytes[offset..].as_mut_ptr()).unwrap();
    // SAFETY: the bytes are a boxed slice the owner keeps, at that address (moving the
    // owner moves only the box's pointer), until the owner drops with the buffer; this test
    // makes slices of them only through the buffer, while nothing else touches them.
    let buf = unsafe { HostBuffer::from_foreign(ptr, len, Box::new(owned)) }.unwrap();
    (buf, alive)
}

#[test]
fn foreign_memory_of_no_bytes_or_past_the_address_space_is_refused() {
    for (addr, len) in [
        (4096usize, 0usize),
        (usize::MAX - 10, 100),
        (8, usize::MAX / 2 + 1),
    ] {
        let ptr = NonNull::new(addr as *mut u8).unwrap();
        // SAFETY: refused before anything is kept or read (the checks come first).
        let e = unsafe { HostBuffer::from_foreign(ptr, len, Box::new(())) }.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{addr:#x}+{len}: {e}");
    }
}

#[test]
fn a_foreign_buffer_gives_its_bytes_and_drops_its_owner_with_it() {
    let (mut buf, alive) = foreign(1000, 3);
    assert!(buf.is_foreign());
    assert_eq!(buf.len(), 1000);
    buf.as_mut_slice()[999] = 7;
    assert_eq!(buf.as_slice()[999], 7);
    assert_eq!(Arc::strong_count(&alive), 2, "the owner is held");
    drop(buf);
    assert_eq!(
        Arc::strong_count(&alive),
        1,
        "the owner went with the buffer"
    );
}

/// A foreign, unaligned region of an odd length is written by the NIC and read back, and
/// its owner is released only when the region has given the buffer back and it drops.
#[test]
#[ignore = "needs the testbed VM"]
fn the_nic_writes_foreign_memory_in_place() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, _b) = loopback_pair(&pd);
    let len = 3 * 4096 + 123;
    let data = pattern(len, 5);
    let src = host_region(&pd, &data, len, Access::empty());
    let (buf, alive) = foreign(len, 5);
    let dst = MemoryRegion::register(
        &pd,
        buf,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
    )
    .unwrap();
    assert_eq!(dst.len(), len as u64);
    let remote = dst.remote().unwrap();
    let done = a
        .post_write(Local::new(src, 0..len as u64), remote, None)
        .expect("post the write")
        .spin()
        .expect("the write completes");
    drop(done);
    assert_eq!(
        Arc::strong_count(&alive),
        2,
        "registered: the owner is held"
    );
    let buf = dst.into_inner().unwrap();
    assert!(
        buf.as_slice() == data.as_slice(),
        "the bytes landed in place"
    );
    assert_eq!(Arc::strong_count(&alive), 2, "still held by the buffer");
    drop(buf);
    assert_eq!(Arc::strong_count(&alive), 1, "released with the buffer");
}
