//! The post and poll hot path allocates nothing: a counting global allocator watches 1,000
//! send/receive round trips, 1,000 RDMA writes, 1,000 inline writes, 1,000 atomics, 1,000
//! gather writes and scattered receives of four shards each, 1,000 sends into receives posted
//! on a shared receive queue, and 1,000 scopes of a borrowed write, send and receive; then the
//! same round trips, writes, shared-queue receives and inline writes awaited on a tokio
//! runtime (wakers in the slots, the completion channels on the reactor), 1,000 each. Alone in
//! its binary. Runs in the testbed VM.
//!
//! The allocator counts the allocations of the thread that runs the hot path, not the whole
//! process: the test harness's own thread allocates when a test runs for more than 60
//! seconds (libtest's "has been running for over 60 seconds" warning: a list of the late
//! tests and the formatted line, two allocations), which a starved guest reaches. The busy
//! waits are covered under starvation too: the synchronous rounds run with a busy thread
//! per CPU of the guest beside them (the slow paths: yields at every checkpoint, deadlines
//! looked at, completions found late), and a thread that allocates all along stands in for
//! the harness's, to prove that only the hot path's thread is counted.

use integration_tests::process::busy_threads;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pd};
use rdma_dmabuf::{
    Access, AtomicOp, HostBuffer, Local, QueuePairBuilder, Shard, SharedReceiveQueue,
};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Whether this thread's allocations are counted (the hot path's thread only).
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Counts an allocation if the calling thread is the counted one. A const-initialised
/// thread-local without a destructor needs no allocation to reach; during a thread's
/// teardown it is simply not counted.
fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A thread that allocates until `stop`, as the harness's timer thread may: its allocations
/// must not be counted.
fn allocating_neighbour(stop: &Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut n = 0;
        while !stop.load(Ordering::Relaxed) {
            std::hint::black_box(vec![n as u8; 64]);
            n += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        n
    })
}

