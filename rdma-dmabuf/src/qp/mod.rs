//! Reliable-connected queue pairs: typestate bring-up ([`QueuePairBuilder`] ->
//! [`PreparedQp`] -> [`QueuePair`]) and posts that take ownership of their buffers.
//!
//! A post moves a [`Local`](crate::Local) (a region, or a part of one) into the queue and returns a
//! [`Pending`] handle; its completion hands the region back. Dropping a `Pending` early leaves
//! the region with the queue until the NIC is done with it; dropping the queue pair moves it to
//! the error state, drains the flushed requests, destroys it, and only then frees what was in
//! flight.

mod atomic;
mod batch;
mod builder;
mod connect;
mod entry;
mod inline;
mod parts;
mod pending;
pub(crate) mod post;
pub(crate) mod raw;
mod retry;
mod retry_env;
mod srq;
mod srq_wake;
mod ticket;
pub(crate) mod wake;

pub use batch::{BatchError, MAX_BATCH};
pub use builder::QueuePairBuilder;
pub use connect::PreparedQp;
pub use inline::InlinePending;
pub use parts::{PartsDone, PartsError, PartsOutcome, PartsPending};
pub use pending::{Done, Outcome, Pending, WorkError};
pub(crate) use retry::Retry;
pub use retry::{
    DEFAULT_ACK_TIMEOUT, DEFAULT_HOP_LIMIT, DEFAULT_MIN_RNR_TIMER, DEFAULT_RETRY_COUNT,
    DEFAULT_RNR_RETRY,
};
pub use retry_env::{
    TransportRetry, ACK_TIMEOUT_ENV, MAX_ENV_ACK_TIMEOUT, MAX_ENV_RETRY_COUNT, RETRY_COUNT_ENV,
};
pub use srq::{SharedReceiveQueue, SrqPending};
pub use wake::{DEFAULT_BUSY_POLL, MAX_BUSY_POLL};

use crate::cm_id::ConnectionEnd;
use crate::device::{Gid, Mtu};
use crate::endpoint::Endpoint;
use crate::error::{Error, Op, Result};
use crate::slots::{slot_index, wr_id, RawCompletion, Slots};
use crate::sys::wc::{PollFailed, Polled};
use crate::wr::{WorkCompletion, WorkKind};
use pending::completion_error;
use raw::RawQp;
use rdma_sys as ffi;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::time::{Duration, Instant};

