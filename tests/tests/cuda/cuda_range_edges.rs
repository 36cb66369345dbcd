//! `CudaDevice::export_range` and `pointer_info` at and around every edge of every kind of
//! allocation the stand-in libcuda makes (testbed VM; this project's code, not NVIDIA's
//! driver): single- and multi-segment device allocations, neighbours, host and managed
//! memory, and the ends of the address space, pointers and lengths swept against a model of
//! what must be exported or refused. No panic; every export holds exactly the device memory
//! of its pages (read through the dma-buf and compared with the stand-in's host view); every
//! refusal typed.

use drm_export::{CudaRefusal, Error};
use integration_tests::cuda_standin::{device, standin, Kind};
use integration_tests::testbed::Testbed;
use std::panic::{catch_unwind, AssertUnwindSafe};

const PAGE: u64 = 4096;
const TWO_MIB: u64 = 2 << 20;

/// An allocation of the stand-in, as the test made it.
#[derive(Clone, Copy, Debug)]
struct A {
    base: u64,
    seg: u64,
    nsegs: u64,
    kind: Kind,
}

impl A {
    fn size(&self) -> u64 {
        self.seg * self.nsegs
    }
    fn holds(&self, p: u64) -> bool {
        p >= self.base && p - self.base < self.size()
    }
    /// What `cuMemGetAddressRange` reports for `p` (a segment of several is an allocation).
    fn reported(&self, p: u64) -> (u64, u64) {
        if self.nsegs == 1 {
            (self.base, self.size())
        } else {
            let s = (p - self.base) / self.seg;
            (self.base + s * self.seg, self.seg)
        }
    }
}

#[derive(Debug, PartialEq)]
enum Expect {
    Export,
    Refused(CudaRefusal),
    NotCuda,
}

/// What `export_range(ptr, len)` must do, from the allocations the test made: the pages of
/// the range must be device memory of one allocation, or of the `cuMemMap`ped segments of
/// one reserved range (one stand-in allocation of several segments).
fn model(allocs: &[A], ptr: u64, len: u64) -> Expect {
    let end = ptr.checked_add(len).filter(|_| len > 0);
    let Some(end_page) = end.and_then(|e| e.checked_next_multiple_of(PAGE)) else {
        return Expect::Refused(CudaRefusal::EmptyOrWrapping);
    };
    let Some(a) = allocs.iter().find(|a| a.holds(ptr)) else {
        return Expect::NotCuda;
    };
    match a.kind {
        Kind::Managed => return Expect::Refused(CudaRefusal::ManagedMemory),
        Kind::Host => return Expect::Refused(CudaRefusal::HostMemory),
        Kind::Device => {}
    }
    let (mut at, mut piece) = (a, a.reported(ptr));
    loop {
        let (base, size) = piece;
        if end_page <= base + size {
            return Expect::Export;
        }
        if end.is_some_and(|e| e <= base + size) {
            // Only the rounding to whole pages reaches past the allocation.
            return Expect::Refused(CudaRefusal::SharesPages { base, size });
        }
        let next = base + size;
        let Some(b) = allocs
            .iter()
            .find(|b| b.holds(next) && matches!(b.kind, Kind::Device))
        else {
            return Expect::Refused(CudaRefusal::PastAllocation { base, size });
        };
        // Only the seams of one reserved range (one allocation of several segments).
        if at.nsegs == 1 || b.nsegs == 1 || b.base != at.base {
            return Expect::Refused(CudaRefusal::CrossesAllocations { base, size });
        }
        (at, piece) = (b, b.reported(next));
    }
}

