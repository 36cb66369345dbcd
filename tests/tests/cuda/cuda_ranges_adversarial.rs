//! Attacks on `CudaDevice::export_range` / `pointer_info` / `CudaBuffer` /
//! `dmabuf_alloc_cuda_range` from safe code (plus the stand-in's allocation helpers, which do
//! what other libraries in the process would), against the stand-in libcuda in the testbed VM
//! (this project's code, not NVIDIA's driver): ranges into an adjacent allocation or reserved
//! range, memory freed and remade as host memory during a lookup, an export across seams
//! racing a remap, `CudaBuffer` sizes at the edges, and the C entry point from many threads
//! with bad arguments. Each is refused typed or exports exactly the memory it reports.

use dmabuf_alloc::{dmabuf_alloc_cuda_range, dmabuf_alloc_error};
use drm_export::cuda::CudaBuffer;
use drm_export::Error;
use integration_tests::cuda_standin::{device, outcome, standin, Kind};
use integration_tests::process::busy_threads;
use integration_tests::testbed::Testbed;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
const TWO_MIB: u64 = 2 << 20;

/// Two allocations of the stand-in made one after the other, side by side (the stand-in
/// hands out the lowest free 2 MiB-aligned base). A range from the first into the second
/// reaches memory of another allocation (another owner: two `cuMemAddressReserve`d ranges
/// may be adjacent), so it must be refused by `cover` with a `CudaRefusal`, whatever the
/// driver would do with it.
#[test]
#[ignore = "needs the testbed VM"]
fn a_range_from_one_allocation_into_an_adjacent_other_one_is_refused_by_the_checks() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    // (size, segments, kind) of the first and second allocation.
    type Alloc = (u64, i32, Kind);
    let cases: &[(Alloc, Alloc)] = &[
        ((TWO_MIB, 2, Kind::Device), (TWO_MIB, 2, Kind::Device)),
        ((TWO_MIB, 4, Kind::Device), (TWO_MIB, 2, Kind::Device)),
        ((TWO_MIB, 2, Kind::Device), (TWO_MIB, 1, Kind::Device)),
        ((TWO_MIB, 1, Kind::Device), (TWO_MIB, 2, Kind::Device)),
        ((TWO_MIB, 2, Kind::Device), (TWO_MIB, 2, Kind::Host)),
        ((TWO_MIB, 2, Kind::Device), (TWO_MIB, 2, Kind::Managed)),
    ];
    let mut failures = Vec::new();
    for &((az, an, ak), (bz, bn, bk)) in cases {
        let a = s.alloc(az as usize, an, ak);
        let b = s.alloc(bz as usize, bn, bk);
        let what = format!("{az:#x}/{an} {ak:?} then {bz:#x}/{bn} {bk:?}");
        if b != a + az {
            failures.push(format!("{what}: not adjacent ({a:#x}, {b:#x})"));
        } else {
            for (ptr, len) in [
                (a + az - 8, 16),
                (a + az - PAGE, 2 * PAGE),
                (a + 1, az),
                (a, az + bz),
                (a + az / 2, az),
            ] {
                let got = catch_unwind(AssertUnwindSafe(|| dev.export_range(ptr, len)));
                let ok = matches!(got, Ok(Err(Error::CudaPointer { .. })));
                let line = format!(
                    "{what}: export_range(a + {:#x}, {len:#x}): {}",
                    ptr - a,
                    match &got {
                        Ok(r) => outcome(r),
                        Err(_) => "PANIC".into(),
                    }
                );
                eprintln!("{line}");
                if !ok {
                    failures.push(line);
                }
            }
        }
        s.free(b);
        s.free(a);
    }
    assert!(
        failures.is_empty(),
        "ranges into another allocation passed the checks (the stand-in's driver, not \
         drm-export, stopped any that failed):\n{}",
        failures.join("\n")
    );
}

