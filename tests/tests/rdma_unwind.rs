//! Panic injection: code we do not control (a task's waker panicking in `wake`, `clone` or
//! `drop`) and a closed stderr never unwind past memory the NIC owns (docs/safety.md,
//! "Unwinding"). For every handle type, no region is freed or un-borrowed while posted and
//! no completion is lost. Each of the four holes an independent audit found has its own test,
//! which fails on the code before the fix. Runs in the testbed VM.

use integration_tests::evil_waker::{evil, Evil, Site};
use integration_tests::testbed::Testbed;
use integration_tests::verbs::{connect_pair, host_region, loopback_pair, pattern, pd};
use rdma_dmabuf::reactor::WaitStep;
use rdma_dmabuf::{
    scope_with_deadline, Access, HostBuffer, Local, MemoryRegion, ProtectionDomain, QueuePair,
    QueuePairBuilder, SharedReceiveQueue,
};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

const T: Duration = Duration::from_secs(10);
const LEN: usize = 64;

/// Two connected queue pairs with completion channels (so that a poll parks instead of
/// rescheduling itself through the task's waker) and room for two-part requests.
fn pair(pd: &Arc<ProtectionDomain>) -> (QueuePair, QueuePair) {
    let b = || {
        QueuePairBuilder::new(pd)
            .completion_channel(true)
            .max_sge(2)
    };
    connect_pair(b(), b())
}

fn recv_region(pd: &Arc<ProtectionDomain>) -> MemoryRegion<HostBuffer> {
    host_region(pd, &[], LEN, Access::LOCAL_WRITE)
}

/// Sends `seed`'s pattern from `a` and waits for the send's completion (so the message has
/// landed in `b`'s receive: RC completes a send after the responder's acknowledgement).
fn send(pd: &Arc<ProtectionDomain>, a: &QueuePair, seed: u8) {
    let src = host_region(pd, &pattern(LEN, seed), LEN, Access::empty());
    let p = a
        .post_send(Local::new(src, 0..LEN as u64), None)
        .expect("post send");
    let done = p.wait_timeout(T).expect("send completes");
    done.expect("the send succeeds: its receive is posted and registered");
}

/// Polls `f` once with `waker`, a reactor that says it parked the task; returns whether the
/// poll panicked.
fn poll_once<R>(waker: &Waker, mut f: impl FnMut(&mut Context<'_>) -> Poll<R>) -> bool {
    let mut cx = Context::from_waker(waker);
    match catch_unwind(AssertUnwindSafe(|| f(&mut cx))) {
        Ok(Poll::Ready(_)) => panic!("nothing has been sent yet"),
        Ok(Poll::Pending) => false,
        Err(_) => true,
    }
}

/// How the evil waker is handed to a handle: through the reactor API (`poll_with`, a reactor
/// that parks the task), or as an awaited future inside a tokio runtime, whose step registers
/// the queue's fds with tokio's reactor.
#[derive(Clone, Copy, Debug)]
enum Via {
    Reactor,
    Tokio,
}

/// The reactor API of a handle that is also a future.
trait Awaitable: Future + Unpin {
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output>;
}

impl<B: rdma_dmabuf::mr::Backing> Awaitable for rdma_dmabuf::Pending<'_, B> {
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_with(cx, parked)
    }
}

impl<B: rdma_dmabuf::mr::Backing> Awaitable for rdma_dmabuf::SrqPending<'_, B> {
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_with(cx, parked)
    }
}

impl Via {
    /// The runtime the awaited form is polled in. It must outlive the scenario's evil waker:
    /// dropping a runtime wakes every task registered with its reactor (here, the queue's
    /// fan-out waker, which wakes the slot's waker).
    fn runtime(self) -> Option<tokio::runtime::Runtime> {
        match self {
            Via::Reactor => None,
            Via::Tokio => Some(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap(),
            ),
        }
    }

    fn poll_once<H: Awaitable>(
        self,
        rt: &Option<tokio::runtime::Runtime>,
        waker: &Waker,
        h: &mut H,
    ) -> bool {
        match rt {
            None => poll_once(waker, |cx| h.poll_parked(cx)),
            Some(rt) => {
                let _inside = rt.enter();
                poll_once(waker, |cx| std::pin::Pin::new(&mut *h).poll(cx))
            }
        }
    }
}

fn parked<Q>(_: &Q, _: &mut Context<'_>) -> WaitStep {
    WaitStep::Parked
}

