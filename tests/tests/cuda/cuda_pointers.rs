//! Any CUDA device pointer as a registered region (`CudaDevice::export_range`), against the
//! stand-in libcuda (memfd + udmabuf "device memory", loaded through `DRM_EXPORT_LIBCUDA` as
//! libcuda would be): these tests exercise this project's code, not NVIDIA's driver. Ranges
//! at odd offsets, across page (export granularity) boundaries, at an allocation's start and
//! end are registered with `iova = ptr` on rxe, RDMA-written and -read by a second queue pair,
//! and every byte, with the bytes around the range, checked through the stand-in's host view;
//! ranges across the seams of several mappings of one virtual range likewise; bad, freed,
//! host and managed pointers, ranges past an allocation or into a neighbouring one are
//! refused with typed errors; the registration cache, keyed on the buffer id,
//! registers afresh when an address is freed and allocated again. Runs in the testbed VM.

use drm_export::cuda::RangeParts;
use drm_export::{CudaRefusal, DmaBuf, Error};
use integration_tests::cuda_standin::{device, standin, vouch_small_pages, Kind};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{host_region, loopback_pair, pattern, pd, read_remote};
use rdma_dmabuf::{
    Access, BufferKey, CacheKey, CacheLimits, Local, MemoryRegion, ProtectionDomain,
    RegistrationCache, RemoteRegion,
};
use std::sync::Arc;

const RW: Access = Access::LOCAL_WRITE
    .union(Access::REMOTE_WRITE)
    .union(Access::REMOTE_READ);
const PAGE: u64 = 4096;

