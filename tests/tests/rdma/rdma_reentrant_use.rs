//! Using the API from inside other activity: a scope run by a `Drop` while the thread unwinds
//! from an unrelated panic (its closure returned: its requests get their drain, not a flush;
//! the scope never takes another panic for its closure's), a waker whose `wake` polls its
//! queue pair again and finishes another handle there, and volatile reads of a region a
//! scope is sending from. Runs in the testbed VM; every test takes a lock.

use integration_tests::process::{alone, within};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{deep_pair, host_region, pattern, pd};
use rdma_dmabuf::{scope, Access, HostBuffer, Local, Pending, QueuePair};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::time::Duration;

const RW: Access = Access::LOCAL_WRITE.union(Access::REMOTE_WRITE);
const T: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// 1. A scope run while the thread unwinds from a panic that is not its closure's
// ---------------------------------------------------------------------------------------

/// Runs `f` inside a `Drop` during unwinding (a panic that is caught), or plainly.
fn maybe_while_unwinding(unwinding: bool, f: impl FnOnce()) {
    struct OnDrop<F: FnOnce()>(Option<F>);
    impl<F: FnOnce()> Drop for OnDrop<F> {
        fn drop(&mut self) {
            if let Some(f) = self.0.take() {
                f()
            }
        }
    }
    if unwinding {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = OnDrop(Some(f));
            panic!("an unrelated panic; the guard's Drop runs a scope");
        }));
        assert!(r.is_err());
    } else {
        let _g = OnDrop(Some(f));
    }
}

/// In a scope whose closure returns normally, a receive and the send that answers it, both
/// left to the drain: the scope waits for them. The same scope run from a `Drop` while the
/// thread unwinds from an unrelated (caught) panic must do the same, not treat that panic as
/// its closure's and flush both queue pairs (which ends both connections and may cut the
/// message off).
#[test]
#[ignore = "needs the testbed VM"]
fn a_scope_in_a_drop_during_an_unrelated_unwind_does_not_flush_its_queue_pairs() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let mut report = Vec::new();
    for unwinding in [false, true] {
        let (a, b) = deep_pair(&pd);
        let msg = host_region(&pd, &pattern(64, 7), 64, Access::empty());
        let mut inbox = host_region(&pd, &[], 64, Access::LOCAL_WRITE);
        maybe_while_unwinding(unwinding, || {
            scope(|s| {
                let _r = s.recv(&b, &mut inbox).unwrap();
                let _w = s.send(&a, &msg, None).unwrap();
                // Both handles dropped: the drain waits for them.
            });
        });
        a.poll().unwrap();
        b.poll().unwrap();
        let landed = inbox.bytes().unwrap()[..64] == pattern(64, 7)[..];
        report.push((unwinding, a.is_in_error(), b.is_in_error(), landed));
        println!(
            "unwinding {unwinding}: a in error {}, b in error {}, message landed {landed}",
            a.is_in_error(),
            b.is_in_error()
        );
    }
    assert_eq!(report[0], (false, false, false, true), "control");
    assert_eq!(
        report[1],
        (true, false, false, true),
        "a scope whose closure returned flushed its queue pairs because the thread was \
         unwinding from another panic"
    );
}

// ---------------------------------------------------------------------------------------
// 2. A waker whose `wake` polls the same queue pair again
// ---------------------------------------------------------------------------------------

thread_local! {
    static QP_B: Cell<Option<&'static QueuePair>> = const { Cell::new(None) };
    static STASH: RefCell<Option<Pending<'static, HostBuffer>>> = const { RefCell::new(None) };
    static FINISHED: RefCell<Vec<(usize, u32, Vec<u8>)>> = const { RefCell::new(Vec::new()) };
}

/// Wakes by polling queue pair B again (the thread-local), and finishing the stashed handle
/// there if its completion has come.
struct Reentrant {
    wakes: AtomicUsize,
    stashed_index: usize,
}

impl Wake for Reentrant {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::SeqCst);
        let p = STASH.with(|s| s.borrow_mut().take());
        if let Some(p) = p {
            match p.try_complete() {
                Ok(out) => {
                    let d = out.expect("stashed receive succeeds");
                    let bytes = d.region.bytes().unwrap().to_vec();
                    FINISHED.with(|f| {
                        f.borrow_mut()
                            .push((self.stashed_index, d.wc.byte_len, bytes))
                    });
                }
                Err(p) => STASH.with(|s| *s.borrow_mut() = Some(p)),
            }
        }
        if let Some(b) = QP_B.with(Cell::get) {
            let _ = b.poll();
        }
    }
}

