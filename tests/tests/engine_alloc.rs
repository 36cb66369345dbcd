//! The transfer engine allocates per batch, never per chunk: a counting global allocator
//! counts every allocation of the process while a batch runs (the caller's check and plan,
//! the workers' shard lists and queues, the control channel's frames, anything else), for
//! batches of the same entries cut into N and into 4N chunks. The counts must not grow with
//! the chunk count. Alone in its binary; runs in the testbed VM.
//!
//! Counting the whole process rather than one thread covers every thread the engine runs a
//! batch on (the caller, a worker, the peer's connection thread); what else allocates
//! meanwhile (libtest's harness) is noise of a few allocations, which the minimum of
//! several runs removes.

use gpu_rdma_engine::{Agent, Batch, Settings};
use integration_tests::testbed::Testbed;
use rdma_dmabuf::HostBuffer;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ENTRIES: u64 = 16;
const CHUNK: u64 = 4 << 10;

/// Allocations of the process while `batch` is transferred and waited for (the fewest of
/// five runs).
fn allocations(a: &Agent, batch: &Batch) -> usize {
    (0..5)
        .map(|_| {
            let before = ALLOCATIONS.load(Ordering::SeqCst);
            let t = a.transfer(batch).expect("accepted");
            t.wait(Duration::from_secs(120)).expect("written");
            drop(t);
            ALLOCATIONS.load(Ordering::SeqCst) - before
        })
        .min()
        .unwrap()
}

/// `ENTRIES` writes of `len` bytes each, scattered.
fn batch(len: u64) -> Batch {
    (0..ENTRIES).fold(Batch::new(), |b, j| {
        let at = ((j * 7) % ENTRIES) * len;
        b.write("src", j * len, "b", "dst", at, len)
    })
}

#[test]
#[ignore = "needs the testbed VM"]
fn engine_allocates_per_batch_not_per_chunk() {
    let tb = Testbed::get();
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        chunk_size: CHUNK,
        // Counted with the engine's metrics on (the default, said here): recording them
        // allocates nothing per chunk either.
        metrics: true,
        ..Settings::default()
    };
    let a = Agent::new("a", settings.clone()).unwrap();
    let b = Agent::new("b", settings).unwrap();
    a.add_peer("b", b.address());
    const N: u64 = 64; // chunks per entry of the small batch
    let len = ENTRIES * 4 * N * CHUNK;
    a.register("src", HostBuffer::new(len as usize).unwrap())
        .unwrap();
    b.register("dst", HostBuffer::new(len as usize).unwrap())
        .unwrap();
    let (small, large) = (batch(N * CHUNK), batch(4 * N * CHUNK));
    // Warm: the descriptor fetched, the connections and queue pairs made.
    allocations(&a, &large);
    let at_n = allocations(&a, &small);
    let at_4n = allocations(&a, &large);
    let chunks = ENTRIES * N;
    eprintln!(
        "allocations per batch: {at_n} for {chunks} chunks, {at_4n} for {} chunks",
        4 * chunks
    );
    // One allocation per chunk would add 3 × 1,024; per batch the counts are equal up to
    // the noise of one or two (the harness).
    assert!(
        at_4n <= at_n + 2,
        "{at_4n} allocations for {} chunks against {at_n} for {chunks}: some are per chunk",
        4 * chunks
    );
}

/// Allocations of the process while `a` registers segment `name` (4 KiB of host memory,
/// allocated before the count).
fn registration(a: &Agent, name: &str) -> usize {
    let buffer = HostBuffer::new(4096).unwrap();
    let before = ALLOCATIONS.load(Ordering::SeqCst);
    a.register(name, buffer).expect("registered");
    ALLOCATIONS.load(Ordering::SeqCst) - before
}

/// A registration costs the same whatever the segments already registered: with the
/// embedded metadata (the agent serves its descriptor live), nothing copies every segment's
/// descriptor per registration, which made registering N segments cost N^2 (at 10,000
/// segments, 68 ms a registration in the testbed against 0.4 ms at 10).
#[test]
#[ignore = "needs the testbed VM"]
fn a_registration_allocates_the_same_at_ten_segments_and_at_a_thousand() {
    let tb = Testbed::get();
    let settings = Settings {
        devices: Some(vec![tb.device.clone()]),
        bind: "127.0.0.1:0".parse().unwrap(),
        ..Settings::default()
    };
    let a = Agent::new("r", settings).unwrap();
    for k in 0..10 {
        registration(&a, &format!("s{k}"));
    }
    let at_10 = (0..5)
        .map(|k| registration(&a, &format!("t{k}")))
        .min()
        .unwrap();
    for k in 0..1000 {
        registration(&a, &format!("u{k}"));
    }
    let at_1000 = (0..5)
        .map(|k| registration(&a, &format!("v{k}")))
        .min()
        .unwrap();
    eprintln!("allocations per registration: {at_10} at 15 segments, {at_1000} at 1,020");
    // A copy of each segment's descriptor would add thousands (a name and a region list
    // each); the map's own growth and the harness add a few.
    assert!(
        at_1000 <= at_10 + 8,
        "{at_1000} allocations per registration at 1,020 segments against {at_10} at 15: \
         something copies every segment"
    );
}
