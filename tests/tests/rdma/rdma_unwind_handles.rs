//! Panic injection on every handle type (docs/safety.md, "Unwinding"): a waker panicking in
//! `wake`, `clone` or `drop` on `Pending`, `PartsPending`, `SrqPending` (also awaited in a
//! tokio runtime), `InlinePending` and `ScopedPending`; no region is freed or un-borrowed
//! while posted, no completion is lost, no slot leaks. Runs in the testbed VM.

use integration_tests::evil_waker::{evil, Site};
use integration_tests::injection::*;
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, pattern, pd};
use rdma_dmabuf::{
    scope_with_deadline, HostBuffer, Local, MemoryRegion, QueuePairBuilder, SharedReceiveQueue,
};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::task::Waker;
use std::time::Duration;

/// An owned receive's handle, as the scenario below drives it.
trait OwnedRecv: Sized {
    /// One poll with `waker`, through `via` (in `rt` for tokio); whether it panicked.
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool;
    /// Waits (bounded) for the message and returns its first `LEN` bytes.
    fn bytes(self, what: &str) -> Vec<u8>;
}

impl<B: rdma_dmabuf::Backing> OwnedRecv for rdma_dmabuf::Pending<'_, B>
where
    MemoryRegion<B>: HostBytes,
{
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        via.poll_once(rt, w, self)
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.spin_timeout(T).expect(what).expect(what);
        done.region.first_bytes()
    }
}

impl<B: rdma_dmabuf::Backing> OwnedRecv for rdma_dmabuf::SrqPending<'_, B>
where
    MemoryRegion<B>: HostBytes,
{
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        via.poll_once(rt, w, self)
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.spin_timeout(T).expect(what).expect(what);
        done.region.first_bytes()
    }
}

impl OwnedRecv for rdma_dmabuf::PartsPending<'_, Local<HostBuffer>, 2> {
    fn poll_evil(&mut self, _: Via, _: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        poll_once(w, |cx| self.poll_with(cx, parked))
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.spin_timeout(T).expect(what).expect(what);
        let mut v = Vec::new();
        for p in done.parts {
            v.extend_from_slice(&p.into_region().first_bytes()[..LEN / 2]);
        }
        v
    }
}

/// The first `LEN` bytes of a host region.
trait HostBytes {
    fn first_bytes(&self) -> Vec<u8>;
}

impl HostBytes for MemoryRegion<HostBuffer> {
    fn first_bytes(&self) -> Vec<u8> {
        self.bytes().unwrap()[..LEN].to_vec()
    }
}

/// Holes 3 and 4 for an owned receive, and the same for `clone`: an evil receive posted
/// before a plain one, its waker registered (`clone` may panic there), then either the
/// handle dropped while posted (`drop` panics: the receive must stay posted and registered,
/// so the first message lands and its sender sees success), or both messages sent and one
/// poll made that records both completions (`wake` panics on the first: the second must not
/// be lost, and both carry the right bytes). `poll` polls the receiving queue; `posted`
/// says how many receives it still holds, where it can tell.
fn owned_recv<H: OwnedRecv>(
    site: Site,
    via: Via,
    (evil_recv, plain): (H, H),
    send: impl Fn(u8),
    poll: impl Fn() -> rdma_dmabuf::Result<usize>,
    posted: impl Fn() -> Option<usize>,
) {
    let mut evil_recv = evil_recv;
    let rt = via.runtime();
    let (e, waker) = evil(site);
    let _disarm = e.disarm_on_drop();
    e.arm();
    let did = evil_recv.poll_evil(via, &rt, &waker);
    expect_panic(&e, site, REGISTERING, did, "registering");
    if site == Site::Drop {
        // Hole 3: the region must go into the slot before the waker's drop panics.
        assert!(
            panicked(|| drop(evil_recv)),
            "dropping the handle raised the panic"
        );
        if let Some(n) = posted() {
            assert_eq!(n, 2, "the dropped handle's receive stays posted");
        }
        send(1);
        send(2);
        assert_eq!(plain.bytes("second message"), pattern(LEN, 2));
        poll().unwrap();
        if let Some(n) = posted() {
            assert_eq!(n, 0, "the abandoned receive was released");
        }
    } else {
        send(1);
        send(2);
        // Hole 4: both completions come in one poll; the first one's waker panics.
        let did = panicked(|| drop(poll()));
        expect_panic(&e, site, &[Site::Wake], did, "polling");
        e.disarm();
        assert_eq!(plain.bytes("no completion lost"), pattern(LEN, 2));
        assert_eq!(evil_recv.bytes("first message"), pattern(LEN, 1));
    }
    e.disarm();
    drop(waker);
}

/// The owned receive (`Pending`).
fn pending_recv(site: Site, via: Via) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let post = || b.post_recv(recv_region(&pd)).unwrap();
    let handles = (post(), post());
    let send = |seed| send(&pd, &a, seed);
    owned_recv(
        site,
        via,
        handles,
        send,
        || b.poll(),
        || Some(b.outstanding()),
    );
}

/// A receive of two parts (`PartsPending`).
fn parts_recv(site: Site) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let post = || {
        let half = || Local::new(recv_region(&pd), 0..LEN as u64 / 2);
        b.post_recv_parts([half(), half()]).unwrap()
    };
    let handles = (post(), post());
    let send = |seed| send(&pd, &a, seed);
    owned_recv(
        site,
        Via::Reactor,
        handles,
        send,
        || b.poll(),
        || Some(b.outstanding()),
    );
}

