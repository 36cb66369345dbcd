//! Owned posts of several parts: one request that gathers from (sends, writes) or scatters
//! into (receives, reads) up to the queue pair's `max_sge` parts, in order. Every part moves
//! into the request and all come back together with the completion.

use super::post::{post_op, Sge, Shape};
use super::ticket::{blocking_wait, busy_wait, timed_wait, Handle, Ticket};
use super::QueuePair;
use crate::error::{Error, Result};
use crate::mr::{Backing, MemoryRegion};
use crate::part::{ExclusivePart, OwnedPart};
use crate::remote::RemoteRegion;
use crate::wr::{WorkCompletion, WorkKind};
use std::fmt;
use std::ops::Range;
use std::time::Duration;

/// A finished request of several parts: all of them back, and the completion.
#[derive(Debug)]
pub struct PartsDone<P, const N: usize> {
    /// The parts, in the order posted, back with the CPU.
    pub parts: [P; N],
    /// The completion.
    pub wc: WorkCompletion,
}

/// A request of several parts that was refused or failed, with all of them back.
#[derive(Debug)]
pub struct PartsError<P, const N: usize> {
    /// What went wrong.
    pub error: Error,
    /// The parts, in the order posted, back with the CPU.
    pub parts: [P; N],
}

impl<P, const N: usize> fmt::Display for PartsError<P, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<P: fmt::Debug, const N: usize> std::error::Error for PartsError<P, N> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The error of a failed request of several parts, the parts dropped.
impl<P, const N: usize> From<PartsError<P, N>> for Error {
    fn from(e: PartsError<P, N>) -> Error {
        e.error
    }
}

/// How a posted request of several parts ended.
pub type PartsOutcome<P, const N: usize> = std::result::Result<PartsDone<P, N>, PartsError<P, N>>;

/// A posted request of several parts; [`PartsPending::spin`] returns them all with the
/// completion. Dropping it early is safe, as for [`Pending`](crate::Pending): the parts stay
/// with the queue pair until the NIC is done with them.
#[must_use = "dropping a PartsPending leaves its parts with the queue until the request completes"]
pub struct PartsPending<'q, P: OwnedPart, const N: usize> {
    pub(super) ticket: Ticket<'q, [P; N]>,
}

impl<P: OwnedPart, const N: usize> fmt::Debug for PartsPending<'_, P, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.ticket.fmt("PartsPending", f)
    }
}

/// The outcome of a failed request of parts, built out of line (as `pending::failed`).
#[cold]
#[inline(never)]
fn parts_failed<P: OwnedPart, const N: usize>(error: Error, parts: [P; N]) -> PartsOutcome<P, N> {
    Err(PartsError { error, parts })
}

impl<'q, P: OwnedPart, const N: usize> PartsPending<'q, P, N> {
    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.ticket.wr_id()
    }

    /// Polls once; the outcome if the request has completed, else the handle back.
    ///
    /// # Errors
    /// `Err(self)` while the request is still in flight.
    pub fn try_complete(mut self) -> std::result::Result<PartsOutcome<P, N>, Self> {
        let Some(c) = self.ticket.poll_done() else {
            return Err(self);
        };
        // The parts move once, from the ticket into the outcome (see `Ticket::poll_done`);
        // the ticket's `Drop` then has nothing to do.
        let t = &mut self.ticket;
        Ok(match t.qp.completion_result(t.index, t.gen, t.kind, c) {
            Ok(wc) => Ok(PartsDone {
                parts: t.take_lent(),
                wc,
            }),
            Err(error) => parts_failed(error, t.take_lent()),
        })
    }

    /// Busy-polls until the request completes.
    pub fn spin(self) -> PartsOutcome<P, N> {
        busy_wait(self)
    }

    /// As [`Pending::wait`](crate::Pending::wait).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn wait(self, timeout: Duration) -> std::result::Result<PartsOutcome<P, N>, Self> {
        blocking_wait(self, timeout)
    }

    /// As [`Pending::spin_timeout`](crate::Pending::spin_timeout).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn spin_timeout(self, timeout: Duration) -> std::result::Result<PartsOutcome<P, N>, Self> {
        timed_wait(self, timeout)
    }
}

impl<'q, P: OwnedPart, const N: usize> Handle<'q> for PartsPending<'q, P, N> {
    type Out = PartsOutcome<P, N>;
    fn try_complete(self) -> std::result::Result<Self::Out, Self> {
        PartsPending::try_complete(self)
    }
    fn qp(&self) -> &'q QueuePair {
        self.ticket.qp
    }
}