/// A connected RC queue pair with its own completion queue.
///
/// It is `Send` but not `Sync`: one thread posts and polls at a time, and no lock is taken on
/// the hot path. [`Pending`] handles borrow it, so it outlives every one of them.
pub struct QueuePair {
    /// Dropped first (field order): reactor registrations of the fds `raw` owns.
    wait: wake::WaitState,
    /// Dropped before `slots` (field order): the QP is destroyed first, after which the NIC
    /// can reach no buffer, and only then are the buffers of abandoned requests freed.
    raw: RawQp,
    slots: RefCell<Slots>,
    local: Endpoint,
    remote: Endpoint,
    /// Set once the queue pair is in the error state: flushed by us, or told so by a
    /// completion with an error status (an RC queue pair moves to ERR on the first one;
    /// we then flush it once more, for what was posted before we knew).
    /// Posts are refused from then on: the verbs accept them, but a provider need not ever
    /// complete them (rxe queues a receive posted then and never flushes it).
    in_error: Cell<bool>,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl QueuePair {
    /// A connected queue pair over `raw`, with slots for the given depths.
    pub(crate) fn new(
        raw: RawQp,
        send_depth: u32,
        recv_depth: u32,
        local: Endpoint,
        remote: Endpoint,
    ) -> QueuePair {
        let slots = Slots::new(send_depth, recv_depth);
        QueuePair {
            wait: wake::WaitState::new(slots.len()),
            raw,
            slots: RefCell::new(slots),
            local,
            remote,
            in_error: Cell::new(false),
        }
    }

    /// A queue pair the connection manager connected. Both endpoints are read back from the
    /// queue pair (`ibv_query_qp`), so that they describe the connection rdma_cm made:
    /// QPNs, PSNs, GIDs and the path MTU (as both endpoints' MTU).
    pub(crate) fn from_cm(raw: RawQp, send_depth: u32, recv_depth: u32) -> Result<QueuePair> {
        use ffi::ibv_qp_attr_mask as M;
        let mask = M::IBV_QP_AV | M::IBV_QP_PATH_MTU | M::IBV_QP_DEST_QPN | M::IBV_QP_RQ_PSN;
        let a = raw.query((mask | M::IBV_QP_SQ_PSN).0)?;
        let ctx = raw.pd().context().clone();
        let mtu = Mtu::from_raw(a.path_mtu).ok_or_else(|| {
            Error::invalid(
                Op::Cm,
                format!("path MTU code {} from ibv_query_qp", a.path_mtu),
            )
        })?;
        let port = a.ah_attr.port_num;
        let local = Endpoint {
            qpn: raw.qpn(),
            psn: a.sq_psn,
            lid: ctx.query_port(port)?.lid,
            gid: ctx.gid(port, u32::from(a.ah_attr.grh.sgid_index))?,
            mtu,
        };
        let remote = Endpoint {
            qpn: a.dest_qp_num,
            psn: a.rq_psn,
            lid: a.ah_attr.dlid,
            gid: Gid(crate::sys::gid_bytes(&a.ah_attr.grh.dgid)),
            mtu,
        };
        Ok(QueuePair::new(raw, send_depth, recv_depth, local, remote))
    }

    /// This side's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// The peer's endpoint: as given to [`PreparedQp::connect`], or, for an rdma_cm
    /// connection, as the connection manager set up the queue pair.
    pub fn remote_endpoint(&self) -> Endpoint {
        self.remote
    }

    /// The most bytes one inline send or write may carry (what the provider granted; see
    /// [`QueuePairBuilder::max_inline_data`]).
    pub fn max_inline_data(&self) -> u32 {
        self.raw.caps().max_inline
    }

    /// The most parts one send, write or atomic may gather from (what the provider granted;
    /// see [`QueuePairBuilder::max_sge`]).
    pub fn max_send_sge(&self) -> u32 {
        self.raw.caps().send_sge
    }

    /// The most parts one receive may scatter into (what the provider granted; see
    /// [`QueuePairBuilder::max_sge`]).
    pub fn max_recv_sge(&self) -> u32 {
        self.raw.caps().recv_sge
    }

    /// The most parts one RDMA read may scatter into: the send queue's parts, held to the
    /// device's `max_sge_rd`.
    pub fn max_read_sge(&self) -> u32 {
        self.raw.caps().read_sge
    }

    /// Whether [`QueuePair::post_write_batch`] and single plain writes post through the
    /// provider's extended send verbs (`ibv_wr_*`): asked for by default
    /// ([`QueuePairBuilder::extended_verbs`]), and granted only by providers that have them.
    pub fn extended_verbs(&self) -> bool {
        self.raw.wr_ops().is_some()
    }

    /// Requests posted and not yet completed, including those whose [`Pending`] was dropped.
    pub fn outstanding(&self) -> usize {
        self.slots.borrow().outstanding()
    }

    /// Polls the completion queue once, recording what arrived. Returns how many
    /// completions were consumed. No allocation, no lock.
    ///
    /// # Errors
    /// [`Error::Verbs`] if `ibv_poll_cq` fails.
    ///
    /// # Panics
    /// If a task's waker panics when woken: only once every completion the poll consumed
    /// is recorded and every other task woken, so nothing is lost (docs/safety.md,
    /// "Unwinding").
    #[inline]
    pub fn poll(&self) -> Result<usize> {
        self.poll_finding(None).map(|(n, _)| n)
    }

    /// [`QueuePair::poll`], which also finishes the request `mine` (a `wr_id`) if its
    /// completion is among those consumed: its slot is freed at once and its completion
    /// returned, instead of being recorded for a second look-up.
    ///
    /// `mine` is finished only once the whole batch is recorded and no waker panicked: if one
    /// did, its completion is recorded in the slot like every other before the panic goes on,
    /// so that the handle finds it at its next poll (or, dropped while unwinding, releases its
    /// region at once) rather than losing it with this stack frame.
    #[inline]
    fn poll_finding(&self, mine: Option<u64>) -> Result<(usize, Option<RawCompletion>)> {
        let mut found = None;
        match self.poll_into(mine, &mut found) {
            Ok(n) => Ok((n, found)),
            Err(e) => Err(self.raw.cq().poll_error(e)),
        }
    }

    /// [`QueuePair::poll_finding`], with what it finds of `mine` written to `found` (one move
    /// of the completion fewer than returning it in a tuple, on the owned handles' path).
    #[inline(always)]
    fn poll_into(
        &self,
        mine: Option<u64>,
        found: &mut Option<RawCompletion>,
    ) -> std::result::Result<usize, PollFailed> {
        self.raw.cq().poll_with(|polled| {
            let polled = polled?;
            self.record(polled, mine, found);
            Ok(polled.len())
        })
    }

    /// Records what one poll took (`polled`): every completion in its slot, its task woken,
    /// but `mine`'s (a `wr_id` whose handle the caller holds), which is finished and written
    /// to `found` (see [`QueuePair::poll_finding`]); the queue pair flushed once more after
    /// its first error completion.
    #[inline(always)]
    fn record(&self, polled: &Polled<'_>, mine: Option<u64>, found: &mut Option<RawCompletion>) {
        let mut panics = crate::unwind::Deferred::default();
        let mut seen = None;
        let mut first_error = false;
        polled.each(|wr_id, c| {
            if !c.is_success() && !self.in_error.replace(true) {
                first_error = true;
            }
            if Some(wr_id) == mine {
                // The caller holds the request's handle: nothing else waits for it, so no
                // waker to wake. Kept aside until the rest of the batch is recorded.
                seen = Some(c);
                return;
            }
            let released = self.slots.borrow_mut().complete(wr_id, c);
            // An abandoned buffer whose request just completed: safe to free now (outside
            // the borrow of the slots); a task awaiting the request is woken, its panic kept
            // until the batch is recorded.
            drop(released);
            self.wait.waiters.wake(slot_index(wr_id), &mut panics);
        });
        if let (Some(c), Some(wr_id)) = (seen, mine) {
            let mut slots = self.slots.borrow_mut();
            *found = if panics.is_empty() {
                slots.finish(wr_id, c)
            } else {
                None
            };
            // Not finished (a panic is pending, or the request was not waiting on its own):
            // recorded as usual. Never an abandoned buffer here (the caller's handle holds
            // what it lent); were there one, it is dropped outside the borrow all the same.
            let released = found.is_none().then(|| slots.complete(wr_id, c));
            drop(slots);
            drop(released);
        }
        if first_error {
            // The NIC moved the queue pair to the error state, maybe well before, and a
            // receive posted in between was accepted (nothing here knew yet): rxe keeps such
            // a receive and never completes it. Moving the queue pair to the error state once
            // more makes it flush it, as everything else in flight (after the completions
            // above are recorded; the flush cannot unwind).
            self.flush();
        }
        panics.resume();
    }

    /// Sleeps until the completion queue has something, or `timeout` passes (see
    /// [`CompletionQueue::sleep`](crate::cq::CompletionQueue::sleep)).
    pub(crate) fn sleep_for_completion(&self, timeout: Duration) -> Result<()> {
        self.raw.cq().sleep(timeout, || self.poll())
    }

    /// Moves the queue pair to the error state: everything in flight completes, flushed
    /// (rdma_cm connections are disconnected, which tells the peer). Off every hot path.
    #[cold]
    pub(crate) fn flush(&self) {
        self.in_error.set(true);
        self.raw.flush();
    }

    /// Its rdma_cm connection has ended (an event said so): flushed, unless it already is.
    pub(crate) fn connection_ended(&self) {
        if !self.is_in_error() {
            self.flush();
        }
    }

    /// Whether the queue pair is known to be in the error state (flushed by us, told so by
    /// a completion with an error status, or moved there by a fatal asynchronous event read
    /// with [`AsyncEvents`](crate::reactor::AsyncEvents)): it then takes no more requests.
    #[inline]
    pub fn is_in_error(&self) -> bool {
        self.in_error.get() || self.raw.flushed_by_event()
    }

    /// The completion of slot `index` (generation `gen`): one poll of the completion queue
    /// (which records every other completion it brings), then, if that poll did not bring
    /// this one, the slot (an earlier poll may have recorded it). `None` while in flight (or
    /// if the queue cannot be polled and the slot has nothing, when the request may still be
    /// in flight). A waker of another task that panics when this poll wakes it unwinds out
    /// of here once everything is recorded, this request's completion included (in its slot):
    /// the handle, dropped while unwinding, then releases what it lent.
    #[inline(always)]
    pub(crate) fn poll_for(&self, index: u32, gen: u32) -> Option<RawCompletion> {
        // The queue first, the slot after: a completion an earlier poll recorded is still
        // found (this poll only records others), and the common case, the completion first
        // seen by this poll, skips a look-up of the slot. A poll that fails leaves the slot
        // to say.
        self.raw.cq().poll_with(
            #[inline(always)]
            |polled| self.polled_for(polled, index, gen),
        )
    }

    /// What [`QueuePair::poll_for`]'s poll brought, for the request in slot `index`
    /// (generation `gen`). Inlined for certain, and the closure that calls it too: left out
    /// of line (as the compiler chose once the awaited poll had a fast path of its own), it
    /// cost every completion a call and the moves of its result.
    #[inline(always)]
    fn polled_for(
        &self,
        polled: std::result::Result<&Polled<'_>, PollFailed>,
        index: u32,
        gen: u32,
    ) -> Option<RawCompletion> {
        let Ok(polled) = polled else {
            // A poll that failed leaves the slot to say.
            return self.take_completion(index, gen);
        };
        let mine = wr_id(index, gen);
        // The common case: this poll took this request's completion alone, a success.
        // Nothing else to record, no task to wake, no error state to flush: the slot is
        // freed and the completion returned at once.
        if let Some(c) = polled.only_success(mine) {
            if let Some(c) = self.slots.borrow_mut().finish_own(index, gen, c) {
                return Some(c);
            }
        }
        self.poll_for_rest(polled, mine)
    }

    /// [`QueuePair::poll_for`] but for its common case, out of line: what the poll took
    /// recorded as every poll records it, this request's completion finished at once if
    /// among them, else looked for in its slot (an earlier poll, or this one's fallback path,
    /// a batch's member error or a waker's panic, may have recorded it). When the common
    /// case's `finish` returned `None`, it changed nothing.
    #[inline(never)]
    fn poll_for_rest(&self, polled: &Polled<'_>, mine: u64) -> Option<RawCompletion> {
        let mut found = None;
        self.record(polled, Some(mine), &mut found);
        if found.is_some() {
            return found;
        }
        self.take_completion(slot_index(mine), (mine >> 32) as u32)
    }

    /// The completion of slot `index` (generation `gen`), if it has arrived.
    #[inline]
    pub(crate) fn take_completion(&self, index: u32, gen: u32) -> Option<RawCompletion> {
        self.slots.borrow_mut().take(index, gen)
    }

    /// A completion as a result: the work completion, or a typed error.
    #[inline]
    pub(crate) fn completion_result(
        &self,
        index: u32,
        gen: u32,
        kind: WorkKind,
        c: RawCompletion,
    ) -> Result<WorkCompletion> {
        if !c.is_success() {
            return Err(completion_error(index, gen, kind, c));
        }
        Ok(WorkCompletion {
            wr_id: wr_id(index, gen),
            kind,
            byte_len: c.byte_len(),
            imm: c.imm(),
            qp_num: c.qp_num(),
        })
    }

    /// For an rdma_cm connection: waits until the peer disconnects (the
    /// `RDMA_CM_EVENT_DISCONNECTED` event), for at most `timeout`. The queue pair is then in
    /// the error state, as [`QueuePair::take_cm_events`] leaves it: what is still in flight
    /// ends flushed (awaited requests are woken), later posts are refused, and the end stays
    /// recorded for `take_cm_events`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a queue pair connected by endpoint exchange;
    /// [`Error::Verbs`] with `ETIMEDOUT` if nothing ended the connection within `timeout`,
    /// with `ENODEV` if the device is being removed (`RDMA_CM_EVENT_DEVICE_REMOVAL`: the
    /// connection has ended too, and the queue pair is flushed as for a disconnect), or if
    /// waiting on the event channel fails.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<()> {
        let end = self.raw.wait_disconnected(timeout)?;
        self.disconnected(end)
    }

