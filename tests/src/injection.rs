//! Panic injection: the fixtures of `tests/tests/rdma/rdma_unwind*.rs` (docs/safety.md,
//! "Unwinding"): queue pairs, regions and messages, one poll with a waker that may panic,
//! and the checks of where it panicked.

use crate::evil_waker::{Evil, Site};
use crate::verbs::{connect_pair, host_region, pattern};
use rdma_dmabuf::reactor::WaitStep;
use rdma_dmabuf::{
    Access, HostBuffer, Local, MemoryRegion, ProtectionDomain, QueuePair, QueuePairBuilder,
};
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How long a test waits for a completion.
pub const T: Duration = Duration::from_secs(10);
/// Bytes per message.
pub const LEN: usize = 64;

/// Two connected queue pairs with completion channels (so that a poll parks instead of
/// rescheduling itself through the task's waker) and room for two-part requests.
pub fn pair(pd: &Arc<ProtectionDomain>) -> (QueuePair, QueuePair) {
    let b = || {
        QueuePairBuilder::new(pd)
            .completion_channel(true)
            .max_sge(2)
    };
    connect_pair(b(), b())
}

/// A host region the NIC may write.
pub fn recv_region(pd: &Arc<ProtectionDomain>) -> MemoryRegion<HostBuffer> {
    host_region(pd, &[], LEN, Access::LOCAL_WRITE)
}

/// Sends `seed`'s pattern from `a` and waits for the send's completion (so the message has
/// landed in `b`'s receive: RC completes a send after the responder's acknowledgement).
pub fn send(pd: &Arc<ProtectionDomain>, a: &QueuePair, seed: u8) {
    let src = host_region(pd, &pattern(LEN, seed), LEN, Access::empty());
    let p = a
        .post_send(Local::new(src, 0..LEN as u64), None)
        .expect("post send");
    let done = p.spin_timeout(T).expect("send completes");
    done.expect("the send succeeds: its receive is posted and registered");
}

/// Polls `f` once with `waker`, a reactor that says it parked the task; returns whether the
/// poll panicked.
pub fn poll_once<R>(waker: &Waker, mut f: impl FnMut(&mut Context<'_>) -> Poll<R>) -> bool {
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
pub enum Via {
    /// `poll_with`, with a reactor that parks the task.
    Reactor,
    /// `Future::poll` inside a tokio runtime.
    Tokio,
}

/// The reactor API of a handle that is also a future.
pub trait Awaitable: Future + Unpin {
    /// One poll through the reactor API, with a reactor that parks the task.
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output>;
}

impl<B: rdma_dmabuf::Backing> Awaitable for rdma_dmabuf::Pending<'_, B> {
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_with(cx, parked)
    }
}

impl<B: rdma_dmabuf::Backing> Awaitable for rdma_dmabuf::SrqPending<'_, B> {
    fn poll_parked(&mut self, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_with(cx, parked)
    }
}

impl Via {
    /// The runtime the awaited form is polled in. It must outlive the scenario's evil waker:
    /// dropping a runtime wakes every task registered with its reactor (here, the queue's
    /// fan-out waker, which wakes the slot's waker).
    pub fn runtime(self) -> Option<tokio::runtime::Runtime> {
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

    /// Polls `h` once with `waker` this way (in `rt` for tokio); whether it panicked.
    pub fn poll_once<H: Awaitable>(
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

/// A reactor step that says it parked the task (and does nothing).
pub fn parked<Q>(_: &Q, _: &mut Context<'_>) -> WaitStep {
    WaitStep::Parked
}

/// Whether `f` panicked.
pub fn panicked(f: impl FnOnce()) -> bool {
    catch_unwind(AssertUnwindSafe(f)).is_err()
}

/// Registering a waker clones it once for the slot and drops that probe afterwards (see
/// rdma-dmabuf's `Waiters::register`): a waker that panics in `clone` or `drop` panics there,
/// the slot consistent either way.
pub const REGISTERING: &[Site] = &[Site::Clone, Site::Drop];

/// Asserts that a poll which ran `evil`'s waker panicked exactly when it should have: at one
/// of the sites `at`.
pub fn expect_panic(evil: &Evil, site: Site, at: &[Site], did: bool, what: &str) {
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