/// Registers exactly the exported range, at `iova = ptr`.
fn register(pd: &Arc<ProtectionDomain>, r: drm_export::cuda::CudaRange) -> MemoryRegion<DmaBuf> {
    let RangeParts {
        mut dmabuf,
        offset,
        len,
        iova,
        ..
    } = r.into_parts();
    // The stand-in's udmabufs come from another library: whether their pages are small is
    // vouched for here (rxe copies through udmabuf's kernel mapping, wrong for large pages on
    // this kernel).
    vouch_small_pages(&mut dmabuf);
    MemoryRegion::register_dmabuf(pd, dmabuf, offset, len, Some(iova), RW)
        .unwrap_or_else(|e| panic!("register {len} bytes at {iova:#x}: {e}"))
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_pointers_anywhere_in_an_allocation_are_registered_and_moved_byte_for_byte() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let s = standin();
    let dev = device();
    let size = 1u64 << 20;
    let plain = s.alloc(size as usize, 1, Kind::Device);
    // Four physical mappings of 256 KiB under one virtual range (cuMemMap, as PyTorch's
    // expandable segments are): a range may run across their seams.
    let (mapped, quarter) = (s.alloc(size as usize, 4, Kind::Device), size / 4);
    let cases: [(u64, u64, u64, &str); 10] = [
        (plain, 0, PAGE, "the first page"),
        (plain, 0, 100, "the start, short"),
        (plain, 13, 1000, "an odd offset in the first page"),
        (plain, PAGE - 7, 20, "across one page boundary"),
        (
            plain,
            3 * PAGE + 5,
            2 * PAGE + 3,
            "across two page boundaries",
        ),
        (plain, size - 33, 33, "the end"),
        (
            plain,
            size - 2 * PAGE - 1,
            2 * PAGE + 1,
            "the end, across pages",
        ),
        (mapped, quarter - 7, 20, "across the seam of two mappings"),
        (
            mapped,
            quarter - 5,
            2 * quarter + 10,
            "across three mappings",
        ),
        (mapped, 0, size, "all four mappings"),
    ];
    for (i, (base, at, len, what)) in cases.into_iter().enumerate() {
        let ptr = base + at;
        let n = len as usize;
        // Guard bytes everywhere, so a byte written outside the range shows.
        s.write(base, &vec![0xee; size as usize]);
        let range = dev
            .export_range(ptr, len)
            .unwrap_or_else(|e| panic!("{what}: export: {e}"));
        let first = ptr - ptr % PAGE;
        let end = (ptr + len).div_ceil(PAGE) * PAGE;
        assert_eq!(range.dmabuf().size(), end - first, "{what}: covering pages");
        assert_eq!(range.offset(), ptr - first, "{what}: offset in the dma-buf");
        let region = register(&pd, range);
        let remote = region.remote().unwrap();
        assert_eq!(
            (remote.addr, remote.len),
            (ptr, len),
            "{what}: peers address it by device pointer"
        );

        // The peer writes the range.
        let p1 = pattern(n, i as u8);
        let src = host_region(&pd, &p1, n, Access::empty());
        peer.post_write(Local::new(src, 0..len), remote, None)
            .unwrap()
            .spin()
            .unwrap_or_else(|e| panic!("{what}: write: {}", e.error));
        let seen = s.read(base, size as usize);
        assert!(seen[at as usize..][..n] == p1[..], "{what}: written bytes");
        assert!(
            seen[..at as usize].iter().all(|&b| b == 0xee)
                && seen[(at + len) as usize..].iter().all(|&b| b == 0xee),
            "{what}: nothing outside the range moved"
        );

        // The GPU's side changes it; the peer reads it, at a device pointer inside the range.
        let p2 = pattern(n, i as u8 + 100);
        s.write(ptr, &p2);
        let skip = len / 3;
        let back = host_region(&pd, &[], n, Access::LOCAL_WRITE);
        let inner = RemoteRegion {
            addr: ptr + skip,
            len: len - skip,
            rkey: remote.rkey,
        };
        let back = peer
            .post_read(Local::new(back, 0..len - skip), inner)
            .unwrap()
            .spin()
            .unwrap_or_else(|e| panic!("{what}: read: {}", e.error));
        assert!(
            back.region.bytes().unwrap()[..n - skip as usize] == p2[skip as usize..],
            "{what}: read back from ptr + {skip}"
        );
        drop(region);
    }
    s.free(plain);
    s.free(mapped);
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_pointers_that_cannot_be_exported_are_refused_with_typed_errors() {
    let _tb = Testbed::get();
    let s = standin();
    let dev = device();
    let refusal = |ptr: u64, len: u64| match dev.export_range(ptr, len) {
        Err(Error::CudaPointer { why, .. }) => why,
        other => panic!("{ptr:#x} + {len}: expected a refusal, got {other:?}"),
    };
    let size = 64 * PAGE;
    let base = s.alloc(size as usize, 1, Kind::Device);
    assert!(matches!(
        refusal(0x1234, 8),
        CudaRefusal::NotCudaMemory { .. }
    ));
    assert_eq!(refusal(base, 0), CudaRefusal::EmptyOrWrapping);
    assert_eq!(refusal(base + 8, u64::MAX), CudaRefusal::EmptyOrWrapping);
    assert_eq!(
        refusal(base + size - 10, 11),
        CudaRefusal::PastAllocation { base, size }
    );
    let e = dev.export_range(base + 1, size).unwrap_err().to_string();
    assert!(e.contains("past the end of its allocation"), "{e}");

    let freed = s.alloc(size as usize, 1, Kind::Device);
    s.free(freed);
    assert!(matches!(
        refusal(freed + 100, 8),
        CudaRefusal::NotCudaMemory { .. }
    ));

    let host = s.alloc(size as usize, 1, Kind::Host);
    assert_eq!(refusal(host, PAGE), CudaRefusal::HostMemory);
    let e = dev.export_range(host, PAGE).unwrap_err().to_string();
    assert!(
        e.contains("HostBuffer"),
        "the hint names the host path: {e}"
    );
    let managed = s.alloc(size as usize, 1, Kind::Managed);
    assert_eq!(refusal(managed + 5, PAGE), CudaRefusal::ManagedMemory);

    // Two physical mappings of 32 pages each under one virtual range: each is an allocation
    // of its own, as NVIDIA's driver reports them, and a range across the seam is exported
    // (moved byte for byte across seams in the test above).
    let vmm = s.alloc(size as usize, 2, Kind::Device);
    let half = size / 2;
    let info = dev.pointer_info(vmm + half + 1).unwrap();
    assert_eq!((info.alloc_base, info.alloc_size), (vmm + half, half));
    assert_eq!(info.mapping, (vmm + half, half));
    for (at, len) in [
        (1, half - 1),
        (half, PAGE + 3),
        (size - 5, 5),
        (half - 4, 8),
        (1, size - 1),
    ] {
        let r = dev
            .export_range(vmm + at, len)
            .unwrap_or_else(|e| panic!("segment range {at} + {len}: {e}"));
        assert_eq!(r.ptr(), vmm + at);
    }
    assert_eq!(
        refusal(vmm + size - 4, 8),
        CudaRefusal::PastAllocation {
            base: vmm + half,
            size: half
        }
    );
    // Two neighbouring allocations: a range from one into the other is refused as crossing,
    // one past the last into nothing as past its allocation.
    let two_mib = 2u64 << 20;
    let blocks: Vec<u64> = (0..4)
        .map(|_| s.alloc(two_mib as usize, 1, Kind::Device))
        .collect();
    let (a, b) = blocks
        .iter()
        .find_map(|&a| blocks.iter().find(|&&b| b == a + two_mib).map(|&b| (a, b)))
        .expect("two neighbouring allocations");
    assert_eq!(
        refusal(a + two_mib - 4, 8),
        CudaRefusal::CrossesAllocations {
            base: a,
            size: two_mib
        }
    );
    let e = dev.export_range(a + 1, two_mib).unwrap_err().to_string();
    assert!(e.contains("into a neighbouring one"), "{e}");
    s.free(b);
    assert_eq!(
        refusal(a + two_mib - 4, 8),
        CudaRefusal::PastAllocation {
            base: a,
            size: two_mib
        }
    );
    for p in blocks.into_iter().filter(|&p| p != b) {
        s.free(p);
    }
    for p in [base, host, managed, vmm] {
        s.free(p);
    }
}

/// A cached checkout under a CUDA key, whose memory the cache cannot check.
fn checkout(
    cache: &RegistrationCache,
    key: CacheKey,
    export: impl FnOnce() -> rdma_dmabuf::Result<(DmaBuf, u64)>,
) -> rdma_dmabuf::Result<rdma_dmabuf::Checkout> {
    // SAFETY: every export given here is `export_range` of the key's address and length,
    // and the key's buffer id is the one `pointer_info` gave for that address just before.
    unsafe { cache.checkout_with_unchecked(key, export) }
}

#[test]
#[ignore = "needs the testbed VM"]
fn cached_cuda_registrations_never_outlive_their_allocation_at_a_reused_address() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (peer, _owner) = loopback_pair(&pd);
    let s = standin();
    let dev = device();
    let cache = RegistrationCache::new(&pd, CacheLimits::default());
    let size = 16 * PAGE as usize;
    let (at, len) = (100u64, 3 * PAGE);
    // The key asks the driver for the allocation's buffer id before every checkout.
    let key = |ptr: u64| CacheKey {
        buffer: BufferKey::Cuda {
            buffer_id: dev.pointer_info(ptr).unwrap().buffer_id,
        },
        offset: ptr,
        len,
        iova: ptr,
        access: RW,
    };
    let dev2 = &dev;
    let export = |ptr: u64| {
        move || {
            let r = dev2
                .export_range(ptr, len)
                .map_err(|e| rdma_dmabuf::Error::Adopt(Box::new(e)))?;
            let RangeParts {
                mut dmabuf, offset, ..
            } = r.into_parts();
            vouch_small_pages(&mut dmabuf);
            Ok((dmabuf, offset))
        }
    };
    let read = |c: &rdma_dmabuf::Checkout| read_remote(&pd, &peer, c.remote().unwrap());

    let first = s.alloc(size, 1, Kind::Device);
    let ptr = first + at;
    s.write(first, &pattern(size, 1));
    let old = key(ptr);
    let c = checkout(&cache, old, export(ptr)).unwrap();
    assert_eq!(c.addr(), ptr);
    assert_eq!(read(&c), pattern(size, 1)[at as usize..][..len as usize]);
    drop(c);
    drop(checkout(&cache, key(ptr), export(ptr)).unwrap());
    assert_eq!((cache.stats().hits, cache.stats().misses), (1, 1));

    // Freed, and the address given to a new allocation with other bytes.
    s.free(first);
    let second = s.alloc(size, 1, Kind::Device);
    assert_eq!(second, first, "the stand-in reuses the address");
    s.write(second, &pattern(size, 2));
    let new = key(ptr);
    assert_ne!(new, old, "a new buffer id");
    let c = checkout(&cache, new, export(ptr)).unwrap();
    assert_eq!(cache.stats().misses, 2, "registered afresh");
    assert_eq!(read(&c), pattern(size, 2)[at as usize..][..len as usize]);
    drop(c);
    // What a key of the address alone would have handed out: the freed allocation's memory
    // (kept by its dma-buf), not the new one's.
    let stale = checkout(&cache, old, || {
        panic!("the old registration is still cached")
    })
    .unwrap();
    assert_eq!(
        read(&stale),
        pattern(size, 1)[at as usize..][..len as usize]
    );
    drop(stale);
    s.free(second);
}

