//! A posted request's handle, and how a request ends: [`Done`] or [`WorkError`], each with
//! the region back.

use super::ticket::{blocking_wait, busy_wait, timed_wait, Handle, Ticket};
use super::QueuePair;
use crate::error::Error;
use crate::mr::{Backing, MemoryRegion};
use crate::part::Local;
use crate::slots::{wr_id, RawCompletion};
use crate::wr::{WorkCompletion, WorkKind};
use std::fmt;
use std::time::Duration;

/// A finished request: the region back, and what the completion said.
#[derive(Debug)]
pub struct Done<B: Backing> {
    /// The region, back with the CPU.
    pub region: MemoryRegion<B>,
    /// The completion.
    pub wc: WorkCompletion,
}

/// A request that was refused or failed, with its region back.
#[derive(Debug)]
pub struct WorkError<B: Backing> {
    /// What went wrong.
    pub error: Error,
    /// The region, back with the CPU.
    pub region: MemoryRegion<B>,
}

impl<B: Backing> fmt::Display for WorkError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: Backing> std::error::Error for WorkError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// How a posted request ended.
pub type Outcome<B> = std::result::Result<Done<B>, WorkError<B>>;

/// The outcome of a failed request, built out of line (a failure is rare): the hot path
/// then never writes a whole outcome to memory to take the region back out.
#[cold]
#[inline(never)]
fn failed<B: Backing>(error: Error, region: MemoryRegion<B>) -> Outcome<B> {
    Err(WorkError { error, region })
}

/// The error of a failed request, its region dropped: for callers that give up on the
/// region when the request fails (`?` in a function returning [`crate::Result`]).
impl<B: Backing> From<WorkError<B>> for Error {
    fn from(e: WorkError<B>) -> Error {
        e.error
    }
}

/// A posted request; [`Pending::spin`] returns its region with the completion.
///
/// Dropping it before completion is safe: the region stays with the queue pair until the NIC
/// is done with it (its completion, or the flush when the queue pair is destroyed).
#[must_use = "dropping a Pending leaves its region with the queue until the request completes"]
pub struct Pending<'q, B: Backing> {
    pub(super) ticket: Ticket<'q, Local<B>>,
}

impl<B: Backing> fmt::Debug for Pending<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ticket.fmt("Pending", f)
    }
}

