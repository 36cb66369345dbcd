//! What every owned post's handle is made of: its [`Ticket`] (the request's slot and what it
//! lent to the NIC), and the ways to wait for any [`Handle`] (busy-polling, polling with a
//! deadline, sleeping on the completion channel).

use super::QueuePair;
use crate::deadline::{deadline_after, time_left};
use crate::slots::{wr_id, RawCompletion};
use crate::spin::Spinner;
use crate::wr::{WorkCompletion, WorkKind};
use std::fmt;
use std::time::Duration;

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
    let mut spinner = Spinner::new(h.qp().wait.spin_policy());
    loop {
        match h.try_complete() {
            Ok(out) => return out,
            Err(again) => h = again,
        }
        spinner.after_poll();
    }
}

/// Polls `h`, yielding between polls, for at most `timeout`.
pub(super) fn timed_wait<'q, H: Handle<'q>>(
    h: H,
    timeout: Duration,
) -> std::result::Result<H::Out, H> {
    // A yield between every two polls (a timed wait is the patient kind), nothing under
    // `SpinPolicy::Dedicated`.
    let dedicated = h.qp().spin_policy() == crate::SpinPolicy::Dedicated;
    wait_with(h, timeout, move |_, _| {
        if !dedicated {
            std::thread::yield_now();
        }
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
    #[inline]
    pub(super) fn try_finish(&mut self) -> Option<(T, crate::Result<WorkCompletion>)> {
        let c = self.poll_done()?;
        let result = self
            .qp
            .completion_result(self.index, self.gen, self.kind, c);
        Some((self.take_lent(), result))
    }

    /// Polls once: the completion, as the poller recorded it, if the request has completed
    /// (its slot is then free). What was lent stays in the ticket, for the caller to take
    /// ([`Ticket::take_lent`]) straight into its outcome: a batch's parts are an array of
    /// hundreds of bytes, and every move of it is a `memcpy`. The task's waker is let go
    /// of by `take_lent`, after the ticket has ended (see there); nothing between the two
    /// may unwind (the caller only builds its outcome from the completion).
    ///
    /// # Panics
    /// As [`Ticket::try_finish`].
    #[inline(always)]
    pub(super) fn poll_done(&mut self) -> Option<RawCompletion> {
        if self.lent.is_none() {
            panic!("a request handle polled after it returned its outcome");
        }
        self.qp.poll_for(self.index, self.gen)
    }

    /// What was lent, once [`Ticket::poll_done`] has returned the completion: the ticket
    /// ends here (its `Drop` then has nothing to do, and a second poll is the "polled after"
    /// panic), and only then is the task's waker let go of. Dropping the waker runs its
    /// code, which may panic (docs/safety.md, "Unwinding"): by then the NIC is done with
    /// what was lent (dropped with this frame if it unwinds), the slot is free, and the
    /// ended ticket can neither wait for the consumed completion nor, dropped, touch the
    /// request that reuses its slot.
    #[inline(always)]
    pub(super) fn take_lent(&mut self) -> T {
        let lent = self.lent.take().expect("present until completion");
        self.qp.forget_waiter(self.index);
        lent
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
    /// Inline, so that dropping a handle that has returned its outcome (a future, once
    /// ready) costs one test.
    #[inline]
    fn drop(&mut self) {
        if self.lent.is_some() {
            self.abandon();
        }
    }
}

impl<T: Send + 'static> Ticket<'_, T> {
    /// Leaves what was lent in the slot (see [`Ticket`]'s `Drop`).
    #[inline(never)]
    fn abandon(&mut self) {
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
