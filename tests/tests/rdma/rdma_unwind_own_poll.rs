//! A handle's poll finishes its own request in one step (`QueuePair::poll_for`): these tests
//! try from safe code to lose the request's completion when another task's waker panics in
//! the same poll, to keep a region from its owner or in a freed slot, and to deliver a wake to
//! the wrong handle after a slot is reused. The rule: the poll records the completion in its
//! slot whenever a panic is pending, never only on the unwinding stack. Runs in the testbed VM (some tests count MRs and take a lock to run alone).

use integration_tests::counts::rdma_resources;
use integration_tests::evil_waker::{evil, Disarm, Evil, Site};
use integration_tests::injection::{pair, panicked, parked, recv_region, send, LEN, T};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, pattern, pd};
use rdma_dmabuf::{
    Access, HostBuffer, Local, Pending, ProtectionDomain, QueuePair, QueuePairBuilder,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How long a handle that should already be complete is given.
const SHORT: Duration = Duration::from_secs(3);

/// A waker that counts its wakes.
struct Counting(AtomicUsize);

impl Wake for Counting {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Counting>, Waker) {
    let c = Arc::new(Counting(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

/// A waker that panics in `wake`, registered by `register` and then armed; disarmed when the
/// guard drops.
fn armed_panic_in_wake(register: impl FnOnce(&Waker)) -> (Arc<Evil>, Disarm) {
    let (e, evil_waker) = evil(Site::Wake);
    let disarm = e.disarm_on_drop();
    register(&evil_waker);
    e.arm();
    (e, disarm)
}

/// Gives the NIC time to put every completion in the CQ (nobody polls meanwhile).
fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

/// On `b`, two receives, r1 and r2, both completed (`a` sent messages 1 and 2 and the CQ holds
/// both completions, nobody having polled), and r2's waker armed to panic in `wake`.
fn two_receives_second_panics<'q>(
    pd: &Arc<ProtectionDomain>,
    a: &QueuePair,
    b: &'q QueuePair,
) -> (
    Pending<'q, HostBuffer>,
    Pending<'q, HostBuffer>,
    Arc<Evil>,
    Disarm,
) {
    let r1 = b.post_recv(recv_region(pd)).unwrap();
    let r2 = b.post_recv(recv_region(pd)).unwrap();
    let (e, disarm) = armed_panic_in_wake(|w| r2.register_waker(w));
    send(pd, a, 1);
    send(pd, a, 2);
    settle();
    (r1, r2, e, disarm)
}

/// `r1` is polled through the reactor API (`poll_with`, by `&mut`) while its completion and
/// another request's are in the CQ, and the other request's waker panics in `wake`. The poll
/// unwinds (documented); `r1` must still complete afterwards: its completion is recorded in
/// its slot before the panic is raised (the first version of `poll_finding` retired the slot
/// and kept the completion in a local that the panic threw away).
#[test]
#[ignore = "needs the testbed VM"]
fn own_completion_survives_another_wakers_panic_in_poll_with() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (mut r1, r2, e, _disarm) = two_receives_second_panics(&pd, &a, &b);
    let mut cx = Context::from_waker(Waker::noop());
    let mut out = None;
    let did = panicked(|| {
        if let Poll::Ready(o) = r1.poll_with(&mut cx, parked) {
            out = Some(o);
        }
    });
    e.disarm();
    assert!(did, "r2's waker panicked in the poll that consumed both");
    assert!(out.is_none(), "the poll unwound");
    let got = r1
        .spin_timeout(SHORT)
        .expect("r1's completion was lost: still pending after the panic")
        .expect("r1 succeeds");
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 1)[..]);
    let got = r2.spin_timeout(T).expect("r2 completes").expect("ok");
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 2)[..]);
    assert_eq!(b.outstanding(), 0);
}

/// The same through a batch's `PartsPending` (`Ticket::try_finish`).
#[test]
#[ignore = "needs the testbed VM"]
fn batch_completion_survives_another_wakers_panic_in_poll_with() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let dst = host_region(
        &pd,
        &[],
        2 * LEN,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    );
    let remote = dst.remote().unwrap();
    let r = b.post_recv(recv_region(&pd)).unwrap();
    let src = |seed| host_region(&pd, &pattern(LEN, seed), LEN, Access::empty());
    let mut batch = a
        .post_write_batch(
            [
                Local::new(src(7), 0..LEN as u64),
                Local::new(src(8), 0..LEN as u64),
            ],
            [remote, remote],
        )
        .map_err(|e| e.error)
        .unwrap();
    let s2 = a
        .post_send(Local::new(src(9), 0..LEN as u64), None)
        .unwrap();
    let (e, _disarm) = armed_panic_in_wake(|w| s2.register_waker(w));
    settle();
    let mut cx = Context::from_waker(Waker::noop());
    let did = panicked(|| {
        assert!(batch.poll_with(&mut cx, parked).is_pending());
    });
    e.disarm();
    assert!(did, "s2's waker panicked");
    let done = batch
        .spin_timeout(SHORT)
        .expect("the batch's completion was lost: still pending after the panic")
        .map_err(|e| e.error)
        .expect("batch ok");
    assert_eq!(done.parts.len(), 2);
    s2.spin_timeout(T).expect("s2").expect("ok");
    r.spin_timeout(T).expect("r").expect("ok");
    assert_eq!(a.outstanding(), 0);
}

