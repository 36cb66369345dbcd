//! `CudaDevice::export_range` / `pointer_info` across `cuMemMap` seams (testbed VM, stand-in
//! libcuda: this project's code, not NVIDIA's driver): ranges from every seam to every seam
//! of an eight-part reservation with page rounding at both ends, a reserved range split into
//! two and joined again at the same address while ranges across its seam are looked up and
//! exported, and what an export racing a free is refused as: `ChangedMeanwhile`, never
//! `CrossesAllocations`, `PastAllocation` or the driver's error.

use drm_export::cuda::CudaDevice;
use drm_export::{CudaRefusal, Error};
use integration_tests::cuda_standin::{device, outcome, standin, Kind};
use integration_tests::process::busy_threads;
use integration_tests::testbed::Testbed;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
const TWO_MIB: u64 = 2 << 20;

/// One reserved range of 8 mapped parts (256 KiB each) with another of 2 parts right after
/// it: ranges from every seam to every later seam, one byte short of it, on it and one byte
/// past it, and from one page before each seam, are exported with exactly the bytes of
/// their pages, or refused as the rules say (past the end of the first reservation: into
/// the second, `CrossesAllocations` naming the last part; the second reservation is
/// another owner's). `pointer_info` names each part.
#[test]
#[ignore = "needs the testbed VM"]
fn ranges_from_every_seam_to_every_seam_of_eight_parts_hold_exactly_their_pages() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let (n, seg) = (8u64, TWO_MIB / 8);
    let a = s.alloc(TWO_MIB as usize, n as i32, Kind::Device);
    let b = s.alloc(TWO_MIB as usize, 2, Kind::Device);
    assert_eq!(b, a + TWO_MIB, "the two reserved ranges are side by side");
    let fill: Vec<u8> = (0..TWO_MIB)
        .map(|j| (j as u8) ^ (j >> 12) as u8 ^ 0x5a)
        .collect();
    s.write(a, &fill);
    s.write(b, &vec![0xee; TWO_MIB as usize]);
    let mut failures = Vec::new();
    for k in 0..n {
        let p = a + k * seg;
        match dev.pointer_info(p + seg - 1) {
            Ok(i) if (i.alloc_base, i.alloc_size, i.mapping) == (p, seg, (p, seg)) => {}
            other => failures.push(format!("pointer_info(part {k} end): {other:x?}")),
        }
    }
    let end = a + TWO_MIB;
    let mut starts = Vec::new();
    for k in 0..n {
        let seam = a + k * seg;
        starts.extend([seam, seam + 1, seam + PAGE - 1]);
        if k > 0 {
            starts.extend([seam - 1, seam - PAGE, seam - PAGE + 1]);
        }
    }
    let mut checked = 0;
    for &ptr in &starts {
        let mut ends = Vec::new();
        for k in 1..=n {
            let seam = a + k * seg;
            if seam > ptr {
                ends.extend([seam - 1, seam, seam + 1]);
            }
        }
        ends.push(ptr + 1);
        ends.push(end + PAGE);
        for e in ends.into_iter().filter(|&e| e > ptr) {
            let len = e - ptr;
            checked += 1;
            let got = catch_unwind(AssertUnwindSafe(|| dev.export_range(ptr, len)));
            let Ok(got) = got else {
                failures.push(format!("a+{:#x} len {len:#x}: PANIC", ptr - a));
                continue;
            };
            let first = ptr - ptr % PAGE;
            let last = e.div_ceil(PAGE) * PAGE;
            if last <= end {
                match got {
                    Ok(r) => {
                        if (r.offset(), r.dmabuf().size()) != (ptr - first, last - first) {
                            failures.push(format!(
                                "a+{:#x} len {len:#x}: offset {} size {}",
                                ptr - a,
                                r.offset(),
                                r.dmabuf().size()
                            ));
                            continue;
                        }
                        let mut d = r.into_parts().dmabuf;
                        let m = d.map().expect("map a udmabuf");
                        let bytes = m.read().expect("sync").to_vec();
                        let want = &fill[(first - a) as usize..(last - a) as usize];
                        if bytes != want {
                            failures.push(format!(
                                "a+{:#x} len {len:#x}: other bytes than its pages",
                                ptr - a
                            ));
                        }
                    }
                    Err(_) => failures.push(format!(
                        "a+{:#x} len {len:#x}: {} (inside one reservation)",
                        ptr - a,
                        outcome(&got)
                    )),
                }
            } else {
                let want = if e <= end {
                    CudaRefusal::SharesPages {
                        base: end - seg,
                        size: seg,
                    }
                } else {
                    CudaRefusal::CrossesAllocations {
                        base: end - seg,
                        size: seg,
                    }
                };
                match &got {
                    Err(Error::CudaPointer { why, .. }) if *why == want => {}
                    _ => failures.push(format!(
                        "a+{:#x} len {len:#x}: {}, want {want:?}",
                        ptr - a,
                        outcome(&got)
                    )),
                }
            }
        }
    }
    s.free(b);
    s.free(a);
    eprintln!("{checked} ranges, {} failures", failures.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One reserved range of two 2 MiB parts at `x`, freed and made again as two reserved
/// ranges of 2 MiB (two parts each) side by side at the same address, and back, over and
/// over; each generation filled with its own byte. The seam at `x + 2 MiB` is inside one
/// reservation half the time and between two owners' the other half. A range across it is
/// exported only with the memory of one reservation of the first layout, the one its buffer
/// id names, in every byte; `pointer_info` at the seam reports a part of the layout of the
/// buffer id it gives.
#[test]
#[ignore = "needs the testbed VM"]
fn a_seam_whose_reservation_is_split_and_joined_meanwhile_is_exported_only_within_one() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let x = s.alloc(2 * TWO_MIB as usize, 2, Kind::Device);
    s.write(x, &vec![1; 2 * TWO_MIB as usize]);
    // Buffer id -> (fill byte, part size): part size 2 MiB for the joined layout, 1 MiB for
    // the split one.
    // Each mapped part has a buffer id of its own: all of them are recorded.
    let gens: Arc<Mutex<HashMap<u64, (u8, u64)>>> = Arc::default();
    type Gens = Mutex<HashMap<u64, (u8, u64)>>;
    fn record(dev: &CudaDevice, gens: &Gens, p: u64, size: u64, g: u8, part: u64) {
        for at in (p..p + size).step_by(part as usize) {
            let id = dev.pointer_info(at).unwrap().buffer_id;
            gens.lock().unwrap().insert(id, (g, part));
        }
    }
    record(&dev, &gens, x, 2 * TWO_MIB, 1, TWO_MIB);
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (dev, gens, stop) = (dev.clone(), gens.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 1u32;
            let mut live = vec![x];
            while !stop.load(Ordering::Relaxed) {
                for p in live.drain(..) {
                    s.free(p);
                }
                n += 1;
                if n.is_multiple_of(2) {
                    for half in [x, x + TWO_MIB] {
                        let p = s.alloc(TWO_MIB as usize, 2, Kind::Device);
                        assert_eq!(p, half, "the stand-in reuses the addresses");
                        let g = (n % 250) as u8 + 2 + (half != x) as u8;
                        s.write(p, &vec![g; TWO_MIB as usize]);
                        record(&dev, &gens, p, TWO_MIB, g, TWO_MIB / 2);
                        live.push(p);
                    }
                } else {
                    let p = s.alloc(2 * TWO_MIB as usize, 2, Kind::Device);
                    assert_eq!(p, x, "the stand-in reuses the address");
                    let g = (n % 250) as u8 + 2;
                    s.write(p, &vec![g; 2 * TWO_MIB as usize]);
                    record(&dev, &gens, p, 2 * TWO_MIB, g, TWO_MIB);
                    live.push(p);
                }
            }
            for p in live {
                s.free(p);
            }
            n
        })
    };
    let busy = busy_threads(&stop, 2);
    // An id is recorded right after its part is made: wait for it, but never forever.
    let gen_of = |id: u64| {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(&g) = gens.lock().unwrap().get(&id) {
                break g;
            }
            assert!(Instant::now() < until, "buffer id {id} was never recorded");
            std::thread::yield_now();
        }
    };
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 0u64;
    while Instant::now() < deadline && failures.len() < 5 {
        i += 1;
        if i.is_multiple_of(4) {
            if let Ok(info) = dev.pointer_info(x + TWO_MIB) {
                let (_, part) = gen_of(info.buffer_id);
                // The second part of the joined range, or the first of the second range.
                let want = (x + TWO_MIB, part);
                if (info.alloc_base, info.alloc_size) != want || info.mapping != want {
                    failures.push(format!(
                        "pointer_info(seam): {info:x?}, but buffer id {} has parts of {part:#x}",
                        info.buffer_id
                    ));
                }
            }
            continue;
        }
        let (ptr, len) = if i.is_multiple_of(2) {
            (x + TWO_MIB - 8, 16)
        } else {
            (x + TWO_MIB - PAGE - 1, 2 * PAGE + 2)
        };
        let got = dev.export_range(ptr, len);
        *outcomes.entry(outcome(&got)).or_default() += 1;
        let Ok(r) = got else { continue };
        let id = r.buffer_id();
        let (g, part) = gen_of(id);
        if part != TWO_MIB {
            failures.push(format!(
                "exported across the seam between two reservations (buffer id {id})"
            ));
            continue;
        }
        let mut d = r.into_parts().dmabuf;
        let m = d.map().expect("map a udmabuf");
        let bytes = m.read().expect("sync").to_vec();
        if let Some(j) = bytes.iter().position(|&b| b != g) {
            failures.push(format!(
                "buffer id {id} (filled with {g}), but byte {j} of the dma-buf holds {}",
                bytes[j]
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n = churn.join().unwrap();
    for t in busy {
        t.join().unwrap();
    }
    eprintln!("{n} layouts; outcomes {outcomes:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A range that every generation of the memory at `p` could export (16 KiB in 1, 2 or 4
/// parts, the range two pages at `p + 1`), while another thread frees and makes it again
/// with other seams. An export that sees the memory change is refused as `ChangedMeanwhile`
/// ("the memory was freed ... while it was looked up or exported"), or `NotCudaMemory` when
/// the pointer itself was found freed: never as a range past its allocation, across two or
/// sharing pages (`PastAllocation`, `CrossesAllocations`, `SharesPages`, which tell the
/// caller to split or realign a range that was never wrong, and name an allocation that no
/// longer exists), nor as the driver refusing the export (`Error::Os`).
#[test]
#[ignore = "needs the testbed VM"]
fn an_export_racing_a_remap_is_refused_as_changed_not_as_a_range_across_allocations() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let size = 4 * PAGE as usize;
    let p = s.alloc(size, 4, Kind::Device);
    for segs in [1, 2] {
        let q = s.alloc(size, segs, Kind::Device);
        dev.export_range(q + 1, PAGE).unwrap();
        s.free(q);
    }
    dev.export_range(p + 1, PAGE).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut cur = p;
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                s.free(cur);
                cur = s.alloc(size, [2, 4, 1][(n % 3) as usize], Kind::Device);
                assert_eq!(cur, p, "the stand-in reuses the address");
                n += 1;
            }
            s.free(cur);
            n
        })
    };
    let busy = busy_threads(&stop, 2);
    let mut outcomes: HashMap<String, u64> = HashMap::new();
    let mut wrong = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && wrong.len() < 3 {
        let got = dev.export_range(p + 1, PAGE);
        let k = outcome(&got);
        match &got {
            Ok(_)
            | Err(Error::CudaPointer {
                why: CudaRefusal::ChangedMeanwhile | CudaRefusal::NotCudaMemory { .. },
                ..
            }) => {}
            Err(_) => wrong.push(k.clone()),
        }
        *outcomes.entry(k).or_default() += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let n = churn.join().unwrap();
    for t in busy {
        t.join().unwrap();
    }
    eprintln!("{n} reallocations; outcomes {outcomes:?}");
    assert!(
        wrong.is_empty(),
        "export_range(p + 1, {PAGE}) of memory remade meanwhile, exportable in every \
         generation, refused as: {wrong:?}"
    );
}