    /// As [`QueuePair::wait_disconnected`], awaited on tokio's reactor (the `tokio`
    /// feature): how a node learns that its peer has finished and closed the connection.
    ///
    /// # Errors
    /// As [`QueuePair::wait_disconnected`].
    #[cfg(feature = "tokio")]
    pub async fn wait_disconnected_async(&self, timeout: Duration) -> Result<()> {
        let end = self.raw.wait_disconnected_async(timeout).await?;
        self.disconnected(end)
    }

    /// Records the connection's end (`end`), flushing what is in flight.
    fn disconnected(&self, end: ConnectionEnd) -> Result<()> {
        self.connection_ended();
        match end {
            ConnectionEnd::Disconnected => Ok(()),
            ConnectionEnd::DeviceRemoval => Err(Error::from_errno(
                Op::Cm,
                "wait for disconnect: the device is being removed",
                libc::ENODEV,
            )),
        }
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Flush everything in flight, wait (bounded) for the flush completions; `raw` is then
        // destroyed before `slots` drops (field order).
        self.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        // A waker that panics while woken does not cut the drain short: its panic is raised
        // once the flushes are in (and `raw`, then `slots`, still drop after it).
        let mut panics = crate::unwind::Deferred::default();
        while self.outstanding() > 0 && Instant::now() < deadline {
            let mut polled = Ok(0);
            panics.run(|| polled = self.poll());
            if polled.is_err() {
                break;
            }
        }
        panics.resume();
    }
}