/// `piece` reads the memory type (host?), managed flag and device ordinal before the buffer
/// id, and the id check after an export only covers what happens after the id was read. So
/// another thread that frees device memory and makes page-locked host memory at the same
/// address between those reads gets the host allocation reported as device memory.
#[test]
#[ignore = "needs the testbed VM"]
fn pointer_info_never_reports_a_host_allocation_as_device_memory_under_churn() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let size = 4 * PAGE as usize;
    let probe = s.alloc(size, 1, Kind::Device);
    s.free(probe);
    let stop = Arc::new(AtomicBool::new(false));
    let device_ids: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let cycles = Arc::new(AtomicU64::new(0));
    let churn = {
        let (dev, stop, ids, cycles) = (
            dev.clone(),
            stop.clone(),
            device_ids.clone(),
            cycles.clone(),
        );
        std::thread::spawn(move || {
            // Each allocation lives a while, so that the prober, preempted between its
            // reads, comes back to either kind about as often.
            let hold = || {
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(150) {
                    std::hint::spin_loop();
                }
            };
            while !stop.load(Ordering::Relaxed) {
                let d = s.alloc(size, 1, Kind::Device);
                assert_eq!(d, probe, "the stand-in reuses the address");
                ids.lock()
                    .unwrap()
                    .insert(dev.pointer_info(d).unwrap().buffer_id);
                hold();
                s.free(d);
                let h = s.alloc(size, 1, Kind::Host);
                assert_eq!(h, probe, "the stand-in reuses the address");
                hold();
                s.free(h);
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    // Busy threads, so that the prober is preempted now and then between its reads.
    let spinners = busy_threads(&stop, 3);
    let mut seen = Vec::new();
    let mut calls = 0u64;
    let mut driver_errors = 0u64;
    let deadline = Instant::now() + Duration::from_secs(12);
    while Instant::now() < deadline {
        calls += 1;
        if let Ok(info) = dev.pointer_info(probe + 8) {
            seen.push(info.buffer_id);
        }
        if calls.is_multiple_of(8) {
            if let Err(Error::Os { .. }) = dev.export_range(probe, PAGE) {
                driver_errors += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    churn.join().unwrap();
    for t in spinners {
        t.join().unwrap();
    }
    let device_ids = device_ids.lock().unwrap();
    let host: Vec<u64> = seen
        .iter()
        .copied()
        .filter(|id| !device_ids.contains(id))
        .collect();
    eprintln!(
        "{calls} probes during {} churn cycles: {} reported as device memory, {} of them \
         host allocations; export_range gave {driver_errors} driver errors (the driver \
         refusing, not the checks)",
        cycles.load(Ordering::Relaxed),
        seen.len(),
        host.len()
    );
    assert!(
        host.is_empty(),
        "pointer_info reported page-locked host allocations (buffer ids {:?}) as device \
         memory: the memory type was read from the allocation before, the buffer id from \
         the one after",
        &host[..host.len().min(10)]
    );
}

/// An export across the seams of a `cuMemMap`ped allocation while another thread frees it
/// and makes a new one at the same address with another number of segments (so other
/// seams): every export holds, in every page, the memory of the generation whose buffer id
/// it reports.
#[test]
#[ignore = "needs the testbed VM"]
fn an_export_across_seams_racing_a_remap_holds_one_generation_in_every_page() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let dev = device();
    let size = 8 * PAGE as usize;
    let base = s.alloc(size, 4, Kind::Device);
    s.write(base, &vec![1u8; size]);
    let gens: Arc<Mutex<HashMap<u64, u8>>> = Arc::default();
    gens.lock()
        .unwrap()
        .insert(dev.pointer_info(base).unwrap().buffer_id, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (dev, gens, stop) = (dev.clone(), gens.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cur = base;
            let mut n = 1u64;
            while !stop.load(Ordering::Relaxed) {
                s.free(cur);
                n += 1;
                let segs = [4, 2, 8, 1][(n % 4) as usize];
                cur = s.alloc(size, segs, Kind::Device);
                assert_eq!(cur, base, "the stand-in reuses the address");
                let g = (n % 255) as u8 + 1;
                s.write(cur, &vec![g; size]);
                let id = dev.pointer_info(cur).unwrap().buffer_id;
                gens.lock().unwrap().insert(id, g);
            }
            s.free(cur);
            n
        })
    };
    let (mut ok, mut stale, mut refused) = (0u64, Vec::new(), HashMap::<String, u64>::new());
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline && stale.len() < 3 {
        let r = match dev.export_range(base + 100, 6 * PAGE) {
            Ok(r) => r,
            Err(e) => {
                let k = match e {
                    Error::CudaPointer { why, .. } => format!("{why:?}"),
                    e => format!("{e}"),
                };
                let k: String = k.chars().take(60).collect();
                *refused.entry(k).or_default() += 1;
                continue;
            }
        };
        ok += 1;
        let id = r.buffer_id();
        let mut dmabuf = r.into_parts().dmabuf;
        let want = loop {
            if let Some(&g) = gens.lock().unwrap().get(&id) {
                break g;
            }
            std::thread::yield_now();
        };
        let m = dmabuf.map().expect("map a udmabuf");
        let bytes = m.read().unwrap().to_vec();
        if let Some(i) = bytes.iter().position(|&b| b != want) {
            stale.push(format!(
                "buffer id {id} (filled with {want}), but byte {i} of the dma-buf holds {}",
                bytes[i]
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n = churn.join().unwrap();
    eprintln!(
        "{ok} exports during {n} remaps; refused: {refused:?}; stale {}",
        stale.len()
    );
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// `CudaBuffer::new` at the edges of `usize`, and sizes that are not whole pages: typed
/// errors, no panic; the buffer's pages inside its allocation, and exported.
#[test]
#[ignore = "needs the testbed VM"]
fn cuda_buffer_sizes_at_the_edges_are_refused_or_whole_pages_of_their_allocation() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    standin();
    let dev = device();
    let page = PAGE as usize;
    for size in [
        usize::MAX,
        usize::MAX - 1,
        usize::MAX - page + 1,
        usize::MAX - page,
        usize::MAX - 2 * page + 1,
        usize::MAX - 2 * page,
        1 << 63,
        isize::MAX as usize,
    ] {
        let r = catch_unwind(AssertUnwindSafe(|| CudaBuffer::new(&dev, size)));
        match r {
            Err(_) => panic!("CudaBuffer::new({size:#x}) panicked"),
            Ok(Ok(b)) => panic!("CudaBuffer::new({size:#x}) gave {} bytes", b.size()),
            Ok(Err(e)) => eprintln!("CudaBuffer::new({size:#x}): {e}"),
        }
    }
    for size in [
        1,
        page - 1,
        page,
        page + 1,
        3 * page + 5,
        1 << 21,
        (1 << 21) + 1,
    ] {
        let b = CudaBuffer::new(&dev, size).unwrap();
        assert_eq!(b.size(), size.next_multiple_of(page), "{size}");
        assert_eq!(b.ptr() % PAGE, 0, "{size}");
        let info = dev.pointer_info(b.ptr()).unwrap();
        assert!(
            info.alloc_base <= b.ptr()
                && b.ptr() + b.size() as u64 <= info.alloc_base + info.alloc_size,
            "{size}: {info:x?}"
        );
        let d = b.export().unwrap();
        assert_eq!(d.size(), b.size() as u64);
        let r = dev.export_range(b.ptr(), b.size() as u64).unwrap();
        assert_eq!((r.offset(), r.dmabuf().size()), (0, b.size() as u64));
        // One byte past the buffer: its extra page (still its own allocation), never more.
        let past = dev.export_range(b.ptr() + b.size() as u64 - 1, 2);
        eprintln!("{size}: one byte past the buffer: {}", outcome(&past));
        let far = dev.export_range(b.ptr(), info.alloc_size + 1);
        assert!(
            matches!(far, Err(Error::CudaPointer { .. })),
            "{size}: past the allocation: {}",
            outcome(&far)
        );
    }
}

/// `dmabuf_alloc_cuda_range` from many threads at once: good ranges with null out-pointers,
/// bad ordinals, empty and wrapping ranges. No crash, every fd valid, every failure -1 with
/// errno and a message of its own thread.
#[test]
#[ignore = "needs the testbed VM"]
fn dmabuf_alloc_cuda_range_from_many_threads_with_nulls_and_bad_ordinals() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    let s = standin();
    let size = 1usize << 20;
    let base = s.alloc(size, 1, Kind::Device);
    let vmm = s.alloc(size, 4, Kind::Device);
    let failures: Mutex<Vec<String>> = Mutex::default();
    std::thread::scope(|sc| {
        for t in 0..8 {
            let failures = &failures;
            sc.spawn(move || {
                for i in 0..300u64 {
                    let (ord, ptr, len, good) = match (i + t) % 9 {
                        0 => (0, base + i, PAGE, true),
                        1 => (0, vmm + 1, size as u64 - 1, true),
                        2 => (-1, base, PAGE, false),
                        3 => (1, base, PAGE, false),
                        4 => (i32::MIN, base, PAGE, false),
                        5 => (i32::MAX, base, PAGE, false),
                        6 => (0, base, 0, false),
                        7 => (0, u64::MAX, u64::MAX, false),
                        _ => (0, base + size as u64 - 1, u64::MAX, false),
                    };
                    let (mut off, mut sz) = (u64::MAX, u64::MAX);
                    let nulls = i % 2 == 0;
                    let (o, z): (*mut u64, *mut u64) = if nulls {
                        (std::ptr::null_mut(), std::ptr::null_mut())
                    } else {
                        (&mut off, &mut sz)
                    };
                    // SAFETY: the out-pointers are null or live `u64`s.
                    let fd = unsafe { dmabuf_alloc_cuda_range(ord, ptr, len, o, z) };
                    let what = format!("thread {t} call {i}: ({ord}, {ptr:#x}, {len:#x})");
                    if good {
                        if fd < 0 {
                            // SAFETY: this thread's message.
                            let m = unsafe { CStr::from_ptr(dmabuf_alloc_error()) };
                            failures.lock().unwrap().push(format!("{what}: {m:?}"));
                            continue;
                        }
                        // SAFETY: a new fd the caller owns.
                        drop(unsafe { OwnedFd::from_raw_fd(fd) });
                        if !nulls && (off != ptr % PAGE || sz == u64::MAX) {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{what}: offset {off}, size {sz}"));
                        }
                    } else {
                        let errno = nix::errno::Errno::last_raw();
                        // SAFETY: this thread's message.
                        let m = unsafe { CStr::from_ptr(dmabuf_alloc_error()) }
                            .to_string_lossy()
                            .into_owned();
                        let want_dev = ord != 0;
                        if fd != -1
                            || errno == 0
                            || (want_dev && !m.contains(&format!("cuDeviceGet({ord})")))
                            || m.contains("internal error")
                            || (!nulls && (off, sz) != (u64::MAX, u64::MAX))
                        {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("{what}: fd {fd}, errno {errno}, {m:?}"));
                        }
                    }
                }
            });
        }
    });
    s.free(vmm);
    s.free(base);
    let f = failures.into_inner().unwrap();
    assert!(
        f.is_empty(),
        "{} failures:\n{}",
        f.len(),
        f[..f.len().min(20)].join("\n")
    );
}