#[test]
#[ignore = "needs the testbed VM"]
fn post_and_poll_allocate_nothing() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).max_inline_data(64).max_sge(4),
        QueuePairBuilder::new(&pd).max_sge(4),
    );
    let mut src = Some(host_region(&pd, &[7; 64], 4096, Access::empty()));
    let mut dst = Some(host_region(&pd, &[], 4096, Access::LOCAL_WRITE));
    // (Used again by the awaited part below, on queue pairs of their own.)
    let target = host_region(
        &pd,
        &[],
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
    );
    let remote = target.remote().unwrap();
    let srq = SharedReceiveQueue::new(&pd, 4).unwrap();
    let (c, d) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).srq(&srq),
    );
    let shards = |len| {
        host_region(&pd, &[3; 4096], 4096, Access::LOCAL_WRITE)
            .split_into_chunks(len)
            .unwrap()
    };
    let mut gather: Option<[Shard<HostBuffer>; 4]> = Some(take4(shards(16)));
    let mut scatter: Option<[Shard<HostBuffer>; 4]> = Some(take4(shards(1024)));

    // Only this thread is counted: the hot path must not hand work to another. The process's
    // threads are the same before and after each counted part (the hogs and the neighbour
    // aside), so no allocation can hide on a thread the library started.
    let threads_before = threads();
    COUNTED.set(true);
    // The counter works: this thread's own allocation is seen.
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    std::hint::black_box(Box::new(1u64));
    assert_eq!(
        ALLOCATIONS.load(Ordering::Relaxed) - before,
        1,
        "the counter counts"
    );
    // The guest starved: a busy thread per CPU, and a neighbour that allocates.
    let stop = Arc::new(AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs = busy_threads(&stop, cpus);
    let neighbour = allocating_neighbour(&stop);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1_000 {
        let r = b.post_recv(dst.take().unwrap()).unwrap();
        let s = a
            .post_send(Local::new(src.take().unwrap(), 0..64), None)
            .unwrap();
        src = Some(s.spin().unwrap().region);
        let got = r.spin().unwrap();
        assert_eq!(got.wc.byte_len, 64);
        dst = Some(got.region);
    }
    for _ in 0..1_000 {
        let w = a
            .post_write(Local::new(src.take().unwrap(), 0..64), remote, None)
            .unwrap();
        src = Some(w.spin().unwrap().region);
    }
    // Inline writes (nothing lent) and atomics (the old value comes back in an 8-byte part).
    for i in 0..1_000u64 {
        a.post_write_inline(&i.to_ne_bytes(), remote, None)
            .unwrap()
            .spin()
            .unwrap();
        let add = AtomicOp::FetchAdd { add: 1 };
        let old = a
            .post_atomic(
                Local::new(dst.take().unwrap(), 0..8),
                remote.slice(8, 8).unwrap(),
                add,
            )
            .unwrap()
            .spin()
            .unwrap();
        dst = Some(old.region);
    }
    // Several parts per request: a gather write of four shards of one region, and a send of
    // them into a receive scattered over four shards of another.
    for _ in 0..1_000 {
        let w = a
            .post_write_parts(gather.take().unwrap(), remote, None)
            .unwrap();
        let parts = w.spin().unwrap().parts;
        let r = b.post_recv_parts(scatter.take().unwrap()).unwrap();
        let s = a.post_send_parts(parts, None).unwrap();
        gather = Some(s.spin().unwrap().parts);
        let got = r.spin().unwrap();
        assert_eq!(got.wc.byte_len, 64);
        scatter = Some(got.parts);
    }
    // Batches of four writes (the shards of the gather), one completion each, and a watch
    // of the target's bytes with volatile reads.
    let mut seen = [0u8; 8];
    for _ in 0..1_000 {
        let b4 = a
            .post_write_batch(gather.take().unwrap(), [remote; 4])
            .unwrap();
        gather = Some(b4.spin().unwrap().parts);
        target.read_volatile(0, &mut seen).unwrap();
    }
    // Receives through a shared receive queue.
    for _ in 0..1_000 {
        let r = srq.post_recv(dst.take().unwrap()).unwrap();
        let s = c
            .post_send(Local::new(src.take().unwrap(), 0..64), None)
            .unwrap();
        src = Some(s.spin().unwrap().region);
        let got = r.spin_timeout(Duration::MAX).unwrap().unwrap();
        assert_eq!(got.wc.qp_num, d.endpoint().qpn);
        dst = Some(got.region);
    }
    // Scopes of a few borrowed posts (a scope records its first posts in itself): a write
    // and a send with its receive, each scope drained at its end.
    for _ in 0..1_000 {
        let (s, d) = (src.as_ref().unwrap(), dst.as_mut().unwrap());
        rdma_dmabuf::scope(|scope| {
            let w = scope.write(&a, s.part(0..64), remote, None).unwrap();
            let r = scope.recv(&b, d.part_mut(0..64)).unwrap();
            scope.send(&a, s.part(0..64), None).unwrap();
            w.spin().unwrap();
            assert_eq!(r.spin().unwrap().byte_len, 64);
        });
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    COUNTED.set(false);
    stop.store(true, Ordering::Relaxed);
    hogs.into_iter().for_each(|h| h.join().unwrap());
    let neighbour_allocations = neighbour.join().unwrap();
    assert_eq!(allocations, 0, "allocations on the hot path");
    assert_eq!(
        settled(threads_before),
        threads_before,
        "the hot path started a thread"
    );
    assert!(
        neighbour_allocations > 0,
        "the allocating neighbour never ran: the proof that other threads are not counted is void"
    );
    COUNTED.set(true);

    // The same, awaited: two tasks on one thread, the receiver awaiting while the sender
    // posts, and writes awaited one after another. The runtime, the tasks and the reactor's
    // registrations of the completion channels are made before counting (once per queue
    // pair, at its first await), in 100 warm-up rounds.
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd).completion_channel(true),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    // Sends into receives awaited on the shared receive queue, and awaited inline writes.
    let (e, f) = connect_pair(
        QueuePairBuilder::new(&pd)
            .completion_channel(true)
            .max_inline_data(8),
        QueuePairBuilder::new(&pd).srq(&srq),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut src = src.take();
    let mut dst = dst.take();
    let counted = rt.block_on(async {
        // Each queue's table of task wakers is made once, at its first registration, which
        // a request that always completes within the busy-poll budget never makes: a
        // receive polled before its message is sent parks on each queue first.
        for (rx, tx) in [(&b, &a), (&a, &b), (&e, &f)] {
            let mut r = std::pin::pin!(rx
                .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
                .unwrap());
            parked_once(r.as_mut()).await;
            let s = tx
                .post_send(host_region(&pd, &[1; 64], 64, Access::empty()), None)
                .unwrap();
            s.spin().unwrap();
            r.await.unwrap();
        }
        let mut r = std::pin::pin!(srq
            .post_recv(host_region(&pd, &[], 64, Access::LOCAL_WRITE))
            .unwrap());
        parked_once(r.as_mut()).await;
        e.post_send(host_region(&pd, &[1; 64], 64, Access::empty()), None)
            .unwrap()
            .spin()
            .unwrap();
        r.await.unwrap();
        let mut before = 0;
        for round in 0..1_100 {
            if round == 100 {
                before = ALLOCATIONS.load(Ordering::Relaxed);
            }
            let r = b.post_recv(dst.take().unwrap()).unwrap();
            let s = a
                .post_send(Local::new(src.take().unwrap(), 0..64), None)
                .unwrap();
            let (sent, got) = tokio::join!(s, r);
            src = Some(sent.unwrap().region);
            let got = got.unwrap();
            assert_eq!(got.wc.byte_len, 64);
            dst = Some(got.region);
            let w = a
                .post_write(Local::new(src.take().unwrap(), 0..64), remote, None)
                .unwrap();
            src = Some(w.await.unwrap().region);
            let r = srq.post_recv(dst.take().unwrap()).unwrap();
            let s = e
                .post_send(Local::new(src.take().unwrap(), 0..64), None)
                .unwrap();
            let (sent, got) = tokio::join!(s, r);
            src = Some(sent.unwrap().region);
            let got = got.unwrap();
            assert_eq!(got.wc.qp_num, f.endpoint().qpn);
            dst = Some(got.region);
            let i = round as u64;
            let inline = e.post_write_inline(&i.to_ne_bytes(), remote, None).unwrap();
            inline.await.unwrap();
        }
        ALLOCATIONS.load(Ordering::Relaxed) - before
    });
    COUNTED.set(false);
    assert_eq!(counted, 0, "allocations on the awaited hot path");
    assert_eq!(
        settled(threads_before),
        threads_before,
        "the awaited hot path started a thread (the runtime is current-thread)"
    );
}

/// The process's threads (`/proc/self/task`).
fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// The thread count once it is `expected`, or after a second: a joined thread may still be
/// listed for a moment after its join returns.
fn settled(expected: usize) -> usize {
    for _ in 0..100 {
        if threads() == expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    threads()
}

/// The first four shards (the rest are dropped; the region stays registered for these).
fn take4(shards: Vec<Shard<HostBuffer>>) -> [Shard<HostBuffer>; 4] {
    let four: Vec<_> = shards.into_iter().take(4).collect();
    four.try_into().expect("four shards")
}

/// Polls `f` once (registering the task's waker if it is not ready), whatever it returns.
async fn parked_once<F: std::future::Future>(mut f: std::pin::Pin<&mut F>) {
    std::future::poll_fn(|cx| {
        let _ = f.as_mut().poll(cx);
        std::task::Poll::Ready(())
    })
    .await;
}
