//! A posted request's handle, and how a request ends: [`Done`] or [`WorkError`], each with
//! the region back.

use super::QueuePair;
use crate::deadline::{deadline_after, time_left};
use crate::error::Error;
use crate::mr::{Backing, MemoryRegion};
use crate::part::Local;
use crate::slots::{wr_id, RawCompletion};
use crate::wr::{WorkCompletion, WorkKind};
use rdma_sys as ffi;
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
    pub fn try_complete(mut self) -> std::result::Result<Outcome<B>, Self> {
        let Some((local, result)) = self.ticket.try_finish() else {
            return Err(self);
        };
        let region = local.into_region();
        Ok(match result {
            Ok(wc) => Ok(Done { region, wc }),
            Err(error) => Err(WorkError { error, region }),
        })
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

/// A handle to one posted request: the waits below work on any.
pub(super) trait Handle<'q>: Sized {
    /// What the request ends with.
    type Out;
    /// Polls once: the outcome, or the handle back.
    fn try_complete(self) -> std::result::Result<Self::Out, Self>;
    /// The queue pair it was posted on.
    fn qp(&self) -> &'q QueuePair;
}

/// Busy-polls `h` until its request completes (yielding now and then).
pub(super) fn busy_wait<'q, H: Handle<'q>>(mut h: H) -> H::Out {
    let mut spins = 0u32;
    loop {
        match h.try_complete() {
            Ok(out) => return out,
            Err(again) => h = again,
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

/// Polls `h`, yielding between polls, for at most `timeout`.
pub(super) fn timed_wait<'q, H: Handle<'q>>(
    h: H,
    timeout: Duration,
) -> std::result::Result<H::Out, H> {
    wait_with(h, timeout, |_, _| {
        std::thread::yield_now();
        true
    })
}

/// Waits for `h` sleeping on the completion channel, for at most `timeout`.
pub(super) fn blocking_wait<'q, H: Handle<'q>>(
    h: H,
    timeout: Duration,
) -> std::result::Result<H::Out, H> {
    wait_with(h, timeout, |h, left| {
        h.qp().sleep_for_completion(left).is_ok()
    })
}

/// Polls `h` until its request completes or `timeout` passes; between polls, `pause(h, time
/// left)` waits, or says (`false`) that waiting cannot go on.
fn wait_with<'q, H: Handle<'q>>(
    mut h: H,
    timeout: Duration,
    mut pause: impl FnMut(&H, Duration) -> bool,
) -> std::result::Result<H::Out, H> {
    let deadline = deadline_after(timeout);
    loop {
        match h.try_complete() {
            Ok(out) => return Ok(out),
            Err(again) => h = again,
        }
        let left = time_left(deadline);
        if left.is_zero() || !pause(&h, left) {
            return Err(h);
        }
    }
}

/// What every owned post's handle holds: the request's slot and what it lent to the NIC,
/// which stays here until the completion has been polled. Dropped before that, it leaves what
/// was lent in the slot, where the completion (or the queue pair's destruction) frees it.
pub(super) struct Ticket<'q, T: Send + 'static> {
    pub(super) qp: &'q QueuePair,
    pub(super) index: u32,
    pub(super) gen: u32,
    pub(super) kind: WorkKind,
    pub(super) lent: Option<T>,
}

impl<'q, T: Send + 'static> Ticket<'q, T> {
    /// The request's `wr_id`.
    pub(super) fn wr_id(&self) -> u64 {
        wr_id(self.index, self.gen)
    }

    /// Polls once: if the request has completed, what was lent and how it ended.
    ///
    /// # Panics
    /// If the request's outcome was already returned (a future polled after it resolved).
    pub(super) fn try_finish(&mut self) -> Option<(T, crate::Result<WorkCompletion>)> {
        if self.lent.is_none() {
            panic!("a request handle polled after it returned its outcome");
        }
        let c = self.qp.poll_for(self.index, self.gen)?;
        let lent = self.lent.take().expect("present until completion");
        let result = self
            .qp
            .completion_result(self.index, self.gen, self.kind, c);
        // Last: dropping the task's waker runs its code, which may panic (docs/safety.md,
        // "Unwinding"); by then the NIC is done with `lent` and the slot is free.
        self.qp.forget_waiter(self.index);
        Some((lent, result))
    }

    /// The handle's `Debug`, named `name`.
    pub(super) fn fmt(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("wr_id", &self.wr_id())
            .field("kind", &self.kind)
            .finish()
    }
}

impl<T: Send + 'static> Drop for Ticket<'_, T> {
    fn drop(&mut self) {
        if let Some(lent) = self.lent.take() {
            // What was lent goes into the slot before anything we do not control runs: a
            // panic from the waker's `Drop` below then unwinds with nothing of the NIC's on
            // this stack (docs/safety.md, "Unwinding").
            let back = self
                .qp
                .slots
                .borrow_mut()
                .abandon(self.index, self.gen, Box::new(lent));
            // Completed already: the NIC is done with it, free it now (outside the borrow).
            drop(back);
            self.qp.forget_waiter(self.index);
        }
    }
}

/// A completion with an error status as a typed error naming the request.
pub(super) fn completion_error(index: u32, gen: u32, kind: WorkKind, c: RawCompletion) -> Error {
    // SAFETY: ibv_wc_status_str takes any value.
    let text = unsafe { ffi::ibv_wc_status_str(c.status) };
    // SAFETY: it returns a static NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    Error::Completion {
        wr_id: wr_id(index, gen),
        kind,
        status: c.status,
        status_text: text,
        vendor_err: c.vendor_err,
    }
}
