//! `CudaDevice::export_range` and `CudaBuffer` against NVIDIA's real driver, on a real GPU:
//! how the driver reports allocations, mappings and buffer ids for memory of every kind a
//! program already has, which ranges it exports, and what a CPU mapping of its dma-bufs
//! does. The integration tests' `cuda_pointers` runs the same calls in the testbed against a
//! stand-in libcuda, with RDMA; this machine-only test has no NIC to register with, so it
//! checks everything up to the registration's arguments.
//!
//! Built only with feature `gpu-tests` (the testbed runs every ignored test of the
//! workspace): `cargo test -p drm-export --features gpu-tests --test cuda_driver -- --ignored
//! --test-threads 1 --nocapture`. Lines starting `driver:` are what the driver did, for the
//! report in docs/hardware.md.
#![cfg(feature = "gpu-tests")]
// The findings are the test's report.
#![allow(clippy::print_stderr)]

mod raw;

use drm_export::cuda::{CudaBuffer, CudaDevice, CudaRange};
use drm_export::{CudaRefusal, Error, FenceAccess};
use raw::Raw;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

fn open() -> (Arc<CudaDevice>, Raw) {
    let dev = CudaDevice::open(0).expect("CUDA device 0 with dma-buf support");
    (dev, Raw::load())
}

fn refusal(dev: &CudaDevice, ptr: u64, len: u64) -> CudaRefusal {
    match dev.export_range(ptr, len) {
        Err(Error::CudaPointer { why, .. }) => why,
        other => panic!("{ptr:#x} + {len}: expected a refusal, got {other:?}"),
    }
}

