//! A queue pair's steps for reactors (see [`crate::reactor`]): its completion channel and
//! rdma_cm event channel as borrowed fds, arming, taking events, the tasks awaiting its
//! requests ([`Waiters`]: the reactor is given the queue's fan-out waker, never one task's),
//! and the poll loop every awaited handle runs (also a shared receive queue's, through
//! [`Waitable`]).

use super::ticket::Ticket;
use super::QueuePair;
use crate::cm_id::ConnectionEnd;
use crate::cq::CompletionQueue;
use crate::error::Result;
use crate::reactor::WaitStep as Step;
use crate::waiters::Waiters;
use crate::wr::WorkCompletion;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering::Relaxed;
use std::task::{Context, Poll, Waker};

/// What awaited requests wait on: a queue pair, or a shared receive queue. One thread uses
/// it at a time (it is `!Sync`), so nothing here locks.
pub(crate) trait Waitable {
    /// The completion queue the requests complete on.
    fn cq(&self) -> &CompletionQueue;
    /// The tasks awaiting its requests, and the reactor registrations.
    fn wait_state(&self) -> &WaitState;
    /// Polls the CQ, recording completions and waking their tasks.
    fn poll_cq(&self) -> Result<usize>;
    /// The rdma_cm event channel's fd, for a connection.
    #[cfg(feature = "tokio")]
    fn cm_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Takes the rdma_cm events queued (a connection's end flushes it).
    #[cfg(feature = "tokio")]
    fn take_cm(&self) {}
}

impl Waitable for QueuePair {
    fn cq(&self) -> &CompletionQueue {
        self.raw.cq()
    }
    fn wait_state(&self) -> &WaitState {
        &self.wait
    }
    fn poll_cq(&self) -> Result<usize> {
        self.poll()
    }
    #[cfg(feature = "tokio")]
    fn cm_fd(&self) -> Option<BorrowedFd<'_>> {
        self.cm_event_fd()
    }
    #[cfg(feature = "tokio")]
    fn take_cm(&self) {
        let _ = self.take_cm_events();
    }
}

/// How long an awaited request busy-polls its completion queue, by default, before it arms
/// the completion channel and parks its task ([`QueuePair::set_busy_poll`]): about what
/// arming, sleeping in `epoll` and being woken cost, so that a completion that is that close
/// is taken without them (the value Linux suggests for its own socket busy polling).
pub const DEFAULT_BUSY_POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// The longest busy-poll budget [`QueuePair::set_busy_poll`] takes: 1 ms. The budget is spent
/// inside one poll of a future, so a longer one would starve the runtime's other tasks and
/// the timers around the await (a 20 s budget kept a 1 s timeout from firing for 20 s).
pub const MAX_BUSY_POLL: std::time::Duration = std::time::Duration::from_millis(1);

/// Busy-polls `finish` for at most `q`'s busy-poll budget: the outcome if it came meanwhile.
fn spin<Q: Waitable + ?Sized, R>(q: &Q, finish: &mut impl FnMut() -> Option<R>) -> Option<R> {
    if let Some(done) = finish() {
        return Some(done);
    }
    let nanos = q.wait_state().busy_poll.load(Relaxed);
    if nanos == 0 {
        return None;
    }
    let start = std::time::Instant::now();
    let dedicated = q.wait_state().spin_policy() == crate::SpinPolicy::Dedicated;
    let mut polls = 0u32;
    loop {
        // No yield inside the budget (it is a bound on how long this poll of the future may
        // keep its thread, and short): only the hint, unless the policy says nothing.
        if !dedicated {
            std::hint::spin_loop();
        }
        if let Some(done) = finish() {
            return Some(done);
        }
        polls = polls.wrapping_add(1);
        // The clock is read every 8 polls: a poll of an empty CQ costs less than a read.
        if polls.is_multiple_of(8) && start.elapsed().as_nanos() >= u128::from(nanos) {
            return None;
        }
    }
}

/// `ibv_req_notify_cq` on `q`'s CQ, then one more poll (what completed before arming raises
/// no event); how many completions that poll recorded.
pub(crate) fn arm<Q: Waitable + ?Sized>(q: &Q) -> Result<usize> {
    q.cq().arm()?;
    q.poll_cq()
}

