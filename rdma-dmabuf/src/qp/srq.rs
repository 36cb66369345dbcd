//! Shared receive queues: one pool of posted receives that several queue pairs receive
//! through (`ibv_create_srq`), so that a server with many peers keeps one set of receive
//! buffers instead of one per connection.
//!
//! Queue pairs join it at creation ([`QueuePairBuilder::srq`](crate::QueuePairBuilder::srq),
//! also through [`MultiChannelBuilder::queue_pairs`](crate::MultiChannelBuilder::queue_pairs)
//! and rdma_cm). Their receive completions land on the shared queue's own completion queue,
//! polled through [`SharedReceiveQueue`]; each says which queue pair the message arrived on
//! ([`WorkCompletion::qp_num`](crate::WorkCompletion::qp_num)). Receives are owned posts
//! like a queue pair's: the region moves in and comes back with the completion.
//!
//! A receive belongs to the queue pair whose message began to fill it. If that queue pair
//! fails or is dropped before the message is complete, the receive completes with a flush
//! error (`IBV_WC_WR_FLUSH_ERR`) and its region comes back (hardware does this; soft-RoCE
//! needs `kernel-patches/linux/0002-*`, without which such a receive is never completed and
//! its region stays with the shared queue until the queue and its last queue pair are gone).
//! If the sending peer dies mid-message, the receiving queue pair stays connected and keeps
//! the receive until it is dropped or fails. Receive errors of a queue pair that joined a
//! shared queue arrive here, not on the queue pair, so its
//! [`is_in_error`](crate::QueuePair::is_in_error) learns of them only from its own sends.

use super::pending::completion_error;
use super::{Done, Outcome, WorkError};
use crate::cq::CompletionQueue;
use crate::deadline::{deadline_after, time_left};
use crate::error::{Error, Op, Result};
use crate::mr::{Access, Backing};
use crate::part::Local;
use crate::slots::{slot_index, wr_id, RawCompletion, Slots};
use crate::spin::Spinner;
use crate::sys::pd::ProtectionDomain;
use crate::wr::{WorkCompletion, WorkKind};
use rdma_sys as ffi;
use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A shared receive queue and the table of its posted receives.
///
/// `Send` but not `Sync`, like a [`QueuePair`](crate::QueuePair): one thread posts and polls
/// at a time, without a lock. The queue pairs that joined it keep its verbs objects alive, so
/// it may be dropped before them: receives still posted then stay with those objects (their
/// buffers are freed only once the shared queue is destroyed, after its last queue pair).
pub struct SharedReceiveQueue {
    /// Dropped first (field order): reactor registrations of the completion channel's fd,
    /// which `core`'s CQ owns (and closes only after the last queue pair is gone).
    pub(super) wait: super::wake::WaitState,
    pub(super) core: Arc<SrqCore>,
    /// The one key to `core`'s completion queue (see [`CqKey`]).
    key: CqKey,
    pub(super) slots: RefCell<Slots>,
}

use crate::sys::srq::CqKey;
pub(crate) use crate::sys::srq::SrqCore;

impl fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("device", &self.core.pd().context().name())
            .field("depth", &self.core.depth())
            .field("max_sge", &self.core.max_sge())
            .finish()
    }
}

