//! `CudaDevice::export_range` while another thread frees the allocation and makes a new one
//! at the same address (testbed VM, stand-in libcuda): the export must hold the memory whose
//! buffer id it reports, or be refused (`ChangedMeanwhile`), never hold the next
//! allocation's memory under the old id (without the check after the export: 3 stale
//! exports in under a second).

use drm_export::cuda::{CudaBuffer, RangeParts};
use integration_tests::cuda_standin::{device, standin};
use integration_tests::testbed::Testbed;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

#[test]
#[ignore = "needs the testbed VM"]
fn an_export_racing_a_free_and_reallocation_reports_the_buffer_id_of_its_memory() {
    let _tb = Testbed::get();
    let _alone = integration_tests::process::alone();
    standin();
    let dev = device();
    let size = 4 * PAGE as usize;
    let first = CudaBuffer::new(&dev, size).unwrap();
    let ptr = first.ptr();
    // Each generation of the buffer at `ptr` is filled with its own byte (never 0) before
    // its buffer id is recorded.
    let gens: Arc<Mutex<HashMap<u64, u8>>> = Arc::default();
    first.fill(1).unwrap();
    gens.lock()
        .unwrap()
        .insert(dev.pointer_info(ptr).unwrap().buffer_id, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (dev, gens, stop) = (dev.clone(), gens.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut cur = first;
            let mut n = 1u64;
            while !stop.load(Ordering::Relaxed) {
                drop(cur);
                cur = CudaBuffer::new(&dev, size).unwrap();
                assert_eq!(cur.ptr(), ptr, "the stand-in reuses the address");
                n += 1;
                let g = (n % 255) as u8 + 1;
                cur.fill(g).unwrap();
                let id = dev.pointer_info(ptr).unwrap().buffer_id;
                gens.lock().unwrap().insert(id, g);
            }
            n
        })
    };
    let (mut ok, mut stale) = (0u64, Vec::new());
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline && stale.len() < 3 {
        let Ok(r) = dev.export_range(ptr + 100, 2 * PAGE) else {
            continue;
        };
        ok += 1;
        let id = r.buffer_id();
        let RangeParts {
            mut dmabuf, offset, ..
        } = r.into_parts();
        // The generation of the id the export reports, once recorded (after its fill).
        let want = loop {
            if let Some(&g) = gens.lock().unwrap().get(&id) {
                break g;
            }
            std::thread::yield_now();
        };
        let m = dmabuf.map().expect("map a udmabuf");
        let mut b = [0u8];
        m.read().unwrap().read_at(offset as usize, &mut b).unwrap();
        if b[0] != want {
            stale.push(format!(
                "buffer id {id} (filled with {want}), but the dma-buf's memory holds {}",
                b[0]
            ));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let n = churn.join().unwrap();
    eprintln!(
        "{ok} exports during {n} reallocations; {} stale",
        stale.len()
    );
    assert!(
        stale.is_empty(),
        "export_range reported the buffer id of another allocation than the one it \
         exported:\n{}",
        stale.join("\n")
    );
}
