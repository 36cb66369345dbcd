//! A shared receive queue's steps for reactors (see [`crate::reactor`]), as a queue pair's:
//! its completion channel's fd, arming, taking events, wakers in its receive slots, and the
//! awaited receive.

use super::srq::{SharedReceiveQueue, SrqPending};
use super::wake::{arm, poll_request, register_waker, WaitState, Waitable};
use super::Outcome;
use crate::cq::CompletionQueue;
use crate::error::Result;
use crate::mr::Backing;
use crate::reactor::WaitStep;
use std::os::fd::BorrowedFd;
use std::task::{Context, Poll, Waker};

impl Waitable for SharedReceiveQueue {
    fn cq(&self) -> &CompletionQueue {
        SharedReceiveQueue::cq(self)
    }
    fn wait_state(&self) -> &WaitState {
        &self.wait
    }
    fn poll_cq(&self) -> Result<usize> {
        self.poll()
    }
}

impl SharedReceiveQueue {
    /// The completion channel's fd of the shared queue's CQ: non-blocking, readable once an
    /// armed CQ ([`SharedReceiveQueue::arm_completions`]) got a completion. Borrowed from
    /// the queue: a reactor registration of it must end before the queue is dropped.
    pub fn completion_fd(&self) -> BorrowedFd<'_> {
        SharedReceiveQueue::cq(self)
            .channel_fd()
            .expect("a shared receive queue's CQ always has a completion channel")
    }

    /// As [`QueuePair::arm_completions`](crate::QueuePair::arm_completions): arms the
    /// notification, then polls once more; how many completions that poll recorded.
    ///
    /// # Errors
    /// [`Error::Verbs`](crate::Error::Verbs) if arming or polling fails.
    pub fn arm_completions(&self) -> Result<usize> {
        arm(self)
    }

    /// As [`QueuePair::take_completion_events`](crate::QueuePair::take_completion_events).
    ///
    /// # Errors
    /// [`Error::Verbs`](crate::Error::Verbs) for a read error other than `EAGAIN`.
    pub fn take_completion_events(&self) -> Result<u32> {
        SharedReceiveQueue::cq(self).take_events()
    }

    /// As [`QueuePair::set_spin_policy`](crate::QueuePair::set_spin_policy), for the shared
    /// queue's busy waits ([`SrqPending::spin_timeout`], and the busy-poll of an awaited
    /// receive).
    pub fn set_spin_policy(&self, policy: crate::SpinPolicy) {
        self.wait.set_spin_policy(policy);
    }

    /// What the shared queue's busy waits do between polls
    /// ([`SharedReceiveQueue::set_spin_policy`]).
    pub fn spin_policy(&self) -> crate::SpinPolicy {
        self.wait.spin_policy()
    }
}

impl<'s, B: Backing> SrqPending<'s, B> {
    /// Records `waker` in the receive's slot: whoever polls the shared queue and records
    /// the completion wakes it (see [`Pending::register_waker`](crate::Pending::register_waker)).
    pub fn register_waker(&self, waker: &Waker) {
        register_waker(self.srq, self.index, waker);
    }

    /// One poll of the receive for a reactor's future, as
    /// [`Pending::poll_with`](crate::Pending::poll_with), waiting on the shared queue's
    /// completion channel.
    ///
    /// # Panics
    /// If polled again after it returned the outcome.
    pub fn poll_with(
        &mut self,
        cx: &mut Context<'_>,
        wait: impl Fn(&'s SharedReceiveQueue, &mut Context<'_>) -> WaitStep,
    ) -> Poll<Outcome<B>> {
        let (srq, index) = (self.srq, self.index);
        poll_request(srq, index, cx, || self.finish(), wait)
    }
}

// Nothing in the handle is pinned (no pin projection is ever made).
impl<B: Backing> Unpin for SrqPending<'_, B> {}

/// Awaiting an [`SrqPending`] (the `tokio` feature) resolves to the same
/// [`Outcome`] as its `spin_timeout`: the region back, the completion naming the queue pair
/// the message came through. Dropping the future early leaves the region with the shared
/// queue until a message fills it (or the queue and its last queue pair are gone). A shared
/// receive belongs to no connection until a message begins to fill it, so no peer's death or
/// disconnection ends it: bound the wait (`tokio::time::timeout`).
#[cfg(feature = "tokio")]
impl<B: Backing> std::future::Future for SrqPending<'_, B> {
    type Output = Outcome<B>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_with(cx, super::wake::with_tokio::step)
    }
}