/// How a queue is being waited on: the tasks awaiting its requests, and (with the `tokio`
/// feature) its fds' registrations with the reactor, which end before the fds close (the
/// queue's first field).
pub(crate) struct WaitState {
    /// The tasks awaiting requests, one per slot, and the fan-out waker over them.
    pub(crate) waiters: Waiters,
    /// How long an awaited request busy-polls before it arms the completion channel.
    /// In nanoseconds (atomic so that the queue's `Sync`-ness is the other fields' alone).
    pub(crate) busy_poll: std::sync::atomic::AtomicU64,
    /// What busy waits do between polls ([`SpinPolicy`](crate::SpinPolicy), as its bits).
    pub(crate) spin: std::sync::atomic::AtomicU8,
    /// The fds as registered with tokio's reactor (of the runtime the last await ran on).
    #[cfg(feature = "tokio")]
    pub(crate) tokio: with_tokio::Registration,
}

impl WaitState {
    /// The busy waits' policy.
    #[inline]
    pub(crate) fn spin_policy(&self) -> crate::SpinPolicy {
        crate::SpinPolicy::from_bits(self.spin.load(Relaxed))
    }

    /// Sets the busy waits' policy, from their next wait on.
    pub(crate) fn set_spin_policy(&self, policy: crate::SpinPolicy) {
        self.spin.store(policy.to_bits(), Relaxed);
    }

    /// Nobody waiting yet on a queue of `slots` request slots.
    pub(crate) fn new(slots: usize) -> WaitState {
        WaitState {
            waiters: Waiters::new(slots),
            busy_poll: std::sync::atomic::AtomicU64::new(DEFAULT_BUSY_POLL.as_nanos() as u64),
            spin: std::sync::atomic::AtomicU8::new(0),
            #[cfg(feature = "tokio")]
            tokio: with_tokio::Registration::default(),
        }
    }
}