/// A receive on a shared receive queue (`SrqPending`).
fn srq_recv(site: Site, via: Via) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let srq = SharedReceiveQueue::new(&pd, 8).unwrap();
    let (a, _b) = connect_pair(
        QueuePairBuilder::new(&pd),
        QueuePairBuilder::new(&pd).srq(&srq),
    );
    let post = || srq.post_recv(recv_region(&pd)).unwrap();
    let handles = (post(), post());
    let send = |seed| send(&pd, &a, seed);
    owned_recv(site, via, handles, send, || srq.poll(), || None);
}

/// The same for inline sends (`InlinePending`): nothing is lent, but no completion may be
/// lost and no slot leaked. The first send is posted before any receive, so it waits out a
/// receiver-not-ready back-off (`DEFAULT_MIN_RNR_TIMER`, about 160 ms) and is in flight
/// when its waker is registered.
fn inline_send(site: Site) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = connect_pair(
        QueuePairBuilder::new(&pd)
            .max_inline_data(LEN as u32)
            .completion_channel(true),
        QueuePairBuilder::new(&pd),
    );
    let mut evil_send = a.post_send_inline(&pattern(LEN, 1), None).unwrap();
    let (e, waker) = evil(site);
    let _disarm = e.disarm_on_drop();
    e.arm();
    let did = poll_once(&waker, |cx| evil_send.poll_with(cx, parked));
    expect_panic(&e, site, REGISTERING, did, "registering");
    let r1 = b.post_recv(recv_region(&pd)).unwrap();
    let r2 = b.post_recv(recv_region(&pd)).unwrap();
    let plain = a.post_send_inline(&pattern(LEN, 2), None).unwrap();
    if site == Site::Drop {
        assert!(
            panicked(|| drop(evil_send)),
            "dropping the handle raised the panic"
        );
    } else {
        std::thread::sleep(Duration::from_millis(600)); // both sends complete
        let did = panicked(|| drop(a.poll()));
        expect_panic(&e, site, &[Site::Wake], did, "polling");
        e.disarm();
        evil_send.spin().expect("first send");
    }
    e.disarm();
    plain.spin_timeout(T).expect("no completion lost").unwrap();
    for (r, seed) in [(r1, 1), (r2, 2)] {
        let got = r.spin_timeout(T).expect("message").unwrap();
        assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, seed)[..]);
    }
    a.poll().unwrap();
    assert_eq!(a.outstanding(), 0, "no slot is leaked");
    drop(waker);
}

/// The same for scoped receives (`ScopedPending`, the borrowed layer).
fn scoped_recv(site: Site) {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let (e, waker) = evil(site);
    let _disarm = e.disarm_on_drop();
    let (mut first, mut second) = (recv_region(&pd), recv_region(&pd));
    let out = catch_unwind(AssertUnwindSafe(|| {
        scope_with_deadline(T, |s| {
            let mut evil_recv = s.recv(&b, &mut first).unwrap();
            let plain = s.recv(&b, &mut second).unwrap();
            e.arm();
            let did = poll_once(&waker, |cx| evil_recv.poll_with(cx, parked));
            expect_panic(&e, site, REGISTERING, did, "registering");
            if site == Site::Drop {
                // Unwinds out of the closure: the drain flushes and waits for both receives.
                drop(evil_recv);
                unreachable!("dropping the handle raised the panic");
            }
            send(&pd, &a, 1);
            send(&pd, &a, 2);
            let did = panicked(|| drop(b.poll()));
            expect_panic(&e, site, &[Site::Wake], did, "polling");
            e.disarm();
            plain.spin().expect("no completion lost");
            evil_recv.spin().expect("first message");
        })
    }));
    e.disarm();
    b.poll().unwrap();
    assert_eq!(
        b.outstanding(),
        0,
        "the scope ended with a receive still posted"
    );
    if site == Site::Drop {
        assert!(out.is_err(), "the drop's panic went on after the drain");
        assert!(b.is_in_error(), "the unwinding scope flushed its receives");
    } else {
        out.expect("the scope ends normally");
        assert_eq!(&first.bytes().unwrap()[..LEN], &pattern(LEN, 1)[..]);
        assert_eq!(&second.bytes().unwrap()[..LEN], &pattern(LEN, 2)[..]);
    }
    drop(waker);
}

fn every_handle(site: Site) {
    pending_recv(site, Via::Reactor);
    pending_recv(site, Via::Tokio);
    parts_recv(site);
    srq_recv(site, Via::Reactor);
    srq_recv(site, Via::Tokio);
    inline_send(site);
    scoped_recv(site);
}

#[test]
#[ignore = "needs the testbed VM"]
fn every_handle_survives_a_waker_that_panics_in_wake() {
    every_handle(Site::Wake);
}

#[test]
#[ignore = "needs the testbed VM"]
fn every_handle_survives_a_waker_that_panics_in_clone() {
    every_handle(Site::Clone);
}

#[test]
#[ignore = "needs the testbed VM"]
fn every_handle_survives_a_waker_that_panics_in_drop() {
    every_handle(Site::Drop);
}
