//! A waker that panics in `drop` when the poll that finds its request's completion lets go of
//! it (docs/safety.md, "Unwinding"): the handle must be ended by then, with its region given
//! back (dropped while unwinding: the NIC is done with it), so that polling it again is the
//! "polled after it returned its outcome" panic rather than a wait for a completion that has
//! been consumed, and dropping it touches nothing of the request that reuses its slot (whose
//! task must still be woken). For `Pending` and `PartsPending`, awaited through `poll_with`.
//! A handle that dropped the waker before taking back its region fails both checks. Runs in
//! the testbed VM.

use integration_tests::evil_waker::{evil, Site};
use integration_tests::injection::*;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::pd;
use rdma_dmabuf::{Local, QueuePair};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::{Context, Poll, Waker};

/// One poll of `h` with `waker`: `Ok(ready)`, or the panic's message.
fn poll_with<H>(
    h: &mut H,
    waker: &Waker,
    poll: &impl Fn(&mut H, &mut Context<'_>) -> Poll<()>,
) -> Result<bool, String> {
    let mut cx = Context::from_waker(waker);
    match catch_unwind(AssertUnwindSafe(|| poll(h, &mut cx))) {
        Ok(p) => Ok(p.is_ready()),
        Err(e) => Err(e
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| e.downcast_ref::<String>().cloned())
            .unwrap_or_default()),
    }
}

/// The scenario on receives posted by `post` on `b` and polled by `poll`.
fn completion_drops_a_panicking_waker<H>(
    b: &QueuePair,
    send: impl Fn(u8),
    post: impl Fn() -> H,
    poll: impl Fn(&mut H, &mut Context<'_>) -> Poll<()>,
) {
    let (e, waker) = evil(Site::Drop);
    let _disarm = e.disarm_on_drop();
    let mut first = post();
    assert_eq!(poll_with(&mut first, &waker, &poll), Ok(false), "parked");
    send(1);
    // The completing poll lets go of the registered waker, which panics.
    e.arm();
    let plain = Waker::noop();
    let did = poll_with(&mut first, plain, &poll);
    e.disarm();
    assert!(did.is_err(), "the waker's drop panicked out of the poll");
    assert_eq!(e.panicked(), 1);
    assert_eq!(b.outstanding(), 0, "the request's slot is free");
    // The handle has ended: a second poll is the documented panic, not a wait.
    let again = poll_with(&mut first, plain, &poll);
    assert!(
        again
            .as_ref()
            .is_err_and(|m| m.contains("polled after it returned its outcome")),
        "a second poll of the ended handle: {again:?}"
    );
    // The next request reuses the slot; dropping the ended handle leaves its waker alone.
    let (counter, counting) = evil(Site::Wake);
    let mut second = post();
    assert_eq!(
        poll_with(&mut second, &counting, &poll),
        Ok(false),
        "parked"
    );
    drop(first);
    send(2);
    b.poll().expect("poll");
    assert_eq!(
        counter.wakes.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the second request's task was woken by its completion"
    );
    assert_eq!(poll_with(&mut second, plain, &poll), Ok(true));
    assert_eq!(b.outstanding(), 0);
}

#[test]
#[ignore = "needs the testbed VM"]
fn an_owned_receive_ends_before_its_waker_is_dropped() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    completion_drops_a_panicking_waker(
        &b,
        |seed| send(&pd, &a, seed),
        || b.post_recv(recv_region(&pd)).unwrap(),
        |h, cx| h.poll_with(cx, parked).map(|_| ()),
    );
}

#[test]
#[ignore = "needs the testbed VM"]
fn a_receive_of_parts_ends_before_its_waker_is_dropped() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let half = || Local::new(recv_region(&pd), 0..LEN as u64 / 2);
    completion_drops_a_panicking_waker(
        &b,
        |seed| send(&pd, &a, seed),
        || b.post_recv_parts([half(), half()]).unwrap(),
        |h, cx| h.poll_with(cx, parked).map(|_| ()),
    );
}