impl QueuePair {
    /// The completion channel's fd, if the queue pair was built with one
    /// ([`QueuePairBuilder::completion_channel`](crate::QueuePairBuilder::completion_channel)):
    /// non-blocking, readable once an armed CQ ([`QueuePair::arm_completions`]) got a
    /// completion. Borrowed from the queue pair, which closes it when destroyed: a reactor
    /// registration of it must end first.
    pub fn completion_fd(&self) -> Option<BorrowedFd<'_>> {
        self.raw.cq().channel_fd()
    }

    /// How long an awaited request of this queue pair busy-polls the completion queue before
    /// it arms the completion channel and parks its task (default [`DEFAULT_BUSY_POLL`]; zero
    /// parks at once). A completion that comes within it is taken without the arm, the
    /// sleep in `epoll` and the wake; the task's thread is busy meanwhile, as in
    /// [`Pending::spin`](crate::Pending::spin). Applies from the next poll of an awaited
    /// request. At most [`MAX_BUSY_POLL`]: a longer budget is cut to it, since the budget is
    /// spent inside one poll of a future, while nothing else on its runtime's thread runs
    /// (not even the task that would complete the request, nor a timeout around the await).
    pub fn set_busy_poll(&self, budget: std::time::Duration) {
        let nanos = u64::try_from(budget.min(MAX_BUSY_POLL).as_nanos()).unwrap_or(u64::MAX);
        self.wait.busy_poll.store(nanos, Relaxed);
    }

    /// The busy-poll budget of awaited requests ([`QueuePair::set_busy_poll`]).
    pub fn busy_poll(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.wait.busy_poll.load(Relaxed))
    }

    /// What this queue pair's busy waits do between polls of its completion queue (default
    /// [`SpinPolicy::Shared`](crate::SpinPolicy::Shared): a spin-loop hint, and a yield every
    /// 64th poll); [`SpinPolicy::Dedicated`](crate::SpinPolicy::Dedicated) polls with nothing
    /// between, for a thread with a core of its own. Applies to [`Pending::spin`] and the
    /// other handles' `spin` and `spin_timeout`, a scope's waits, and the busy-poll budget of
    /// awaited requests ([`QueuePair::set_busy_poll`]), from their next wait on. A wait's
    /// deadline is looked at as often either way.
    ///
    /// [`Pending::spin`]: crate::Pending::spin
    pub fn set_spin_policy(&self, policy: crate::SpinPolicy) {
        self.wait.set_spin_policy(policy);
    }

    /// What this queue pair's busy waits do between polls ([`QueuePair::set_spin_policy`]).
    pub fn spin_policy(&self) -> crate::SpinPolicy {
        self.wait.spin_policy()
    }

    /// `ibv_req_notify_cq`, then one more poll of the CQ (what completed before arming
    /// raises no event). Returns how many completions that poll recorded: if any, wake their
    /// waiters or look again rather than wait for the fd.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) without a completion
    /// channel; [`Error::Verbs`](crate::Error::Verbs) if arming or polling fails.
    pub fn arm_completions(&self) -> Result<usize> {
        arm(self)
    }

    /// Takes every event queued on the completion channel without blocking
    /// (`ibv_get_cq_event` until `EAGAIN`) and acknowledges them (`ibv_ack_cq_events`, in
    /// batches: the queue pair acknowledges the rest before it destroys the CQ). Returns how
    /// many; the notification must be armed again before the next wait. Poll the queue pair
    /// ([`QueuePair::poll`]) to record the completions.
    ///
    /// # Errors
    /// [`Error::Verbs`](crate::Error::Verbs) for a read error other than `EAGAIN`.
    pub fn take_completion_events(&self) -> Result<u32> {
        self.raw.cq().take_events()
    }

    /// For an rdma_cm connection, its event channel's fd: non-blocking, readable when an
    /// event is queued (the peer disconnected, or the device is being removed). Borrowed
    /// from the queue pair, which closes it when destroyed.
    pub fn cm_event_fd(&self) -> Option<BorrowedFd<'_>> {
        self.raw.cm().map(|id| id.channel().fd())
    }

    /// For an rdma_cm connection, takes its queued events without blocking. If one says the
    /// connection ended (`DISCONNECTED`, `DEVICE_REMOVAL`), the queue pair is flushed, so
    /// every request on it completes (with an error) and its region comes back; returns how
    /// it ended (also on later calls). `None` for a connection still up, or a queue pair
    /// connected by endpoint exchange.
    ///
    /// # Errors
    /// [`Error::Verbs`](crate::Error::Verbs) for a read error other than `EAGAIN`.
    pub fn take_cm_events(&self) -> Result<Option<ConnectionEnd>> {
        let Some(id) = self.raw.cm() else {
            return Ok(None);
        };
        let end = id.take_events()?;
        if end.is_some() {
            self.connection_ended();
        }
        Ok(end)
    }

    /// Nobody awaits the request in slot `index` any more (it completed, or its handle was
    /// dropped): the slot lets go of its task's waker.
    #[inline]
    pub(crate) fn forget_waiter(&self, index: u32) {
        self.wait.waiters.forget(index);
    }
}

/// Records `waker` as the task awaiting the request in slot `index` of `q`.
pub(crate) fn register_waker<Q: Waitable + ?Sized>(q: &Q, index: u32, waker: &Waker) {
    q.wait_state().waiters.register(index, waker);
}

/// One poll of an awaited owned request: what it lent and how it ended, else the task
/// parked (see [`poll_request`]).
pub(super) fn poll_ticket<'q, T: Send + 'static>(
    t: &mut Ticket<'q, T>,
    cx: &mut Context<'_>,
    wait: impl Fn(&'q QueuePair, &mut Context<'_>) -> Step,
) -> Poll<(T, Result<WorkCompletion>)> {
    let (qp, index) = (t.qp, t.index);
    poll_request(qp, index, cx, || t.try_finish(), wait)
}