#[test]
#[ignore = "needs the testbed VM"]
fn cuda_buffers_fill_copy_export_and_export_a_part_by_pointer() {
    let _tb = Testbed::get();
    let s = standin();
    let dev = device();
    let buf = drm_export::cuda::CudaBuffer::new(&dev, 3 * PAGE as usize + 1).unwrap();
    assert_eq!(buf.size(), 4 * PAGE as usize);
    assert_eq!(buf.ptr() % PAGE, 0);
    buf.fill(0xab).unwrap();
    assert!(s.read(buf.ptr(), buf.size()).iter().all(|&b| b == 0xab));
    let p = pattern(buf.size(), 9);
    buf.copy_from_host(&p).unwrap();
    let mut out = vec![0; buf.size()];
    buf.copy_to_host(&mut out).unwrap();
    assert_eq!(out, p);
    assert!(matches!(
        buf.copy_from_host(&vec![0; buf.size() + 1]),
        Err(Error::InvalidArgument { .. })
    ));
    let whole = buf.export().unwrap();
    assert_eq!(
        (whole.size(), whole.exporter()),
        (buf.size() as u64, "udmabuf")
    );
    let part = dev.export_range(buf.ptr() + PAGE + 1, 10).unwrap();
    assert_eq!((part.dmabuf().size(), part.offset()), (PAGE, 1));
    let id = dev.pointer_info(buf.ptr()).unwrap().buffer_id;
    assert_eq!(part.buffer_id(), id);
    // Freed first: the dma-bufs keep their memory, the pointer is gone.
    let ptr = buf.ptr();
    drop(buf);
    assert!(matches!(
        dev.export_range(ptr, 1),
        Err(Error::CudaPointer { .. })
    ));
    drop((whole, part));
}