fn panicked(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// Registering a waker clones it once for the slot and drops that probe afterwards (see
/// rdma-dmabuf's `Waiters::register`): a waker that panics in `clone` or `drop` panics there,
/// the slot consistent either way.
const REGISTERING: &[Site] = &[Site::Clone, Site::Drop];

/// Asserts that a poll which ran `evil`'s waker panicked exactly when it should have: at one
/// of the sites `at`.
fn expect_panic(evil: &Evil, site: Site, at: &[Site], did: bool, what: &str) {
    assert_eq!(
        did,
        at.contains(&site),
        "{what}: panicked {did} with the waker panicking in {site:?}"
    );
    if did {
        assert!(
            evil.panicked() > 0,
            "{what}: the injected panic is the one seen"
        );
    }
}

/// Hole 1. A waker that panics in `wake`, on an owned send of `a`, is woken by the poll a
/// scope's drain makes for its write on `a`; the drain must still wait for (and here, flush)
/// the scope's receive on `b` before the scope ends, and raise the panic only then. Before
/// the fix the panic left the drain at once: `scope` returned with the receive posted into
/// the borrowed region.
#[test]
#[ignore = "needs the testbed VM"]
fn a_panicking_waker_does_not_cut_a_scopes_drain_short() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = loopback_pair(&pd);
    let r1 = b.post_recv(recv_region(&pd)).unwrap();
    let src = host_region(&pd, &pattern(LEN, 1), LEN, Access::empty());
    let s1 = a.post_send(src, None).unwrap();
    let (e, waker) = evil(Site::Wake);
    let _disarm = e.disarm_on_drop();
    s1.register_waker(&waker);
    e.arm();
    std::thread::sleep(Duration::from_millis(200)); // s1's completion waits in a's CQ
    let target = host_region(&pd, &[], LEN, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let remote = target.remote().unwrap();
    let data = host_region(&pd, &pattern(LEN, 2), LEN, Access::empty());
    let mut borrowed = recv_region(&pd);
    let out = catch_unwind(AssertUnwindSafe(|| {
        scope_with_deadline(Duration::from_secs(2), |s| {
            s.write(&a, &data, remote, None).unwrap();
            s.recv(&b, &mut borrowed).unwrap();
        })
    }));
    assert!(out.is_err(), "the waker's panic is raised");
    assert_eq!(e.panicked(), 1);
    b.poll().unwrap();
    assert_eq!(
        b.outstanding(),
        0,
        "the scope ended with its receive still posted into the borrowed region"
    );
    assert!(
        b.is_in_error(),
        "the receive that no message filled was flushed"
    );
    assert_eq!(&borrowed.bytes().unwrap()[..LEN], &[0; LEN][..]);
    e.disarm();
    s1.wait()
        .expect("the send's completion was recorded before the panic");
    r1.wait().expect("the first message");
}

/// Hole 2. With stderr a closed pipe, `eprintln!` panics; the drain's "still in flight"
/// notice must not unwind out of it. A child process (this test again, with stderr a broken
/// pipe and libtest's capture off, so that printing really reaches fd 2) lets a scope's
/// receive outlive the drain deadline.
#[test]
#[ignore = "needs the testbed VM"]
fn a_closed_stderr_does_not_cut_a_scopes_drain_short() {
    const CHILD: &str = "RDMA_UNWIND_STDERR_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let out = catch_unwind(stderr_closed_child);
        match out {
            Ok(()) => println!("CHILD PASSED"),
            Err(p) => println!(
                "CHILD FAILED: {}",
                p.downcast_ref::<String>()
                    .map(String::as_str)
                    .or(p.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            ),
        }
        return;
    }
    let me = std::env::current_exe().unwrap();
    // This test binary (built by this workspace), run again as the child.
    let mut cmd = std::process::Command::new(me);
    cmd.args(["--ignored", "--exact", "--nocapture", "--test-threads=1"])
        .arg("a_closed_stderr_does_not_cut_a_scopes_drain_short")
        .env(CHILD, "1");
    let out = integration_tests::process::run(&mut cmd, Duration::from_secs(120));
    let text = integration_tests::process::text(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("CHILD PASSED"), "{text}");
}

fn stderr_closed_child() {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two fds pipe() writes.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: fds[0] is the read end this process just made and nothing else uses; closing
    // it leaves the write end with no reader (a broken pipe).
    assert_eq!(unsafe { libc::close(fds[0]) }, 0);
    // SAFETY: fds[1] is a live fd; fd 2 becomes a copy of it (the old stderr is closed).
    assert_eq!(unsafe { libc::dup2(fds[1], 2) }, 2);
    // The set-up is what it claims: printing to stderr panics here.
    assert!(
        panicked(|| eprintln!("probe")),
        "eprintln! panics on a closed stderr"
    );

    let tb = Testbed::get();
    let pd = pd(&tb);
    let (_a, b) = loopback_pair(&pd);
    let mut borrowed = recv_region(&pd);
    scope_with_deadline(Duration::from_millis(500), |s| {
        s.recv(&b, &mut borrowed).unwrap();
    });
    b.poll().unwrap();
    assert_eq!(
        b.outstanding(),
        0,
        "the receive was flushed before the scope ended"
    );
    assert!(b.is_in_error());
    assert_eq!(&borrowed.bytes().unwrap()[..LEN], &[0; LEN][..]);
}

/// An owned receive's handle, as the scenario below drives it.
trait OwnedRecv: Sized {
    /// One poll with `waker`, through `via` (in `rt` for tokio); whether it panicked.
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool;
    /// Waits (bounded) for the message and returns its first `LEN` bytes.
    fn bytes(self, what: &str) -> Vec<u8>;
}

impl<B: rdma_dmabuf::mr::Backing> OwnedRecv for rdma_dmabuf::Pending<'_, B>
where
    MemoryRegion<B>: HostBytes,
{
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        via.poll_once(rt, w, self)
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.wait_timeout(T).expect(what).expect(what);
        done.region.first_bytes()
    }
}