/// One poll of the awaited request in slot `index` of `q`: `finish()` if it has completed (or
/// a poll of the CQ finds it; `finish` lets go of the slot's waker), else the task's waker
/// stored in the slot, the CQ armed and `wait` asked to wait for `q`'s fds with the queue's
/// fan-out waker (which wakes every task awaiting a request of `q`, so that no task depends
/// on another to be polled). Allocates nothing and takes no lock.
pub(crate) fn poll_request<'q, Q: Waitable, R>(
    q: &'q Q,
    index: u32,
    cx: &mut Context<'_>,
    mut finish: impl FnMut() -> Option<R>,
    wait: impl Fn(&'q Q, &mut Context<'_>) -> Step,
) -> Poll<R> {
    let waiters = &q.wait_state().waiters;
    if let Some(done) = spin(q, &mut finish) {
        return Poll::Ready(done);
    }
    // Bounded, so that a busy queue cannot keep one task from yielding. `spin` has just
    // polled: the first round goes straight to registering.
    for round in 0..32 {
        if round > 0 {
            if let Some(done) = finish() {
                return Poll::Ready(done);
            }
        }
        waiters.register(index, cx.waker());
        if !q.cq().is_armed() {
            match arm(q) {
                Ok(0) => {}
                Ok(_) => continue,
                Err(_) => break,
            }
        }
        match wait(q, &mut Context::from_waker(waiters.fan_out())) {
            Step::Again => continue,
            Step::Parked => return Poll::Pending,
            Step::Spin => break,
        }
    }
    cx.waker().wake_by_ref();
    Poll::Pending
}

#[cfg(feature = "tokio")]
pub(crate) mod with_tokio {
    use super::{Step, Waitable};
    use crate::sys::fd::register_duplicate;
    use std::cell::{Ref, RefCell};
    use std::os::fd::{BorrowedFd, OwnedFd};
    use std::task::{Context, Poll};
    use tokio::io::unix::AsyncFd;
    use tokio::runtime::{Handle, Id};

    /// One fd's registration with a runtime's reactor, and which runtime.
    type OnRuntime = RefCell<Option<(Id, AsyncFd<OwnedFd>)>>;

    /// A queue's fds as registered with the reactor of the runtime that awaits it (each a
    /// duplicate the registration owns and closes): made at the first await, made again when
    /// an await runs on another runtime (the queue is `Send`: a program may await it on one
    /// runtime, then another).
    #[derive(Default)]
    pub(crate) struct Registration {
        cq: OnRuntime,
        cm: OnRuntime,
    }

    /// The registration in `cell` of `fd`, one of the queue's fds, with the current
    /// runtime's reactor: the one made before if it is that runtime's, else a new one (the
    /// old one is dropped first; epoll reports an fd that is readable when it is added, so
    /// no readiness is lost in the move). None outside a runtime, or if the duplicate cannot
    /// be made or the reactor refuses it.
    fn registered<'a>(
        cell: &'a OnRuntime,
        fd: BorrowedFd<'_>,
    ) -> Option<Ref<'a, AsyncFd<OwnedFd>>> {
        let id = Handle::try_current().ok()?.id();
        let current = matches!(&*cell.borrow(), Some((on, _)) if *on == id);
        if !current {
            drop(cell.borrow_mut().take());
            let fresh = register_duplicate(fd).ok()?;
            *cell.borrow_mut() = Some((id, fresh));
        }
        Ref::filter_map(cell.borrow(), |r| r.as_ref().map(|(_, fd)| fd)).ok()
    }

    /// The reactor step of an awaited request (see `poll_request`): the completion
    /// channel, and for an rdma_cm connection its event channel, polled for readiness with
    /// the waker it is given (the queue's fan-out waker); a ready fd's events are taken (a
    /// connection's end flushes the queue
    /// pair).
    pub(crate) fn step<Q: Waitable + ?Sized>(q: &Q, cx: &mut Context<'_>) -> Step {
        let reg = &q.wait_state().tokio;
        let Some(cq) = q.cq().channel_fd().and_then(|fd| registered(&reg.cq, fd)) else {
            return Step::Spin;
        };
        match cq.poll_read_ready(cx) {
            Poll::Ready(Ok(mut ready)) => {
                // Drained to EAGAIN, so the readiness is cleared (tokio keeps it if a new
                // edge came meanwhile).
                let _ = q.cq().take_events();
                ready.clear_ready();
                let _ = q.poll_cq();
                return Step::Again;
            }
            Poll::Ready(Err(_)) => return Step::Spin,
            Poll::Pending => {}
        }
        if let Some(cm) = q.cm_fd().and_then(|fd| registered(&reg.cm, fd)) {
            match cm.poll_read_ready(cx) {
                Poll::Ready(Ok(mut ready)) => {
                    q.take_cm();
                    ready.clear_ready();
                    return Step::Again;
                }
                Poll::Ready(Err(_)) => return Step::Spin,
                Poll::Pending => {}
            }
        }
        Step::Parked
    }
}
