//! The scoped, borrow-based layer: posts borrow their regions instead of owning them, and
//! every request posted in a scope has completed before [`scope`] returns, also when the
//! closure panics or returns early. The borrow checker keeps the CPU off a region for the
//! scope's duration (shared borrows for what the NIC reads, exclusive ones for what it writes),
//! like `std::thread::scope` does for threads.
//!
//! One scope may post on several queue pairs, so one region can be sent to many peers at once
//! (a multicast), which the owned layer cannot express. The scope records each post: the
//! first few in itself, the rest in a vector, so a scope of more than a few posts allocates
//! (the owned layer never does).

mod drain;
mod entries;

use crate::deadline::deadline_after;
use crate::error::{Error, Op, Result};
use crate::mr::Backing;
use crate::part::{Part, PartMut};
use crate::qp::QueuePair;
use crate::reactor::WaitStep;
use crate::remote::RemoteRegion;
use crate::wr::{WorkCompletion, WorkKind};
use drain::Drain;
use entries::Entries;
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;
use std::time::{Duration, Instant};

/// How long [`scope`] waits, once its closure has returned, for the requests still in flight
/// before it moves their queue pairs to the error state (so that they complete, flushed).
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(60);

/// How long a scope waits for the flush completions once it has moved a queue pair to the
/// error state; past it the process aborts (returning would be unsound).
const FLUSH_LIMIT: Duration = Duration::from_secs(30);

/// Runs `f` with a [`Scope`]; returns once everything posted in it has completed. A receive
/// posted in the scope waits for its message: post only what the peer will answer.
///
/// The wait at the end is bounded: requests still in flight [`DEFAULT_DRAIN_DEADLINE`] after
/// `f` returns (a receive whose message never comes, a peer that died) are flushed by moving
/// their queue pairs to the error state, which ends those connections (rdma_cm ones are
/// disconnected); [`scope_with_deadline`] chooses the deadline. If `f` panics, the queue pairs
/// used are moved to the error state at once, so that every request finishes (flushed) and the
/// panic goes on.
///
/// If a completion queue cannot be polled while requests of the scope are in flight, or the
/// flushed requests do not complete within 30 s of the flush, the process aborts: returning
/// would let the NIC touch memory whose borrow has ended.
pub fn scope<'env, T>(f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T) -> T {
    scope_with_deadline(DEFAULT_DRAIN_DEADLINE, f)
}

/// As [`scope`], flushing what is still in flight `drain_deadline` after `f` returns
/// (`Duration::MAX`: never, which waits for as long as the requests take).
pub fn scope_with_deadline<'env, T>(
    drain_deadline: Duration,
    f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T,
) -> T {
    let s = Scope {
        posted: RefCell::new(Entries::new()),
        drain_deadline,
        flush_at_end: Cell::new(false),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let mut guard = Drain {
        scope: &s,
        returned: false,
    };
    let out = f(&s);
    guard.returned = true;
    drop(guard);
    out
}

struct Entry<'scope> {
    qp: &'scope QueuePair,
    index: u32,
    gen: u32,
    kind: WorkKind,
    taken: Cell<Option<crate::slots::RawCompletion>>,
    done: Cell<bool>,
}

/// Posts whose regions are borrowed for `'scope`.
pub struct Scope<'scope, 'env: 'scope> {
    posted: RefCell<Entries<Entry<'scope>>>,
    drain_deadline: Duration,
    /// Flush the queue pairs used before draining (a multi-part post failed half-way).
    flush_at_end: Cell<bool>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("posted", &self.posted.borrow().len())
            .finish()
    }
}

/// A request posted in a scope; [`ScopedPending::spin`] returns its completion.
#[derive(Debug)]
pub struct ScopedPending<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    entry: usize,
}