impl SharedReceiveQueue {
    /// A shared receive queue in `pd` holding up to `depth` posted receives.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a device without shared receive queues;
    /// [`Error::InvalidArgument`] for a depth of 0 or past the device's `max_srq_wr`;
    /// [`Error::Verbs`] from the provider.
    pub fn new(pd: &Arc<ProtectionDomain>, depth: u32) -> Result<SharedReceiveQueue> {
        let ctx = pd.context();
        let dev = ctx.query_device()?;
        if dev.max_srq == 0 {
            return Err(Error::Unsupported {
                op: Op::CreateSrq,
                device: ctx.name().to_string(),
                errno: libc::EOPNOTSUPP,
                why: "the device has no shared receive queues (max_srq is 0)",
            });
        }
        // Each receive completes on the shared queue's own CQ, so the depth is held to both
        // limits.
        let max = dev.max_srq_wr.min(dev.max_cqe);
        if depth == 0 || depth > max {
            return Err(Error::invalid(
                Op::CreateSrq,
                format!(
                    "depth {depth}: {} takes 1 to {max} receives per shared queue (max_srq_wr \
                     {}, and max_cqe {} for its completion queue)",
                    ctx.name(),
                    dev.max_srq_wr,
                    dev.max_cqe
                ),
            ));
        }
        let entries = i32::try_from(depth).map_err(|_| {
            Error::invalid(Op::CreateSrq, format!("depth {depth} past a CQ's i32 size"))
        })?;
        let cq = CompletionQueue::new(ctx, entries, true)?;
        let (core, key) = SrqCore::create(pd, cq, depth).map_err(|e| {
            Error::from_errno(
                Op::CreateSrq,
                format!("{} (depth {depth})", ctx.name()),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })?;
        Ok(SharedReceiveQueue {
            wait: super::wake::WaitState::new(depth as usize),
            core: Arc::new(core),
            key,
            slots: RefCell::new(Slots::new(0, depth)),
        })
    }

    /// The shared completion queue, reached with this handle's key.
    pub(super) fn cq(&self) -> &crate::cq::CompletionQueue {
        self.core.cq(&self.key)
    }

    /// The verbs objects, for queue pairs joining it.
    pub(crate) fn core(&self) -> &Arc<SrqCore> {
        &self.core
    }

    /// The most receives it holds.
    pub fn depth(&self) -> u32 {
        self.core.depth()
    }

    /// Receives posted and not yet completed (including those whose handle was dropped):
    /// when this runs low, post more.
    pub fn outstanding(&self) -> usize {
        self.slots.borrow().outstanding()
    }

    /// Posts a receive into the local bytes (which need [`Access::LOCAL_WRITE`]); whichever
    /// joined queue pair gets the next message fills it.
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: an empty or out-of-range part, a region of
    /// another protection domain or without `LOCAL_WRITE`, a full queue, or the provider's
    /// refusal.
    pub fn post_recv<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
    ) -> std::result::Result<SrqPending<'_, B>, WorkError<B>> {
        let local = local.into();
        match self.post(&local) {
            Ok((index, gen)) => Ok(SrqPending {
                srq: self,
                index,
                gen,
                local: Some(local),
            }),
            Err(error) => Err(WorkError {
                error,
                region: local.into_region(),
            }),
        }
    }

    #[allow(unsafe_code)] // posts a receive whose region moves into the handle or slot; see the SAFETY comments
    fn post<B: Backing>(&self, local: &Local<B>) -> Result<(u32, u32)> {
        let region = local.region();
        let range = local.range();
        let refuse = |what: String| Err(Error::invalid(Op::PostSrqRecv, what));
        if range.end <= range.start || range.end > region.len() {
            return refuse(format!(
                "receive into {}..{} of a region of {} bytes (empty, reversed or outside)",
                range.start,
                range.end,
                region.len()
            ));
        }
        let Ok(len) = u32::try_from(range.end - range.start) else {
            return refuse("a receive of 4 GiB or more".into());
        };
        if !region.access().contains(Access::LOCAL_WRITE) {
            return refuse("receive into a region without LOCAL_WRITE access".into());
        }
        if !Arc::ptr_eq(region.pd(), self.core.pd()) {
            return refuse("the region belongs to another protection domain".into());
        }
        let (index, gen) = self
            .slots
            .borrow_mut()
            .acquire(WorkKind::Recv, len)
            .map_err(|e| match e {
                Error::QueueFull { depth, .. } => Error::QueueFull {
                    op: Op::PostSrqRecv,
                    depth,
                },
                other => other,
            })?;
        let mut sge = ffi::ibv_sge {
            addr: region.addr() + range.start,
            length: len,
            lkey: region.lkey(),
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: wr_id(index, gen),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: the SGE lies inside `region` (checked above), of this SRQ's PD, with its
        // lkey; the caller moves the region into the returned handle (or, dropped early, into
        // the slot, which lives until the SRQ is destroyed: `Drop` below), so it stays
        // registered and out of the CPU's reach until the completion is polled.
        if let Err(rc) = unsafe { self.core.post_recv(&mut wr) } {
            // SAFETY: the provider refused this receive (`rc != 0`): the NIC has nothing of it.
            unsafe { self.slots.borrow_mut().cancel(index) };
            let target = format!("{} shared receive queue", self.core.pd().context().name());
            return Err(Error::from_errno(Op::PostSrqRecv, target, rc));
        }
        Ok((index, gen))
    }

    /// Polls the shared completion queue once, recording what arrived; returns how many
    /// completions were consumed. No allocation, no lock.
    ///
    /// # Errors
    /// [`Error::Verbs`] if `ibv_poll_cq` fails.
    ///
    /// # Panics
    /// If a task's waker panics when woken: only once every completion the poll consumed
    /// is recorded and every other task woken (docs/safety.md, "Unwinding").
    pub fn poll(&self) -> Result<usize> {
        let mut panics = crate::unwind::Deferred::default();
        let n = self.cq().poll(|id, c| {
            let released = self.slots.borrow_mut().complete(id, c);
            // An abandoned buffer whose receive just completed: free it outside the borrow;
            // a task awaiting the receive is woken.
            drop(released);
            self.wait.waiters.wake(slot_index(id), &mut panics);
        });
        panics.resume();
        n.map_err(|e| self.cq().poll_error(e))
    }

    /// Sets the limit: when the posted receives fall below `limit`, the device raises its
    /// `IBV_EVENT_SRQ_LIMIT_REACHED` async event once (then the limit must be set again).
    /// `0` disarms it.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a limit past the depth; [`Error::Verbs`].
    pub fn arm_limit(&self, limit: u32) -> Result<()> {
        if limit > self.core.depth() {
            return Err(Error::invalid(
                Op::ModifySrq,
                format!("limit {limit} past the depth {}", self.core.depth()),
            ));
        }
        self.core.set_limit(limit).map_err(|rc| {
            let target = format!(
                "{} shared receive queue limit",
                self.core.pd().context().name()
            );
            Error::from_errno(Op::ModifySrq, target, rc)
        })
    }

    /// The current limit (`ibv_query_srq`): 0 once the limit event has fired.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub fn limit(&self) -> Result<u32> {
        self.core.query_limit().map_err(|rc| {
            let target = format!("{} ibv_query_srq", self.core.pd().context().name());
            Error::from_errno(Op::ModifySrq, target, rc)
        })
    }

    fn poll_for(&self, index: u32, gen: u32) -> Option<RawCompletion> {
        if let Some(c) = self.slots.borrow_mut().take(index, gen) {
            return Some(c);
        }
        self.poll().ok()?;
        self.slots.borrow_mut().take(index, gen)
    }
}

