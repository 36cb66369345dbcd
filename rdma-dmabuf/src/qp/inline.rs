//! Inline sends and writes: small payloads the provider copies into the work request at post
//! time, so they need no registered region and nothing is lent to the NIC.

use super::ticket::{blocking_wait, busy_wait, timed_wait, Handle};
use super::QueuePair;
use crate::error::{Error, Op, Result};
use crate::remote::RemoteRegion;
use crate::slots::wr_id;
use crate::wr::{WorkCompletion, WorkKind};
use std::fmt;
use std::time::Duration;

impl QueuePair {
    /// `IBV_WR_SEND` of `data` inline: the bytes are copied at post time, so `data` is only
    /// borrowed for the call. At most the queue pair's inline size
    /// ([`QueuePairBuilder::max_inline_data`](crate::QueuePairBuilder::max_inline_data)).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for empty data or data past the inline size (the message
    /// gives both); the queue's and the provider's errors.
    pub fn post_send_inline(&self, data: &[u8], imm: Option<u32>) -> Result<InlinePending<'_>> {
        self.post_inline(WorkKind::Send, data, None, imm)
    }

    /// `IBV_WR_RDMA_WRITE` (with `imm`: `_WITH_IMM`) of `data` inline to the start of
    /// `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send_inline`], and an invalid argument if `remote` is shorter.
    pub fn post_write_inline(
        &self,
        data: &[u8],
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<InlinePending<'_>> {
        self.post_inline(WorkKind::Write, data, Some(remote), imm)
    }

    fn post_inline(
        &self,
        kind: WorkKind,
        data: &[u8],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<InlinePending<'_>> {
        let refuse = |why: String| Err(Error::invalid(Op::PostSend, why));
        if self.is_in_error() {
            return refuse(format!("inline {kind} on a queue pair in the error state"));
        }
        let len = data.len();
        if len == 0 {
            return refuse(format!("inline {kind} of 0 bytes"));
        }
        let max = self.raw.caps().max_inline as usize;
        if len > max {
            return refuse(format!(
                "inline {kind} of {len} bytes: this queue pair takes at most {max} inline \
                 (QueuePairBuilder::max_inline_data)"
            ));
        }
        if let Some(r) = remote {
            if !r.holds(len as u64) {
                return refuse(r.refusal(format_args!("inline {kind}"), len as u64));
            }
        }
        let (index, gen) = self.post_copied(kind, data, remote, imm)?;
        Ok(InlinePending {
            qp: self,
            index,
            gen,
            kind,
            open: true,
        })
    }
}

/// A posted inline request: nothing was lent, so it resolves to the completion alone.
/// Dropping it early is fine (its slot is freed when the completion arrives).
#[must_use = "an inline request's completion tells whether it arrived"]
pub struct InlinePending<'q> {
    pub(super) qp: &'q QueuePair,
    pub(super) index: u32,
    pub(super) gen: u32,
    kind: WorkKind,
    /// Until the completion is taken.
    pub(super) open: bool,
}

impl fmt::Debug for InlinePending<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InlinePending")
            .field("wr_id", &wr_id(self.index, self.gen))
            .field("kind", &self.kind)
            .finish()
    }
}

impl InlinePending<'_> {
    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        wr_id(self.index, self.gen)
    }

    /// Polls once; the completion if the request has completed, else the handle back.
    ///
    /// # Errors
    /// `Err(self)` while the request is still in flight.
    pub fn try_complete(mut self) -> std::result::Result<Result<WorkCompletion>, Self> {
        match self.finish() {
            Some(out) => Ok(out),
            None => Err(self),
        }
    }

    /// Polls once: the completion if the request has completed (the handle is then closed).
    pub(super) fn finish(&mut self) -> Option<Result<WorkCompletion>> {
        let c = self.qp.poll_for(self.index, self.gen)?;
        self.open = false;
        let result = self
            .qp
            .completion_result(self.index, self.gen, self.kind, c);
        // Last: dropping the task's waker runs its code, which may panic (docs/safety.md,
        // "Unwinding"); the request is recorded as ended first.
        self.qp.forget_waiter(self.index);
        Some(result)
    }

    /// Busy-polls until the request completes.
    ///
    /// # Errors
    /// The completion's error.
    pub fn spin(self) -> Result<WorkCompletion> {
        busy_wait(self)
    }

    /// As [`InlinePending::spin`], for at most `timeout`.
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn spin_timeout(
        self,
        timeout: Duration,
    ) -> std::result::Result<Result<WorkCompletion>, Self> {
        timed_wait(self, timeout)
    }

    /// As [`Pending::wait`](crate::Pending::wait).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn wait(self, timeout: Duration) -> std::result::Result<Result<WorkCompletion>, Self> {
        blocking_wait(self, timeout)
    }
}

impl<'q> Handle<'q> for InlinePending<'q> {
    type Out = Result<WorkCompletion>;
    fn try_complete(self) -> std::result::Result<Self::Out, Self> {
        InlinePending::try_complete(self)
    }
    fn qp(&self) -> &'q QueuePair {
        self.qp
    }
}

impl Drop for InlinePending<'_> {
    fn drop(&mut self) {
        if self.open {
            // Nothing to keep alive: the slot only has to know that nobody will take the
            // completion (a zero-sized box does not allocate).
            let back = self
                .qp
                .slots
                .borrow_mut()
                .abandon(self.index, self.gen, Box::new(()));
            drop(back);
            // Last: the waker's `Drop` is code we do not control.
            self.qp.forget_waiter(self.index);
        }
    }
}

impl<'q> super::InlinePending<'q> {
    /// As [`Pending::poll_with`](super::Pending::poll_with), for an inline request (nothing
    /// was lent: the outcome is the completion).
    ///
    /// # Panics
    /// If polled again after it returned the outcome.
    pub fn poll_with(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wait: impl Fn(&'q QueuePair, &mut std::task::Context<'_>) -> crate::reactor::WaitStep,
    ) -> std::task::Poll<Result<WorkCompletion>> {
        let (qp, index) = (self.qp, self.index);
        assert!(self.open, "InlinePending polled after it completed");
        super::wake::poll_request(qp, index, cx, || self.finish(), wait)
    }
}

/// Awaiting an [`InlinePending`](super::InlinePending) (the `tokio` feature) resolves to its
/// completion, as its `spin` does.
#[cfg(feature = "tokio")]
impl std::future::Future for super::InlinePending<'_> {
    type Output = Result<WorkCompletion>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.poll_with(cx, super::wake::with_tokio::step)
    }
}