/// A borrowed part as the scope posts it: shared for what the NIC reads, exclusive for what
/// it writes.
enum Borrowed<'scope, B: Backing> {
    Shared(Part<'scope, B>),
    Exclusive(PartMut<'scope, B>),
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Sends `part` (a [`Part`], or `&region` for all of it).
    ///
    /// # Errors
    /// As [`QueuePair::post_send`].
    pub fn send<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        part: impl Into<Part<'scope, B>>,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let part = Borrowed::Shared(part.into());
        self.post(qp, WorkKind::Send, part, None, imm)
    }

    /// Receives into `part` (a [`PartMut`], or `&mut region`: exclusively borrowed, since
    /// the NIC writes it).
    ///
    /// # Errors
    /// As [`QueuePair::post_recv`].
    pub fn recv<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        part: impl Into<PartMut<'scope, B>>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let part = Borrowed::Exclusive(part.into());
        self.post(qp, WorkKind::Recv, part, None, None)
    }

    /// RDMA-writes `part` to the start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_write`].
    pub fn write<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        part: impl Into<Part<'scope, B>>,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let part = Borrowed::Shared(part.into());
        self.post(qp, WorkKind::Write, part, Some(remote), imm)
    }

    /// RDMA-reads the start of `remote` into `part` (exclusively borrowed).
    ///
    /// # Errors
    /// As [`QueuePair::post_read`].
    pub fn read<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        part: impl Into<PartMut<'scope, B>>,
        remote: RemoteRegion,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let part = Borrowed::Exclusive(part.into());
        self.post(qp, WorkKind::Read, part, Some(remote), None)
    }

    #[inline]
    #[allow(unsafe_code)] // borrowed posts, drained before the scope returns; see the SAFETY comments
    fn post<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        kind: WorkKind,
        part: Borrowed<'scope, B>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let nic_writes = kind.writes_local();
        let part = match part {
            Borrowed::Exclusive(p) => p.into_shared(),
            Borrowed::Shared(p) if !nic_writes => p,
            Borrowed::Shared(_) => {
                return Err(Error::invalid(
                    Op::PostRecv,
                    format!("{kind} into a shared borrow (the NIC writes it: needs PartMut)"),
                ))
            }
        };
        // SAFETY: the part's region is borrowed for 'scope, and the scope drains every
        // request before 'scope ends (`Drain`, also on panic), so the region outlives the
        // request; for what the NIC writes the borrow is exclusive (checked just above), so
        // the CPU cannot touch the region meanwhile.
        let slot = unsafe { qp.post_borrowed(kind, part.region(), part.range(), remote, imm)? };
        Ok(self.record(qp, kind, slot))
    }

    /// Sends the parts, gathered in order into one message (up to the queue pair's
    /// [`max_sge`](crate::QueuePairBuilder::max_sge); parts of one region may repeat or
    /// overlap, since the NIC only reads them).
    ///
    /// # Errors
    /// As [`QueuePair::post_send_parts`].
    pub fn send_parts<B: Backing, const N: usize>(
        &'scope self,
        qp: &'scope QueuePair,
        parts: [Part<'scope, B>; N],
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post_parts(qp, WorkKind::Send, parts, None, imm)
    }

    /// Receives, scattered in order into the parts (exclusively borrowed).
    ///
    /// # Errors
    /// As [`QueuePair::post_recv_parts`].
    pub fn recv_parts<B: Backing, const N: usize>(
        &'scope self,
        qp: &'scope QueuePair,
        parts: [PartMut<'scope, B>; N],
    ) -> Result<ScopedPending<'scope, 'env>> {
        let parts = parts.map(PartMut::into_shared);
        self.post_parts(qp, WorkKind::Recv, parts, None, None)
    }

    /// RDMA-writes the parts, gathered in order, to the start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_write_parts`].
    pub fn write_parts<B: Backing, const N: usize>(
        &'scope self,
        qp: &'scope QueuePair,
        parts: [Part<'scope, B>; N],
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post_parts(qp, WorkKind::Write, parts, Some(remote), imm)
    }

    /// RDMA-reads the start of `remote`, scattered in order into the parts (exclusively
    /// borrowed).
    ///
    /// # Errors
    /// As [`QueuePair::post_read_parts`].
    pub fn read_parts<B: Backing, const N: usize>(
        &'scope self,
        qp: &'scope QueuePair,
        parts: [PartMut<'scope, B>; N],
        remote: RemoteRegion,
    ) -> Result<ScopedPending<'scope, 'env>> {
        let parts = parts.map(PartMut::into_shared);
        self.post_parts(qp, WorkKind::Read, parts, Some(remote), None)
    }

    /// Posts a request of several borrowed parts; for what the NIC writes, the callers
    /// passed exclusive borrows (made shared only for the checks and the SGEs).
    #[allow(unsafe_code)] // borrowed posts, drained before the scope returns; see the SAFETY comments
    fn post_parts<B: Backing, const N: usize>(
        &'scope self,
        qp: &'scope QueuePair,
        kind: WorkKind,
        parts: [Part<'scope, B>; N],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        // SAFETY: every part's region is borrowed for 'scope, and the scope drains every
        // request before 'scope ends (`Drain`, also on panic), so the regions outlive the
        // request; for what the NIC writes, `recv_parts` and `read_parts` took exclusive
        // borrows, so the CPU cannot touch those regions meanwhile.
        let slot = unsafe { qp.post_borrowed_parts(kind, &parts, remote, imm)? };
        Ok(self.record(qp, kind, slot))
    }

    /// Records a posted request, so that the scope waits for it.
    #[inline]
    fn record(
        &'scope self,
        qp: &'scope QueuePair,
        kind: WorkKind,
        (index, gen): (u32, u32),
    ) -> ScopedPending<'scope, 'env> {
        let entry = self.posted.borrow_mut().push(Entry {
            qp,
            index,
            gen,
            kind,
            taken: Cell::new(None),
            done: Cell::new(false),
        });
        ScopedPending { scope: self, entry }
    }

    /// Moves the queue pairs of the requests still in flight to the error state when the
    /// scope ends, before draining: for a multi-part post that failed half-way, whose posted
    /// parts nobody may answer.
    pub(crate) fn flush_at_end(&self) {
        self.flush_at_end.set(true);
    }

    /// Records every unfinished request whose completion has arrived: a look at its slot,
    /// and if it is not there one poll of its queue pair and another look. A queue pair that
    /// cannot be polled is left to the flush that follows.
    #[cold]
    #[inline(never)]
    fn record_completed(&self) {
        let n = self.posted.borrow().len();
        for i in 0..n {
            let qp = {
                let posted = self.posted.borrow();
                if posted[i].done.get() {
                    continue;
                }
                posted[i].qp
            };
            if self.take_if_done(i).is_none() && qp.poll().is_ok() {
                self.take_if_done(i);
            }
        }
    }

    /// Moves the queue pair of every unfinished request to the error state.
    fn flush_unfinished(&self) {
        let posted = self.posted.borrow();
        for (i, e) in posted.iter().enumerate() {
            // Each queue pair with a request still in flight, once (whatever became of the
            // requests posted on it before that one).
            let unfinished = |o: &Entry<'_>| !o.done.get() && std::ptr::eq(o.qp, e.qp);
            if unfinished(e) && !posted.iter().take(i).any(unfinished) {
                e.qp.flush();
            }
        }
    }

    /// Whether entry `i` has completed, recording its completion if it just arrived (one
    /// look at its slot, no poll of the CQ).
    fn take_if_done(&self, i: usize) -> Option<()> {
        let posted = self.posted.borrow();
        let e = &posted[i];
        if !e.done.get() {
            let c = e.qp.take_completion(e.index, e.gen)?;
            e.taken.set(Some(c));
            e.done.set(true);
            // Last: the waker's `Drop` is code we do not control (docs/safety.md).
            e.qp.forget_waiter(e.index);
        }
        Some(())
    }

    /// The result of entry `i` if one poll of its queue (or its slot) has its completion:
    /// the common case of a spin, built at once from the completion, which is then not
    /// kept in the entry (the caller's handle ends). `None` if it is not there yet, or was
    /// recorded already (an await that found it, then the task's waker panicked as the slot
    /// let go of it): the general path says.
    #[inline]
    fn complete_now(&self, i: usize) -> Option<Result<WorkCompletion>> {
        let (qp, index, gen, kind) = self.unfinished(i)?;
        let c = qp.poll_for(index, gen)?;
        self.posted.borrow()[i].done.set(true);
        // Last: the waker's `Drop` is code we do not control (docs/safety.md).
        qp.forget_waiter(index);
        Some(qp.completion_result(index, gen, kind, c))
    }

    /// Whether entry `i` has completed: its completion recorded already, or one poll of its
    /// queue (which looks at its slot too) finds it and records it. Every wait of an awaited
    /// request polls through this, so that one whose reactor cannot park it (no completion
    /// channel, `WaitStep::Spin`) still sees its completion: a look at the slot alone would
    /// spin forever with the completion in the queue.
    fn poll_done(&self, i: usize) -> Option<()> {
        let Some((qp, index, gen, _)) = self.unfinished(i) else {
            return Some(());
        };
        let c = qp.poll_for(index, gen)?;
        self.finished(i, c);
        Some(())
    }

    /// Entry `i`'s queue pair, slot, generation and kind while its completion has not been
    /// taken; `None` once it has.
    #[inline]
    fn unfinished(&self, i: usize) -> Option<(&'scope QueuePair, u32, u32, WorkKind)> {
        let posted = self.posted.borrow();
        let e = &posted[i];
        (!e.done.get()).then_some((e.qp, e.index, e.gen, e.kind))
    }

    /// Records `c`, the completion of entry `i`, whose slot is free.
    #[inline]
    fn finished(&self, i: usize, c: crate::slots::RawCompletion) {
        let (qp, index) = {
            let posted = self.posted.borrow();
            let e = &posted[i];
            e.taken.set(Some(c));
            e.done.set(true);
            (e.qp, e.index)
        };
        // Last: the waker's `Drop` is code we do not control (docs/safety.md).
        qp.forget_waiter(index);
    }

    /// Polls until entry `i` has completed (then records its completion and returns `true`)
    /// or `deadline` passes (`false`; `None`: no deadline).
    fn complete(&self, i: usize, deadline: Option<Instant>) -> Result<bool> {
        // The owned handle's fast path first: one poll of the queue that finds this
        // request's completion (or its slot that has it) frees the slot at once. A poll that
        // fails leaves it to the loop below, which says so.
        if self.poll_done(i).is_some() {
            return Ok(true);
        }
        let Some((qp, index, gen, _)) = self.unfinished(i) else {
            return Ok(true);
        };
        let mut spinner = crate::spin::Spinner::new(qp.spin_policy());
        loop {
            if let Some(c) = qp.take_completion(index, gen) {
                self.finished(i, c);
                return Ok(true);
            }
            qp.poll()?;
            if spinner.after_poll() && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }
}

impl<'scope, 'env> ScopedPending<'scope, 'env> {
    /// Waits for the request's completion, for as long as it takes (a send, write or read
    /// ends within its queue pair's retry budget; a receive waits for its message: see
    /// [`ScopedPending::spin_timeout`]).
    ///
    /// # Errors
    /// [`Error::Completion`] when it completed with an error status;
    /// [`Error::Verbs`] when the
    /// queue cannot be polled.
    pub fn spin(self) -> Result<WorkCompletion> {
        if let Some(done) = self.scope.complete_now(self.entry) {
            // Done: the handle's `Drop` would only see that.
            std::mem::forget(self);
            return done;
        }
        self.scope.complete(self.entry, None)?;
        self.result()
    }

    /// As [`ScopedPending::spin`], for at most `timeout` (`Duration::MAX`: as long as it
    /// takes). On time-out the handle comes back; the request stays in flight and the scope
    /// drains it at its end (flushing it after the scope's drain deadline).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`; `Ok(Err(_))` as for
    /// [`ScopedPending::spin`].
    pub fn spin_timeout(
        self,
        timeout: Duration,
    ) -> std::result::Result<Result<WorkCompletion>, Self> {
        match self.scope.complete(self.entry, deadline_after(timeout)) {
            Ok(true) => Ok(self.result()),
            Ok(false) => Err(self),
            Err(e) => Ok(Err(e)),
        }
    }

    /// One poll of the request for a reactor's future (see [`crate::reactor`]), as
    /// [`Pending::poll_with`](crate::Pending::poll_with): its completion if it has arrived,
    /// else the task's waker recorded in its slot, the CQ armed and `wait` asked to wait for
    /// the queue pair's fds. The scope still waits for the request at its end, whatever
    /// became of the future. Polled again after it returned the completion, it returns an
    /// [`Error::InvalidArgument`] saying so.
    pub fn poll_with(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wait: impl Fn(&'scope QueuePair, &mut std::task::Context<'_>) -> WaitStep,
    ) -> std::task::Poll<Result<WorkCompletion>> {
        let (qp, index) = {
            let posted = self.scope.posted.borrow();
            let e = &posted[self.entry];
            (e.qp, e.index)
        };
        let (scope, i) = (self.scope, self.entry);
        crate::qp::wake::poll_request(qp, index, cx, || scope.poll_done(i), wait)
            .map(|()| self.take_result())
    }

    fn result(self) -> Result<WorkCompletion> {
        self.take_result()
    }

    fn take_result(&self) -> Result<WorkCompletion> {
        let posted = self.scope.posted.borrow();
        let e = &posted[self.entry];
        let Some(c) = e.taken.take() else {
            return Err(Error::invalid(
                Op::PollCq,
                "the completion of this scoped request was already taken",
            ));
        };
        e.qp.completion_result(e.index, e.gen, e.kind, c)
    }
}

impl Drop for ScopedPending<'_, '_> {
    fn drop(&mut self) {
        // The scope keeps the request (and waits for it at its end); the slot only lets go
        // of this handle's task's waker.
        let posted = self.scope.posted.borrow();
        let e = &posted[self.entry];
        if !e.done.get() {
            e.qp.forget_waiter(e.index);
        }
    }
}

/// Awaiting a [`ScopedPending`] (the `tokio` feature) resolves to its completion, as its
/// `spin` does; for a runtime driven inside the scope's closure (`block_on` in it: the scope
/// is synchronous, and still waits for every request at its end). A future dropped early
/// leaves the request to that wait.
#[cfg(feature = "tokio")]
impl std::future::Future for ScopedPending<'_, '_> {
    type Output = Result<WorkCompletion>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.poll_with(cx, crate::qp::wake::with_tokio::step)
    }
}
