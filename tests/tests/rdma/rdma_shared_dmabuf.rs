//! One dma-buf registered in two protection domains at once (`SharedDmaBuf`,
//! `MemoryRegion::register_shared_dmabuf`), as the transfer engine registers a segment on
//! every NIC: both regions reach the same bytes, neither gives the CPU access, and the
//! `DmaBuf` (with its CPU access) comes back only after the last region over it is
//! deregistered. The same for host memory (`SharedHostBuffer`,
//! `MemoryRegion::register_shared_host`). Runs in the testbed VM.

use drm_export::Udmabuf;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd, read_remote};
use rdma_dmabuf::{Access, HostBuffer, Local, MemoryRegion, SharedDmaBuf, SharedHostBuffer};

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const SIZE: u64 = 64 << 10;

#[test]
#[ignore = "needs the testbed VM"]
fn shared_dmabuf_registers_in_two_domains_and_comes_back_after_the_last_region() {
    let tb = Testbed::get();
    let (pd1, pd2) = (pd(&tb), pd(&tb));
    let u = Udmabuf::new(SIZE).expect("udmabuf");
    nix::sys::uio::pwrite(u.memfd(), &pattern(SIZE as usize, 3), 0).unwrap();
    let (_memfd, dmabuf) = u.into_parts();
    let shared = SharedDmaBuf::new(dmabuf);
    let r1 = MemoryRegion::register_shared_dmabuf(&pd1, &shared, 0, SIZE, None, RW).unwrap();
    let r2 = MemoryRegion::register_shared_dmabuf(&pd2, &shared, 0, SIZE, None, RW).unwrap();
    assert_eq!(shared.holders(), 3, "the handle and one per region");

    // Each domain reads the buffer's bytes through its own region.
    let (a1, _b1) = loopback_pair(&pd1);
    let (a2, _b2) = loopback_pair(&pd2);
    let want = pattern(SIZE as usize, 3);
    assert_eq!(read_remote(&pd1, &a1, r1.remote().unwrap()), want);
    assert_eq!(read_remote(&pd2, &a2, r2.remote().unwrap()), want);
    // A write through the second domain's region is seen through the first's.
    let src = host_region(&pd2, &[0xab; 4096], 4096, Access::empty());
    a2.post_write(Local::new(src, 0..4096), r2.remote().unwrap(), None)
        .unwrap()
        .spin()
        .unwrap();
    let seen = read_remote(&pd1, &a1, r1.remote().unwrap());
    assert!(seen[..4096].iter().all(|&b| b == 0xab));
    assert_eq!(seen[4096..], want[4096..]);

    // The buffer does not come back while a region (or another handle) holds it.
    let shared = shared.try_into_inner().unwrap_err();
    let h1 = r1.into_inner().unwrap();
    let shared = shared.try_into_inner().unwrap_err();
    drop(h1);
    let shared = shared.try_into_inner().unwrap_err();
    drop(r2);
    assert_eq!(shared.holders(), 1);
    let mut dmabuf = shared.try_into_inner().expect("the last handle");
    let bytes = dmabuf.map().unwrap().read().unwrap().to_vec();
    assert!(bytes[..4096].iter().all(|&b| b == 0xab));
    assert_eq!(bytes[4096..], want[4096..]);
}

#[test]
#[ignore = "needs the testbed VM"]
fn shared_host_buffer_registers_in_two_domains_and_comes_back_after_the_last_region() {
    let tb = Testbed::get();
    let (pd1, pd2) = (pd(&tb), pd(&tb));
    let want = pattern(SIZE as usize, 5);
    let mut h = HostBuffer::new(SIZE as usize).expect("host buffer");
    h.as_mut_slice().copy_from_slice(&want);
    let shared = SharedHostBuffer::new(h);
    let r1 = MemoryRegion::register_shared_host(&pd1, &shared, RW).unwrap();
    let r2 = MemoryRegion::register_shared_host(&pd2, &shared, RW).unwrap();
    assert_eq!(shared.holders(), 3, "the handle and one per region");
    assert_eq!((r1.addr(), r1.len()), (r2.addr(), SIZE));
    assert_ne!(r1.rkey(), r2.rkey());
    // Remote write without local write is refused, as for a HostBuffer.
    assert!(MemoryRegion::register_shared_host(&pd1, &shared, Access::REMOTE_WRITE).is_err());
    assert_eq!(
        shared.holders(),
        3,
        "a refused registration keeps no handle"
    );

    let (a1, _b1) = loopback_pair(&pd1);
    let (a2, _b2) = loopback_pair(&pd2);
    assert_eq!(read_remote(&pd1, &a1, r1.remote().unwrap()), want);
    assert_eq!(read_remote(&pd2, &a2, r2.remote().unwrap()), want);
    let src = host_region(&pd2, &[0xcd; 4096], 4096, Access::empty());
    a2.post_write(Local::new(src, 0..4096), r2.remote().unwrap(), None)
        .unwrap()
        .spin()
        .unwrap();
    let seen = read_remote(&pd1, &a1, r1.remote().unwrap());
    assert!(seen[..4096].iter().all(|&b| b == 0xcd));
    assert_eq!(seen[4096..], want[4096..]);

    let shared = shared.try_into_inner().unwrap_err();
    let h1 = r1.into_inner().unwrap();
    let shared = shared.try_into_inner().unwrap_err();
    drop(h1);
    drop(r2);
    let back = shared.try_into_inner().expect("the last handle");
    assert!(back.as_slice()[..4096].iter().all(|&b| b == 0xcd));
    assert_eq!(back.as_slice()[4096..], want[4096..]);
}