impl QueuePair {
    /// `IBV_WR_SEND` of the parts, gathered in order into one message.
    ///
    /// # Errors
    /// A [`PartsError`] with every part back: no parts, more than the queue pair takes
    /// ([`QueuePairBuilder::max_sge`](crate::QueuePairBuilder::max_sge)), a part that fails
    /// the checks of [`QueuePair::post_send`], a total past 4 GiB - 1, or the queue's and
    /// the provider's refusals.
    #[inline]
    pub fn post_send_parts<P: OwnedPart, const N: usize>(
        &self,
        parts: [P; N],
        imm: Option<u32>,
    ) -> std::result::Result<PartsPending<'_, P, N>, PartsError<P, N>> {
        self.post_parts(WorkKind::Send, parts, None, imm)
    }

    /// A receive scattered in order into the parts (each needs `LOCAL_WRITE`): the first
    /// part fills first.
    ///
    /// # Errors
    /// As [`QueuePair::post_send_parts`].
    #[inline]
    pub fn post_recv_parts<P: ExclusivePart, const N: usize>(
        &self,
        parts: [P; N],
    ) -> std::result::Result<PartsPending<'_, P, N>, PartsError<P, N>> {
        self.post_parts(WorkKind::Recv, parts, None, None)
    }

    /// `IBV_WR_RDMA_WRITE` (with `imm`: `_WITH_IMM`) of the parts, gathered in order, to the
    /// start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send_parts`], and an invalid argument if `remote` is shorter
    /// than the parts together.
    #[inline]
    pub fn post_write_parts<P: OwnedPart, const N: usize>(
        &self,
        parts: [P; N],
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> std::result::Result<PartsPending<'_, P, N>, PartsError<P, N>> {
        self.post_parts(WorkKind::Write, parts, Some(remote), imm)
    }

    /// `IBV_WR_RDMA_READ` of the start of `remote`, scattered in order into the parts (each
    /// needs `LOCAL_WRITE`; at most [`QueuePair::max_read_sge`] of them).
    ///
    /// # Errors
    /// As [`QueuePair::post_write_parts`].
    #[inline]
    pub fn post_read_parts<P: ExclusivePart, const N: usize>(
        &self,
        parts: [P; N],
        remote: RemoteRegion,
    ) -> std::result::Result<PartsPending<'_, P, N>, PartsError<P, N>> {
        self.post_parts(WorkKind::Read, parts, Some(remote), None)
    }

    fn post_parts<P: OwnedPart, const N: usize>(
        &self,
        kind: WorkKind,
        parts: [P; N],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> std::result::Result<PartsPending<'_, P, N>, PartsError<P, N>> {
        self.post_owned(
            Shape::new(kind, remote, imm),
            parts,
            |ticket| PartsPending { ticket },
            |error, parts| PartsError { error, parts },
        )
    }

    /// Checks a request of `N` parts: their number against the queue pair's grant, each part
    /// as a single-part request is checked, and their total against 4 GiB - 1 and `remote`.
    /// Returns the SGEs to post.
    pub(crate) fn check_parts<'r, B: Backing + 'r, const N: usize>(
        &self,
        kind: WorkKind,
        parts: impl Iterator<Item = (&'r MemoryRegion<B>, Range<u64>)>,
        remote: Option<RemoteRegion>,
    ) -> Result<[Sge; N]> {
        let op = post_op(kind);
        let caps = &self.raw.caps();
        let (max, which) = match kind {
            WorkKind::Recv => (caps.recv_sge, "receive"),
            WorkKind::Read => (caps.read_sge, "RDMA read (also held to max_sge_rd)"),
            _ => (caps.send_sge, "send-queue request"),
        };
        if N == 0 || N as u64 > u64::from(max) {
            return Err(Error::invalid(
                op,
                format!(
                    "{kind} of {N} parts: this queue pair takes 1 to {max} per {which} \
                     (QueuePairBuilder::max_sge)"
                ),
            ));
        }
        // Each placeholder is overwritten below (there are exactly N parts).
        let mut sges = [Sge::EMPTY; N];
        let mut total = 0u64;
        for (slot, (region, range)) in sges.iter_mut().zip(parts) {
            *slot = self.checked_sge(kind, region, range, None)?;
            total += u64::from(slot.len());
        }
        if total > u64::from(u32::MAX) {
            return Err(Error::invalid(
                op,
                format!("{kind} of {total} bytes: past the 4 GiB - 1 one request carries"),
            ));
        }
        if let Some(r) = remote {
            if !r.holds(total) {
                return Err(Error::invalid(op, r.refusal(kind, total)));
            }
        }
        Ok(sges)
    }
}

impl<'q, P: crate::part::OwnedPart, const N: usize> super::PartsPending<'q, P, N> {
    /// As [`Pending::poll_with`](super::Pending::poll_with).
    ///
    /// # Panics
    /// If polled again after it returned the outcome.
    pub fn poll_with(
        &mut self,
        cx: &mut std::task::Context<'_>,
        wait: impl Fn(&'q QueuePair, &mut std::task::Context<'_>) -> crate::reactor::WaitStep,
    ) -> std::task::Poll<super::PartsOutcome<P, N>> {
        super::wake::poll_ticket(&mut self.ticket, cx, wait).map(|(parts, result)| match result {
            Ok(wc) => Ok(super::PartsDone { parts, wc }),
            Err(error) => Err(super::PartsError { error, parts }),
        })
    }
}

// Awaiting a handle polls its ticket; nothing in it is pinned (no pin projection is ever made),
// so the handles are `Unpin` whatever they hold.
impl<P: crate::part::OwnedPart, const N: usize> Unpin for super::PartsPending<'_, P, N> {}

/// Awaiting a [`PartsPending`](super::PartsPending) (the `tokio` feature) resolves to the
/// same [`PartsOutcome`](super::PartsOutcome) as its `spin`, every part back.
#[cfg(feature = "tokio")]
impl<P: crate::part::OwnedPart, const N: usize> std::future::Future
    for super::PartsPending<'_, P, N>
{
    type Output = super::PartsOutcome<P, N>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.poll_with(cx, super::wake::with_tokio::step)
    }
}