/// The same for an inline send (`InlinePending::finish`).
#[test]
#[ignore = "needs the testbed VM"]
fn inline_completion_survives_another_wakers_panic_in_poll_with() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd)
            .completion_channel(true)
            .max_inline_data(64),
        QueuePairBuilder::new(&pd).completion_channel(true),
    );
    let r1 = b.post_recv(recv_region(&pd)).unwrap();
    let r2 = b.post_recv(recv_region(&pd)).unwrap();
    let mut s1 = a.post_send_inline(&pattern(16, 3), None).unwrap();
    let src = host_region(&pd, &pattern(LEN, 4), LEN, Access::empty());
    let s2 = a.post_send(Local::new(src, 0..LEN as u64), None).unwrap();
    let (e, _disarm) = armed_panic_in_wake(|w| s2.register_waker(w));
    settle();
    let mut cx = Context::from_waker(Waker::noop());
    let did = panicked(|| {
        assert!(s1.poll_with(&mut cx, parked).is_pending());
    });
    e.disarm();
    assert!(did, "s2's waker panicked");
    s1.spin_timeout(SHORT)
        .expect("the inline send's completion was lost: still pending after the panic")
        .expect("ok");
    s2.spin_timeout(T).expect("s2").expect("ok");
    r1.spin_timeout(T).expect("r1").expect("ok");
    r2.spin_timeout(T).expect("r2").expect("ok");
    assert_eq!(a.outstanding(), 0);
}

/// By value (`try_complete`, as `spin` does): the panic drops the handle, so its outcome is
/// not returned; docs/safety.md ("Unwinding", `QueuePair::poll` row) says "its region is
/// released, the NIC being done with it". Checked: the region is deregistered, nothing is
/// counted outstanding, and dropping the queue pair does not wait for a completion that
/// will never come (its drain waits up to 10 s for `outstanding() == 0`).
#[test]
#[ignore = "needs the testbed VM"]
fn by_value_try_complete_with_another_wakers_panic_releases_the_region() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (r1, r2, e, _disarm) = two_receives_second_panics(&pd, &a, &b);
    let mrs = rdma_resources("mr");
    let did = catch_unwind(AssertUnwindSafe(move || drop(r1.try_complete()))).is_err();
    e.disarm();
    assert!(did, "r2's waker panicked");
    let outstanding = b.outstanding();
    let mrs_after = rdma_resources("mr");
    let got = r2.spin_timeout(T).expect("r2").expect("ok");
    drop(got);
    let mrs_after_r2 = rdma_resources("mr");
    let start = Instant::now();
    drop(b);
    let drop_took = start.elapsed();
    drop(a);
    eprintln!(
        "outstanding after the panic {outstanding}; MRs {mrs} -> {mrs_after} -> \
         {mrs_after_r2} (r2 dropped); dropping the qp took {drop_took:?}"
    );
    assert_eq!(
        outstanding, 0,
        "a request counted outstanding that has completed"
    );
    assert_eq!(mrs_after, mrs - 1, "r1's region released with the panic");
    assert!(
        drop_took < Duration::from_secs(5),
        "dropping the queue pair waited {drop_took:?}"
    );
}

/// Had the first test's completion been lost, r1's slot would be free and reused by the next
/// post (r3), and r1, still held and pending, would register its waker in r3's slot: r3's
/// completion would wake r1's task and not r3's (as it did against the first version).
#[test]
#[ignore = "needs the testbed VM"]
fn a_stale_handle_never_takes_another_requests_wake() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (mut r1, r2, e, _disarm) = two_receives_second_panics(&pd, &a, &b);
    let mut cx = Context::from_waker(Waker::noop());
    let did = panicked(|| {
        let _ = r1.poll_with(&mut cx, parked);
    });
    e.disarm();
    assert!(did, "r2's waker panicked");
    let r3 = b.post_recv(recv_region(&pd)).unwrap();
    let (w3, waker3) = counting();
    r3.register_waker(&waker3);
    let (w1, waker1) = counting();
    // Whatever state r1 is in, registering its waker must not touch r3's slot.
    r1.register_waker(&waker1);
    eprintln!("r1 wr_id {:#x}, r3 wr_id {:#x}", r1.wr_id(), r3.wr_id());
    send(&pd, &a, 3);
    settle();
    b.poll().unwrap();
    let (n1, n3) = (w1.0.load(Ordering::SeqCst), w3.0.load(Ordering::SeqCst));
    eprintln!("wakes: r1's waker {n1}, r3's waker {n3}");
    let got = r3.spin_timeout(T).expect("r3").expect("ok");
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 3)[..]);
    drop(r2);
    drop(r1);
    assert_eq!(n3, 1, "r3's completion woke r3's task");
}

/// Abandoned handles and slot reuse on the `finish` path: a dropped receive, then several
/// generations of the same slot, each finished by its own poll; every message lands in the
/// receive it was meant for and the abandoned one's region is released only with its
/// completion.
#[test]
#[ignore = "needs the testbed VM"]
fn abandoned_then_reused_slots_deliver_to_the_right_handle() {
    // Two tests count the testbed's MRs: every test of this file registers some.
    let _alone = integration_tests::process::alone();
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let mrs = rdma_resources("mr");
    drop(b.post_recv(recv_region(&pd)).unwrap());
    assert_eq!(
        rdma_resources("mr"),
        mrs + 1,
        "the abandoned receive stays registered"
    );
    assert_eq!(b.outstanding(), 1);
    // Fills the abandoned receive.
    send(&pd, &a, 9);
    for seed in 0..6u8 {
        let r = b.post_recv(recv_region(&pd)).unwrap();
        send(&pd, &a, 10 + seed);
        // The first poll also records the abandoned receive's completion and releases it.
        let got = r.spin_timeout(T).expect("r").expect("ok");
        assert_eq!(
            &got.region.bytes().unwrap()[..LEN],
            &pattern(LEN, 10 + seed)[..]
        );
        drop(got);
        assert_eq!(b.outstanding(), 0);
        assert_eq!(rdma_resources("mr"), mrs, "every region released");
    }
}