impl<'q, B: Backing> Pending<'q, B> {
    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.ticket.wr_id()
    }

    /// Polls once; the outcome if the request has completed, else the handle back.
    ///
    /// # Errors
    /// `Err(self)` while the request is still in flight.
    #[inline]
    pub fn try_complete(mut self) -> std::result::Result<Outcome<B>, Self> {
        let Some(c) = self.ticket.poll_done() else {
            return Err(self);
        };
        let local = self.ticket.take_lent();
        let t = &self.ticket;
        let (qp, index, gen, kind) = (t.qp, t.index, t.gen, t.kind);
        // The ticket has given back what it lent: its `Drop` would have nothing to do (it
        // holds only a reference and plain numbers besides), so it is skipped. A panic in
        // `poll_done` or `take_lent` still drops `self` as usual.
        std::mem::forget(self);
        let region = local.into_region();
        // Built here from the raw completion, not through a `Result<WorkCompletion>`: one
        // move of the outcome fewer on the hot path.
        match qp.completion_result(index, gen, kind, c) {
            Ok(wc) => Ok(Ok(Done { region, wc })),
            Err(error) => Ok(failed(error, region)),
        }
    }

    /// Busy-polls until the request completes.
    pub fn spin(self) -> Outcome<B> {
        busy_wait(self)
    }

    /// Records `waker` in the request's slot: whoever polls the queue pair and records the
    /// completion wakes it (for a reactor other than tokio's; see [`crate::reactor`]).
    /// Allocates nothing (a waker clone is a reference count). A waker whose `clone` or `drop`
    /// panics unwinds out of this call with the slot consistent (see docs/safety.md,
    /// "Unwinding").
    pub fn register_waker(&self, waker: &std::task::Waker) {
        super::wake::register_waker(self.ticket.qp, self.ticket.index, waker);
    }

    /// Waits for the completion sleeping in the kernel on the completion channel (see
    /// [`QueuePairBuilder::completion_channel`](crate::QueuePairBuilder::completion_channel)),
    /// for at most `timeout` (`Duration::MAX`, or any timeout past what
    /// [`Instant`](std::time::Instant) can hold, waits for as long as it takes); without a
    /// channel it polls, yielding between polls.
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout` or the notification
    /// cannot be armed.
    pub fn wait(self, timeout: Duration) -> std::result::Result<Outcome<B>, Self> {
        blocking_wait(self, timeout)
    }

    /// As [`Pending::spin`], for at most `timeout` (`Duration::MAX` waits for as long as it
    /// takes, as `spin` does).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn spin_timeout(self, timeout: Duration) -> std::result::Result<Outcome<B>, Self> {
        timed_wait(self, timeout)
    }
}

impl<'q, B: Backing> Handle<'q> for Pending<'q, B> {
    type Out = Outcome<B>;
    fn try_complete(self) -> std::result::Result<Self::Out, Self> {
        Pending::try_complete(self)
    }
    fn qp(&self) -> &'q QueuePair {
        self.ticket.qp
    }
}

/// A completion with an error status as a typed error naming the request.
#[cold]
pub(super) fn completion_error(index: u32, gen: u32, kind: WorkKind, c: RawCompletion) -> Error {
    let text = crate::sys::cq::status_text(c.status());
    Error::Completion {
        wr_id: wr_id(index, gen),
        kind,
        qp_num: c.qp_num(),
        status: c.status(),
        status_text: text,
        vendor_err: c.vendor_err(),
    }
}

impl<'q, B: crate::mr::Backing> super::Pending<'q, B> {
    /// One poll of the request for a reactor's future (see [`crate::reactor`]): its outcome
    /// if it has completed (or a poll of the CQ finds it), else its waker recorded in its
    /// slot, the CQ armed, and `wait` asked to wait for the queue pair's fds
    /// ([`QueuePair::completion_fd`], [`QueuePair::cm_event_fd`]) with the waker of the
    /// `Context` it is given (not the task's: the queue pair's fan-out waker, which wakes
    /// every task awaiting one of its requests, so that none depends on another's polls),
    /// taking their events when one is ready. Allocates nothing and takes no lock.
    ///
    /// # Panics
    /// If polled again after it returned the outcome.
    #[inline]
    pub fn poll_with(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wait: impl Fn(&'q QueuePair, &mut std::task::Context<'_>) -> crate::reactor::WaitStep,
    ) -> std::task::Poll<super::Outcome<B>> {
        // The completion already polled, or in the queue (an await that finds its request
        // done): the outcome built here as `try_complete` builds it, with no waker touched
        // and no round through the waiting code, whose generic result would be one more
        // move of it.
        if let Some(c) = self.ticket.poll_done() {
            let region = self.ticket.take_lent().into_region();
            let t = &self.ticket;
            return std::task::Poll::Ready(
                match t.qp.completion_result(t.index, t.gen, t.kind, c) {
                    Ok(wc) => Ok(super::Done { region, wc }),
                    Err(error) => failed(error, region),
                },
            );
        }
        self.poll_waiting(cx, wait)
    }

    /// [`Pending::poll_with`] of a request not yet done: the waiting code, out of line.
    #[inline(never)]
    fn poll_waiting(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wait: impl Fn(&'q QueuePair, &mut std::task::Context<'_>) -> crate::reactor::WaitStep,
    ) -> std::task::Poll<super::Outcome<B>> {
        super::wake::poll_ticket(&mut self.ticket, cx, wait).map(|(local, result)| {
            let region = local.into_region();
            match result {
                Ok(wc) => Ok(super::Done { region, wc }),
                Err(error) => failed(error, region),
            }
        })
    }
}

// Awaiting a handle polls its ticket; nothing in it is pinned (no pin projection is ever made),
// so the handles are `Unpin` whatever they hold.
impl<B: crate::mr::Backing> Unpin for super::Pending<'_, B> {}

/// Awaiting a [`Pending`](super::Pending) (the `tokio` feature) resolves to the same
/// [`Outcome`](super::Outcome) as [`Pending::spin`](super::Pending::spin): the region comes
/// back with the completion. Dropping the future before that (a `select!` that lost, a
/// timeout) leaves the region in the request's slot until the NIC is done with it.
#[cfg(feature = "tokio")]
impl<B: crate::mr::Backing> std::future::Future for super::Pending<'_, B> {
    type Output = super::Outcome<B>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.poll_with(cx, super::wake::with_tokio::step)
    }
}
