//! How the bench waits for a request: busy-polling its handle (`spin`, the blocking path), or
//! awaiting it on a current-thread tokio runtime (`--async yes`), woken through the queue
//! pair's completion channel. Each awaited wait is the runtime's `block_on` of the handle:
//! the reactor path a service's task takes (arm the CQ, sleep in `epoll`, take the event,
//! wake), without a scheduler's switch between tasks.

use rdma_dmabuf::Backing;
use rdma_dmabuf::{
    InlinePending, Outcome, OwnedPart, PartsOutcome, PartsPending, Pending, Result, WorkCompletion,
};
use std::future::Future;

/// A request handle the bench waits for, either way.
pub trait Handle: Future + Sized {
    /// Busy-polls until the request completes.
    fn wait_busy(self) -> Self::Output;
}

impl<B: Backing> Handle for Pending<'_, B> {
    fn wait_busy(self) -> Outcome<B> {
        self.spin()
    }
}

impl<P: OwnedPart, const N: usize> Handle for PartsPending<'_, P, N> {
    fn wait_busy(self) -> PartsOutcome<P, N> {
        self.spin()
    }
}

impl Handle for InlinePending<'_> {
    fn wait_busy(self) -> Result<WorkCompletion> {
        self.spin()
    }
}

/// How requests are waited for.
pub enum Waits {
    /// Busy-polling, as `Pending::spin` does.
    Busy,
    /// Awaited on this runtime.
    Awaited(tokio::runtime::Runtime),
}

impl Waits {
    /// Busy-polling, or (`awaited`) a current-thread runtime with its reactor, made now
    /// (before any clock starts).
    pub fn new(awaited: bool) -> Waits {
        if !awaited {
            return Waits::Busy;
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| examples::fail(&format!("tokio runtime: {e}")));
        Waits::Awaited(rt)
    }

    /// Waits for `h`'s request to complete.
    pub fn finish<H: Handle>(&self, h: H) -> H::Output {
        match self {
            Waits::Busy => h.wait_busy(),
            Waits::Awaited(rt) => rt.block_on(h),
        }
    }
}