impl<B: rdma_dmabuf::mr::Backing> OwnedRecv for rdma_dmabuf::SrqPending<'_, B>
where
    MemoryRegion<B>: HostBytes,
{
    fn poll_evil(&mut self, via: Via, rt: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        via.poll_once(rt, w, self)
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.wait_timeout(T).expect(what).expect(what);
        done.region.first_bytes()
    }
}

impl OwnedRecv for rdma_dmabuf::PartsPending<'_, Local<HostBuffer>, 2> {
    fn poll_evil(&mut self, _: Via, _: &Option<tokio::runtime::Runtime>, w: &Waker) -> bool {
        poll_once(w, |cx| self.poll_with(cx, parked))
    }
    fn bytes(self, what: &str) -> Vec<u8> {
        let done = self.wait_timeout(T).expect(what).expect(what);
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
        evil_send.wait().expect("first send");
    }
    e.disarm();
    plain.wait_timeout(T).expect("no completion lost").unwrap();
    for (r, seed) in [(r1, 1), (r2, 2)] {
        let got = r.wait_timeout(T).expect("message").unwrap();
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
            plain.wait().expect("no completion lost");
            evil_recv.wait().expect("first message");
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

/// A task awaits a receive on the same queue pair as a receive whose slot holds a waker that
/// panics when woken. The reactor's wake of the queue (the fan-out) must not raise that panic
/// inside the runtime's I/O driver, which would stop the runtime for every task (found by the
/// independent review: tokio's current-thread runtime lost its driver). The awaiting task is
/// woken, and the runtime goes on working.
#[test]
#[ignore = "needs the testbed VM"]
fn a_waker_that_panics_in_the_reactors_wake_does_not_stop_the_runtime() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let evil_recv = b.post_recv(recv_region(&pd)).unwrap();
    let mut mine = b.post_recv(recv_region(&pd)).unwrap();
    let (e, waker) = evil(Site::Wake);
    let _disarm = e.disarm_on_drop();
    evil_recv.register_waker(&waker);
    e.arm();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sender = std::thread::spawn({
        let pd = pd.clone();
        move || {
            std::thread::sleep(Duration::from_millis(300));
            send(&pd, &a, 1);
            send(&pd, &a, 2);
            a
        }
    });
    let got = rt.block_on(async { tokio::time::timeout(T, &mut mine).await });
    let got = got.expect("the awaiting task was woken").unwrap();
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 2)[..]);
    assert_eq!(e.panicked(), 1, "the evil waker was woken, by the reactor");
    let slept = rt.block_on(async {
        let start = std::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(100)).await;
        start.elapsed()
    });
    assert!(
        slept < Duration::from_secs(5),
        "the runtime still runs: {slept:?}"
    );
    e.disarm();
    let first = evil_recv.wait_timeout(T).expect("first message").unwrap();
    assert_eq!(&first.region.bytes().unwrap()[..LEN], &pattern(LEN, 1)[..]);
    drop(sender.join().unwrap());
}

/// A waker whose `clone` panics while it is registered must not leave its request's slot
/// unable to store the next task's waker (futures' `AtomicWaker` stays "registering" if the
/// clone panics inside it, and then drops every later registration: an awaited request in
/// that slot was woken only by its timeout, 8 s after its message, in the independent
/// review). The next await on the same handle wakes when the message lands.
#[test]
#[ignore = "needs the testbed VM"]
fn a_slot_whose_waker_clone_panicked_still_wakes_the_next_task() {
    let tb = Testbed::get();
    let pd = pd(&tb);
    let (a, b) = pair(&pd);
    let mut r = b.post_recv(recv_region(&pd)).unwrap();
    let (e, waker) = evil(Site::Clone);
    let _disarm = e.disarm_on_drop();
    e.arm();
    assert!(
        poll_once(&waker, |cx| r.poll_with(cx, parked)),
        "the clone panicked"
    );
    e.disarm();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sender = std::thread::spawn({
        let pd = pd.clone();
        move || {
            std::thread::sleep(Duration::from_millis(300));
            send(&pd, &a, 7);
            a
        }
    });
    let start = std::time::Instant::now();
    let got = rt.block_on(async { tokio::time::timeout(T, &mut r).await });
    let waited = start.elapsed();
    let got = got.expect("woken within the timeout").unwrap();
    assert_eq!(&got.region.bytes().unwrap()[..LEN], &pattern(LEN, 7)[..]);
    assert!(
        waited < Duration::from_secs(4),
        "woken {waited:?} after the await began (message at 0.3 s): only a timer woke it"
    );
    drop(sender.join().unwrap());
}