#[test]
#[ignore = "needs the testbed VM"]
fn every_edge_of_every_allocation_kind_is_exported_or_refused_as_the_model_says() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let mut allocs = Vec::new();
    let mut make = |size: u64, nsegs: u64, kind: Kind| {
        let base = s.alloc(size as usize, nsegs as i32, kind);
        allocs.push(A {
            base,
            seg: size / nsegs,
            nsegs,
            kind,
        });
    };
    make(PAGE, 1, Kind::Device);
    make(100, 1, Kind::Device);
    make(5 * PAGE, 1, Kind::Device);
    make(8 * PAGE, 2, Kind::Device);
    make(8 * PAGE, 4, Kind::Device);
    make(TWO_MIB, 1, Kind::Device);
    make(TWO_MIB, 1, Kind::Device);
    make(TWO_MIB, 1, Kind::Host);
    make(TWO_MIB, 2, Kind::Device);
    make(TWO_MIB, 1, Kind::Managed);
    make(TWO_MIB, 1, Kind::Device);
    // Two reserved ranges of several segments side by side: the seams inside each may be
    // crossed, the one between them not.
    make(TWO_MIB, 2, Kind::Device);
    make(TWO_MIB, 4, Kind::Device);
    // A pattern in every byte of device memory, through the host view.
    for (i, a) in allocs.iter().enumerate() {
        if matches!(a.kind, Kind::Device) {
            let v: Vec<u8> = (0..a.size())
                .map(|j| (j as u8) ^ (j >> 12) as u8 ^ (i as u8).wrapping_mul(37))
                .collect();
            s.write(a.base, &v);
        }
    }

    let mut ptrs = vec![0, 1, PAGE, u64::MAX, u64::MAX - 1, u64::MAX - PAGE, 1 << 63];
    for a in &allocs {
        let (b, z, g) = (a.base, a.size(), a.seg);
        for p in [
            b.wrapping_sub(1),
            b,
            b + 1,
            b + PAGE - 1,
            b + PAGE,
            b + g - 1,
            b + g,
            b + g + 1,
            b + z - 1,
            b + z,
            b + z + 1,
            b + TWO_MIB - 1,
            b + TWO_MIB,
        ] {
            ptrs.push(p);
        }
    }
    ptrs.sort_unstable();
    ptrs.dedup();
    let mut failures = Vec::new();
    let mut checked = 0;
    let mut exported = 0;
    for &ptr in &ptrs {
        let mut lens = vec![
            0,
            1,
            2,
            7,
            PAGE - 1,
            PAGE,
            PAGE + 1,
            4 * PAGE,
            TWO_MIB - 1,
            TWO_MIB,
            TWO_MIB + 1,
            u64::MAX,
            u64::MAX - ptr,
            (u64::MAX - ptr).wrapping_add(1),
            1 << 63,
        ];
        for a in &allocs {
            if a.holds(ptr) {
                let (b, z) = a.reported(ptr);
                lens.extend([b + z - ptr, b + z - ptr + 1, a.base + a.size() - ptr]);
            }
        }
        lens.sort_unstable();
        lens.dedup();
        for len in lens {
            checked += 1;
            let want = model(&allocs, ptr, len);
            let got = catch_unwind(AssertUnwindSafe(|| dev.export_range(ptr, len)));
            let got = match got {
                Err(p) => {
                    let msg = p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failures.push(format!("{ptr:#x} + {len:#x}: PANIC {msg}"));
                    continue;
                }
                Ok(r) => r,
            };
            match (&want, got) {
                (Expect::Export, Ok(r)) => {
                    exported += 1;
                    let first = ptr - ptr % PAGE;
                    let end = (ptr + len).div_ceil(PAGE) * PAGE;
                    if (r.dmabuf().size(), r.offset(), r.ptr(), r.len())
                        != (end - first, ptr - first, ptr, len)
                    {
                        failures.push(format!(
                            "{ptr:#x} + {len:#x}: exported {} bytes at offset {}",
                            r.dmabuf().size(),
                            r.offset()
                        ));
                        continue;
                    }
                    // The dma-buf holds exactly the device memory of its pages.
                    let mut dmabuf = r.into_parts().dmabuf;
                    let m = dmabuf.map().expect("map a udmabuf");
                    let bytes = m.read().expect("sync").to_vec();
                    if bytes != s.read(first, (end - first) as usize) {
                        failures.push(format!(
                            "{ptr:#x} + {len:#x}: the dma-buf holds other bytes than its pages"
                        ));
                    }
                }
                (Expect::Refused(w), Err(Error::CudaPointer { why, .. })) if *w == why => {}
                (
                    Expect::NotCuda,
                    Err(Error::CudaPointer {
                        why: CudaRefusal::NotCudaMemory { .. },
                        ..
                    }),
                ) => {}
                (w, g) => failures.push(format!(
                    "{ptr:#x} + {len:#x}: expected {w:?}, got {:?}",
                    g.map(|r| (r.ptr(), r.len(), r.dmabuf().size()))
                )),
            }
        }
        // pointer_info agrees with the model for every pointer inside an allocation.
        if let Some(a) = allocs.iter().find(|a| a.holds(ptr)) {
            if matches!(a.kind, Kind::Device) {
                match catch_unwind(AssertUnwindSafe(|| dev.pointer_info(ptr))) {
                    Ok(Ok(info)) => {
                        let (b, z) = a.reported(ptr);
                        let (mb, mz) = info.mapping;
                        if (info.alloc_base, info.alloc_size) != (b, z)
                            || ptr < mb
                            || ptr - mb >= mz
                        {
                            failures.push(format!("pointer_info({ptr:#x}) = {info:x?}"));
                        }
                    }
                    other => failures.push(format!("pointer_info({ptr:#x}): {other:?}")),
                }
            }
        }
    }
    for a in &allocs {
        s.free(a.base);
    }
    eprintln!(
        "{checked} (pointer, length) pairs, {exported} exported, {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