/// 24 receives on B (more than one poll's batch of 16); the first has a waker that, when
/// woken inside a poll of B, polls B again and finishes receive 20 (stashed in a
/// thread-local): the inner poll takes completions the outer poll has not reached, among
/// them the one the outer poll is waiting for. Every receive must still get its own message,
/// exactly once, and nothing may be left in a slot.
#[test]
#[ignore = "needs the testbed VM"]
fn a_waker_that_polls_its_queue_pair_again_loses_and_mixes_up_nothing() {
    let _l = alone();
    within(Duration::from_secs(120), "re-entrant poll", || {
        let tb = Testbed::get();
        let pd = pd(&tb);
        let (a, b) = deep_pair(&pd);
        // Leaked so that handles and the waker can reach them from thread-locals.
        let a: &'static QueuePair = Box::leak(Box::new(a));
        let b: &'static QueuePair = Box::leak(Box::new(b));
        QP_B.with(|c| c.set(Some(b)));
        const N: usize = 24;
        const STASHED: usize = 20;
        let mut handles: Vec<Option<Pending<'static, HostBuffer>>> = (0..N)
            .map(|_| {
                let r = host_region(&pd, &[], 128, Access::LOCAL_WRITE);
                Some(b.post_recv(Local::new(r, 0..128)).unwrap())
            })
            .collect();
        let evil = Arc::new(Reentrant {
            wakes: AtomicUsize::new(0),
            stashed_index: STASHED,
        });
        let waker = Waker::from(evil.clone());
        handles[0].as_ref().unwrap().register_waker(&waker);
        STASH.with(|s| *s.borrow_mut() = handles[STASHED].take());
        // Sizes 1..=24 so that a mixed-up completion shows in byte_len.
        for i in 0..N {
            let src = host_region(&pd, &pattern(128, i as u8), 128, Access::empty());
            a.post_send(Local::new(src, 0..(i as u64 + 1)), None)
                .unwrap()
                .spin_timeout(T)
                .unwrap()
                .unwrap();
        }
        // The outer poll: wait for the last receive.
        let last = handles[N - 1].take().unwrap();
        let mut results: Vec<(usize, u32, Vec<u8>)> = Vec::new();
        let d = last.spin_timeout(T).expect("last receive").unwrap();
        results.push((N - 1, d.wc.byte_len, d.region.bytes().unwrap().to_vec()));
        for (i, h) in handles.iter_mut().enumerate() {
            if let Some(h) = h.take() {
                let d = h.spin_timeout(T).expect("receive").unwrap();
                results.push((i, d.wc.byte_len, d.region.bytes().unwrap().to_vec()));
            }
        }
        if let Some(p) = STASH.with(|s| s.borrow_mut().take()) {
            let d = p.spin_timeout(T).expect("stashed").unwrap();
            results.push((STASHED, d.wc.byte_len, d.region.bytes().unwrap().to_vec()));
        } else {
            println!("the stashed receive was finished inside the waker (re-entrant)");
        }
        results.extend(FINISHED.with(|f| std::mem::take(&mut *f.borrow_mut())));
        println!("wakes: {}", evil.wakes.load(Ordering::SeqCst));
        results.sort_by_key(|r| r.0);
        assert_eq!(results.len(), N, "every receive once");
        for (k, (i, len, bytes)) in results.iter().enumerate() {
            assert_eq!(*i, k, "each receive exactly once");
            assert_eq!(*len as usize, i + 1, "receive {i}: another's completion");
            assert_eq!(
                &bytes[..i + 1],
                &pattern(128, *i as u8)[..i + 1],
                "receive {i}"
            );
        }
        assert_eq!(b.outstanding(), 0);
        assert_eq!(a.outstanding(), 0);
        QP_B.with(|c| c.set(None));
    });
}

// ---------------------------------------------------------------------------------------
// 3. Volatile reads
// ---------------------------------------------------------------------------------------

/// `read_volatile` of a region a scope is sending from (a shared borrow: allowed, the NIC only
/// reads) sees its bytes; out-of-range and overflowing offsets are refused.
#[test]
#[ignore = "needs the testbed VM"]
fn volatile_reads_during_a_scoped_send_and_at_the_edges() {
    let _l = alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = deep_pair(&pd);
    let msg = host_region(&pd, &pattern(4096, 3), 4096, RW);
    let mut inbox = host_region(&pd, &[], 4096, Access::LOCAL_WRITE);
    scope(|s| {
        let r = s.recv(&b, &mut inbox).unwrap();
        let w = s.send(&a, &msg, None).unwrap();
        let mut out = [0u8; 16];
        msg.read_volatile(4080, &mut out).unwrap();
        assert_eq!(&out[..], &pattern(4096, 3)[4080..]);
        assert!(msg.read_volatile(4081, &mut out).is_err());
        assert!(msg.read_volatile(u64::MAX - 4, &mut out).is_err());
        assert!(msg.read_volatile(u64::MAX, &mut []).is_err());
        msg.read_volatile(4096, &mut []).unwrap();
        w.spin().unwrap();
        r.spin().unwrap();
    });
    assert_eq!(inbox.bytes().unwrap(), &pattern(4096, 3)[..]);
}