impl Drop for SharedReceiveQueue {
    fn drop(&mut self) {
        // Receives still posted may yet be filled through a queue pair that outlives this
        // handle: their buffers go to the core, freed after the SRQ is destroyed.
        let slots = std::mem::replace(self.slots.get_mut(), Slots::new(0, 0));
        if slots.outstanding() > 0 {
            self.core.keep_until_destroyed(Box::new(slots));
        }
    }
}

/// A receive posted on a [`SharedReceiveQueue`]; [`SrqPending::spin_timeout`] returns the region with
/// the completion, whose [`qp_num`](WorkCompletion::qp_num) names the queue pair the message
/// came through. Dropping it early is safe: the region stays with the shared queue until the
/// NIC is done with it.
#[must_use = "dropping an SrqPending leaves its region with the queue until a message fills it"]
pub struct SrqPending<'s, B: Backing> {
    pub(super) srq: &'s SharedReceiveQueue,
    pub(super) index: u32,
    pub(super) gen: u32,
    local: Option<Local<B>>,
}

impl<B: Backing> fmt::Debug for SrqPending<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqPending")
            .field("wr_id", &self.wr_id())
            .finish()
    }
}

impl<B: Backing> SrqPending<'_, B> {
    /// The receive's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        wr_id(self.index, self.gen)
    }

    /// Polls once; the outcome if a message has filled the receive, else the handle back.
    ///
    /// # Errors
    /// `Err(self)` while the receive is still posted.
    pub fn try_complete(mut self) -> std::result::Result<Outcome<B>, Self> {
        match self.finish() {
            Some(out) => Ok(out),
            None => Err(self),
        }
    }

    /// Polls once: the outcome if a message has filled the receive (the region is then
    /// taken out of the handle).
    pub(super) fn finish(&mut self) -> Option<Outcome<B>> {
        if self.local.is_none() {
            panic!("SrqPending polled after it returned its outcome");
        }
        let c = self.srq.poll_for(self.index, self.gen)?;
        let region = self
            .local
            .take()
            .expect("present until completion")
            .into_region();
        let out = if !c.is_success() {
            let error = completion_error(self.index, self.gen, WorkKind::Recv, c);
            Err(WorkError { error, region })
        } else {
            let wc = WorkCompletion {
                wr_id: self.wr_id(),
                kind: WorkKind::Recv,
                byte_len: c.byte_len(),
                imm: c.imm(),
                qp_num: c.qp_num(),
            };
            Ok(Done { region, wc })
        };
        // Last: dropping the task's waker runs its code, which may panic (docs/safety.md,
        // "Unwinding"); by then the receive has ended and its slot is free.
        self.srq.wait.waiters.forget(self.index);
        Some(out)
    }

    /// Busy-polls until a message fills the receive, for at most `timeout` (`Duration::MAX`
    /// waits for as long as it takes), yielding now and then.
    ///
    /// # Errors
    /// `Err(self)` if the receive is still posted after `timeout`.
    pub fn spin_timeout(mut self, timeout: Duration) -> std::result::Result<Outcome<B>, Self> {
        let deadline = deadline_after(timeout);
        let mut spinner = Spinner::new(self.srq.wait.spin_policy());
        loop {
            match self.try_complete() {
                Ok(out) => return Ok(out),
                Err(again) => self = again,
            }
            if spinner.after_poll() && time_left(deadline).is_zero() {
                return Err(self);
            }
        }
    }
}

impl<B: Backing> Drop for SrqPending<'_, B> {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            // Into the slot before the waker's `Drop` (code we do not control) runs.
            let back = self
                .srq
                .slots
                .borrow_mut()
                .abandon(self.index, self.gen, Box::new(local));
            // Completed already: the NIC is done with it, free it now (outside the borrow).
            drop(back);
            self.srq.wait.waiters.forget(self.index);
        }
    }
}