/// Checks what the registration of `r` would be given: the covering pages, the offset.
fn check_range(r: &CudaRange, ptr: u64, len: u64, what: &str) {
    let first = ptr - ptr % PAGE;
    let end = (ptr + len).div_ceil(PAGE) * PAGE;
    assert_eq!(r.dmabuf().size(), end - first, "{what}: covering pages");
    assert_eq!(r.offset(), ptr - first, "{what}: offset in the dma-buf");
    assert_eq!(
        (r.ptr(), r.len()),
        (ptr, len),
        "{what}: the range asked for"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn device_pointers_anywhere_in_an_allocation_export_their_covering_pages() {
    let (dev, raw) = open();
    let size = 1u64 << 20;
    let base = raw.alloc(size as usize);
    let info = dev.pointer_info(base + 12345).unwrap();
    eprintln!("driver: cuMemAlloc(1 MiB) = {base:#x}, pointer_info {info:x?}");
    assert_eq!((info.alloc_base, info.alloc_size), (base, size));
    let (m, m_len) = info.mapping;
    assert!(
        m <= base && m + m_len >= base + size,
        "the mapping holds the allocation"
    );
    let cases: [(u64, u64, &str); 7] = [
        (0, PAGE, "the first page"),
        (0, 100, "the start, short"),
        (13, 1000, "an odd offset in the first page"),
        (PAGE - 7, 20, "across one page boundary"),
        (3 * PAGE + 5, 2 * PAGE + 3, "across two page boundaries"),
        (size - 33, 33, "the end"),
        (size - 2 * PAGE - 1, 2 * PAGE + 1, "the end, across pages"),
    ];
    let mut ids = std::collections::HashSet::new();
    for (at, len, what) in cases {
        let r = dev
            .export_range(base + at, len)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        check_range(&r, base + at, len, what);
        assert_eq!(r.buffer_id(), info.buffer_id, "{what}: buffer id");
        assert!(
            ids.insert(r.dmabuf().buffer_id()),
            "{what}: a dma-buf of its own"
        );
        if at == 13 {
            eprintln!(
                "driver: exporter name {:?}, dma-buf identity {:?}",
                r.dmabuf().exporter(),
                r.dmabuf().buffer_id()
            );
        }
    }
    // CPU access: nv_dmabuf refuses mmap with the kernel-internal ENOTSUPP (524), which must
    // reach the caller as itself, with the hint (not errno 0, "Success"). Its fences work.
    let mut buf = dev.export_range(base, PAGE).unwrap().into_parts().dmabuf;
    match buf.map() {
        Err(e @ Error::Os { .. }) => {
            eprintln!("driver: a CPU mapping of the dma-buf: {e}");
            let Error::Os { source, hint, .. } = &e else {
                unreachable!()
            };
            assert_eq!(source.raw_os_error(), Some(524), "{e}");
            assert!(hint.is_some_and(|h| h.contains("cuMemcpy")), "{e}");
        }
        Ok(m) => panic!("nv_dmabuf mapped {} bytes for the CPU", m.len()),
        Err(e) => panic!("an unexpected error: {e:?}"),
    }
    let fence = buf.export_sync_file(FenceAccess::Write);
    eprintln!(
        "driver: export_sync_file -> {:?}",
        fence.as_ref().map(|f| f.is_signalled())
    );
    drop((fence, buf));

    // From another thread: the context is bound per call.
    let d2 = dev.clone();
    let r = std::thread::spawn(move || d2.export_range(base + 5 * PAGE + 1, 3 * PAGE))
        .join()
        .unwrap()
        .expect("export from another thread");
    check_range(&r, base + 5 * PAGE + 1, 3 * PAGE, "another thread");

    // A large allocation, near its end and across its middle.
    let big = 64u64 << 20;
    let b = raw.alloc(big as usize);
    for (at, len) in [(big - 5, 5), (big / 2 - 3, 6), (1, big - 1)] {
        let r = dev.export_range(b + at, len).unwrap();
        check_range(&r, b + at, len, "64 MiB allocation");
    }
    raw.free(b);
    raw.free(base);
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn pages_shared_with_other_allocations_are_refused_and_buffers_align_themselves() {
    // The driver packs small allocations 512 bytes apart in a 2 MiB block: the page of a
    // 100-byte allocation holds the next ones, so its export would hand them out too; and a
    // page-sized allocation made after them can start mid-page.
    let (dev, raw) = open();
    let small: Vec<u64> = (0..4).map(|_| raw.alloc(100)).collect();
    eprintln!("driver: four cuMemAlloc(100): {small:#x?}");
    for &p in &small {
        let why = refusal(&dev, p, 100);
        assert!(matches!(why, CudaRefusal::SharesPages { .. }), "{why}");
    }
    let buf = CudaBuffer::new(&dev, PAGE as usize).unwrap();
    eprintln!(
        "driver: a CudaBuffer of one page after them: {:#x}",
        buf.ptr()
    );
    assert_eq!(buf.ptr() % PAGE, 0, "CudaBuffer aligns itself");
    assert_eq!(buf.export().expect("its whole page exports").size(), PAGE);
    let r = dev.export_range(buf.ptr() + 5, 10).unwrap();
    check_range(&r, buf.ptr() + 5, 10, "inside the buffer's own page");
    for size in [PAGE + 1, 3 * PAGE, 2 * PAGE + 100] {
        let p = raw.alloc(size as usize);
        let info = dev.pointer_info(p).unwrap();
        let got = dev.export_range(p, size);
        eprintln!(
            "driver: cuMemAlloc({size}) = {p:#x} (page offset {}), range {:#x}+{}, mapping \
             {:x?}; export_range(p, {size}) -> {}",
            p % PAGE,
            info.alloc_base,
            info.alloc_size,
            info.mapping,
            match &got {
                Ok(r) => format!("ok, dma-buf of {} bytes", r.dmabuf().size()),
                Err(e) => format!("error: {e}"),
            }
        );
        if p % PAGE == 0 && size % PAGE == 0 {
            check_range(&got.unwrap(), p, size, "whole pages");
        } else {
            assert!(
                matches!(
                    got,
                    Err(Error::CudaPointer {
                        why: CudaRefusal::SharesPages { .. },
                        ..
                    })
                ),
                "{got:?}"
            );
        }
        // One byte more: past the allocation, into a neighbour, or (mid-page) shared pages.
        let why = refusal(&dev, p, size + 1);
        assert!(
            matches!(
                why,
                CudaRefusal::PastAllocation { .. }
                    | CudaRefusal::CrossesAllocations { .. }
                    | CudaRefusal::SharesPages { .. }
            ),
            "{why}"
        );
        raw.free(p);
    }
    drop(buf);
    for p in small {
        raw.free(p);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn memory_that_cannot_be_exported_is_refused_with_typed_errors() {
    let (dev, raw) = open();
    let size = 64 * PAGE;
    assert!(matches!(
        refusal(&dev, 0x1234, 8),
        CudaRefusal::NotCudaMemory { .. }
    ));
    let on_stack = 0u64;
    let why = refusal(&dev, &on_stack as *const u64 as u64, 8);
    eprintln!("driver: a stack address: {why}");
    assert!(matches!(why, CudaRefusal::NotCudaMemory { .. }));
    let base = raw.alloc(size as usize);
    assert_eq!(refusal(&dev, base, 0), CudaRefusal::EmptyOrWrapping);
    assert_eq!(
        refusal(&dev, base + 8, u64::MAX),
        CudaRefusal::EmptyOrWrapping
    );
    assert_eq!(
        refusal(&dev, base + size - 10, 11),
        CudaRefusal::PastAllocation { base, size }
    );
    raw.free(base);
    let why = refusal(&dev, base + 100, 8);
    eprintln!("driver: a freed pointer: {why}");
    assert!(matches!(why, CudaRefusal::NotCudaMemory { .. }));

    let host = raw.alloc_host(size as usize);
    assert_eq!(refusal(&dev, host, PAGE), CudaRefusal::HostMemory);
    raw.free_host(host);
    let managed = raw.alloc_managed(size as usize);
    assert_eq!(refusal(&dev, managed + 5, PAGE), CudaRefusal::ManagedMemory);
    raw.free(managed);

    // Stream-ordered pool memory (cudaMallocAsync, PyTorch's optional allocator backend).
    let pooled = raw.alloc_async(size as usize);
    let info = dev.pointer_info(pooled + 1);
    let got = dev.export_range(pooled + 1, 2 * PAGE);
    eprintln!(
        "driver: pool memory at {pooled:#x}: pointer_info {info:x?}; export_range -> {}",
        match &got {
            Ok(r) => format!("ok, dma-buf of {} bytes", r.dmabuf().size()),
            Err(e) => format!("error: {e}"),
        }
    );
    match got {
        Ok(r) => check_range(&r, pooled + 1, 2 * PAGE, "pool memory"),
        Err(Error::Os { .. } | Error::CudaPointer { .. }) => {}
        Err(e) => panic!("an unexpected error: {e:?}"),
    }
    raw.free_async(pooled);
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn mappings_of_several_physical_allocations_are_exported_one_mapping_at_a_time() {
    let (dev, raw) = open();
    eprintln!(
        "driver: GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = {:?}",
        raw.device_attribute(raw::ATTR_RDMA_WITH_VMM)
    );
    for rdma in [true, false] {
        let g = raw.granularity(rdma) as u64;
        let va = raw.reserve(2 * g as usize, g as usize);
        let h = [raw.create(g as usize, rdma), raw.create(g as usize, rdma)];
        raw.map(va, g as usize, h[0]);
        raw.map(va + g, g as usize, h[1]);
        let info = dev.pointer_info(va + g + 1).unwrap();
        eprintln!("driver: rdma flag {rdma}: granularity {g}, two mappings at {va:#x}: {info:x?}");
        assert_eq!(info.mapping, (va + g, g), "the second mapping");
        assert_eq!(
            (info.alloc_base, info.alloc_size),
            info.mapping,
            "each mapping is an allocation of its own"
        );
        // The driver exports a range across the seam as one dma-buf, and so does
        // export_range.
        for (at, len) in [(g - PAGE, 2 * PAGE), (0, 2 * g)] {
            let got = raw.dmabuf_unchecked(va + at, len as usize);
            assert!(
                got.is_ok(),
                "the driver's own export of {at:#x}+{len:#x}: {got:?}"
            );
        }
        let cases = [
            (1, g - 1),
            (g, PAGE + 3),
            (2 * g - 5, 5),
            (g - 4, 8),
            (1, 2 * g - 1),
        ];
        for (at, len) in cases {
            let r = dev
                .export_range(va + at, len)
                .unwrap_or_else(|e| panic!("rdma flag {rdma}: {at:#x}+{len:#x}: {e}"));
            check_range(&r, va + at, len, "mapped parts");
        }
        eprintln!(
            "driver: rdma flag {rdma}: {} ranges exported, 2 across the seam",
            cases.len()
        );
        assert_eq!(
            refusal(&dev, va + 2 * g - 4, 8),
            CudaRefusal::PastAllocation {
                base: va + g,
                size: g
            }
        );

        // The second mapping replaced by other physical memory at the same address.
        let ids = |p| {
            (
                raw.attribute_u64(raw::PTR_BUFFER_ID, p),
                raw.attribute_u64(raw::PTR_MEMORY_BLOCK_ID, p),
            )
        };
        let before = ids(va + g);
        raw.unmap(va + g, g as usize);
        let h2 = raw.create(g as usize, rdma);
        raw.map(va + g, g as usize, h2);
        let after = ids(va + g);
        eprintln!(
            "driver: rdma flag {rdma}: remapped: (buffer id, memory block id) {before:?} -> \
             {after:?}; the first mapping {:?}",
            ids(va)
        );
        assert_ne!(
            before.1, after.1,
            "the memory block id names the physical memory"
        );
        raw.unmap(va, 2 * g as usize);
        for h in [h[0], h[1], h2] {
            raw.release(h);
        }
        raw.address_free(va, 2 * g as usize);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn two_reservations_side_by_side() {
    // Whether anything the driver reports tells two `cuMemAddressReserve` ranges side by
    // side from the parts of one (a range may cross the seams of one, not two owners').
    let (dev, raw) = open();
    let g = raw.granularity(true) as u64;
    let whole = raw.reserve(4 * g as usize, g as usize);
    raw.address_free(whole, 4 * g as usize);
    let a = raw.reserve_at(2 * g as usize, g as usize, whole);
    let b = raw.reserve_at(2 * g as usize, g as usize, whole + 2 * g);
    eprintln!(
        "driver: reservations at {a:#x} and {b:#x} (asked {whole:#x}, +{:#x})",
        2 * g
    );
    let hs: Vec<_> = (0..4).map(|_| raw.create(g as usize, true)).collect();
    for (i, &h) in hs.iter().enumerate() {
        let base = if i < 2 { a } else { b };
        raw.map(base + (i as u64 % 2) * g, g as usize, h);
    }
    for p in [a + 1, a + g + 1, b + 1, b + g + 1] {
        eprintln!(
            "driver: {p:#x}: range start {:x?}, range size {:x?}, pointer_info {:x?}",
            raw.attribute_u64(raw::PTR_RANGE_START, p),
            raw.attribute_u64(raw::PTR_RANGE_SIZE, p),
            dev.pointer_info(p)
        );
    }
    // Across the seam inside one reservation: exported.
    let r = dev.export_range(a + g - 8, 16).unwrap();
    check_range(&r, a + g - 8, 16, "inside one reservation");
    if b == a + 2 * g {
        let across = raw.dmabuf_unchecked(a + g, 2 * g as usize);
        eprintln!(
            "driver: its own export across the two reservations: {:?}",
            across.as_ref().map(|_| "ok")
        );
        let why = refusal(&dev, b - 8, 16);
        assert!(
            matches!(why, CudaRefusal::CrossesAllocations { .. }),
            "from one reservation into the next: {why}"
        );
    }
    raw.unmap(a, 2 * g as usize);
    raw.unmap(b, 2 * g as usize);
    for h in hs {
        raw.release(h);
    }
    raw.address_free(a, 2 * g as usize);
    raw.address_free(b, 2 * g as usize);
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn a_range_into_a_neighbouring_allocation_is_refused_as_crossing() {
    let (dev, raw) = open();
    let two_mib = 2u64 << 20;
    let blocks: Vec<u64> = (0..4).map(|_| raw.alloc(two_mib as usize)).collect();
    eprintln!("driver: four 2 MiB allocations at {blocks:#x?}");
    let pair = blocks
        .iter()
        .find_map(|&a| blocks.iter().find(|&&b| b == a + two_mib).map(|&b| (a, b)));
    let (a, b) = pair.expect("two neighbouring allocations");
    let info = dev.pointer_info(a).unwrap();
    eprintln!("driver: {a:#x}: {info:x?}");
    assert_eq!(
        refusal(&dev, a + two_mib - 4, 8),
        CudaRefusal::CrossesAllocations {
            base: a,
            size: two_mib
        }
    );
    raw.free(b);
    let why = refusal(&dev, a + two_mib - 4, 8);
    eprintln!("driver: the neighbour freed: {why}");
    assert_eq!(
        why,
        CudaRefusal::PastAllocation {
            base: a,
            size: two_mib
        }
    );
    for p in blocks.into_iter().filter(|&p| p != b) {
        raw.free(p);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn a_freed_address_given_to_a_new_allocation_has_a_new_buffer_id() {
    let (dev, raw) = open();
    let size = 2usize << 20;
    let first = raw.alloc(size);
    let old = dev.pointer_info(first).unwrap().buffer_id;
    let kept = dev.export_range(first + 100, 3 * PAGE).unwrap();
    raw.free(first);
    // The dma-buf outlives the allocation (the exporter holds the memory).
    assert_eq!(kept.dmabuf().size(), 4 * PAGE);
    let mut tries = 0;
    let again = loop {
        tries += 1;
        let p = raw.alloc(size);
        if p == first || tries == 8 {
            break p;
        }
        raw.free(p);
    };
    eprintln!("driver: freed {first:#x}; after {tries} allocation(s) got {again:#x}");
    assert_eq!(again, first, "the driver gives a freed address out again");
    let new = dev.pointer_info(again).unwrap().buffer_id;
    eprintln!("driver: buffer id {old} -> {new}");
    assert_ne!(new, old, "a new buffer id at the reused address");
    drop(kept);
    raw.free(again);
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
#[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
fn what_an_export_and_a_pointer_lookup_cost() {
    let (dev, raw) = open();
    let size = 64usize << 20;
    let base = raw.alloc(size);
    for len in [64 * PAGE, 16 << 20] {
        let mut export = Vec::new();
        let mut lookup = Vec::new();
        for i in 0..200u64 {
            let p = base + (i * 4 * PAGE) % (32 << 20) + 1;
            let t = Instant::now();
            dev.pointer_info(p).unwrap();
            lookup.push(t.elapsed());
            let t = Instant::now();
            let r = dev.export_range(p, len).unwrap();
            export.push(t.elapsed());
            drop(r);
        }
        eprintln!(
            "driver: {len} bytes: export_range median {:?}, pointer_info median {:?} (200 each)",
            median(export),
            median(lookup)
        );
    }
    raw.free(base);
}
