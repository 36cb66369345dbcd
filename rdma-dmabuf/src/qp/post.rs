//! Posting: the owned posts, the checks every request passes, and the verbs calls.

use super::pending::{Pending, WorkError};
use super::QueuePair;
use crate::error::{Error, Op, Result};
use crate::mr::{Access, Backing, MemoryRegion};
use crate::part::Local;
use crate::remote::RemoteRegion;
use crate::sys::qp_ex::WrOps;
use crate::wr::AtomicOp;
use crate::wr::WorkKind;
use rdma_sys as ffi;
use std::ops::Range;
use std::sync::Arc;

impl QueuePair {
    /// `IBV_WR_SEND` of the local bytes. The peer must have a receive posted (or post one
    /// within the RNR retry window).
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: empty or out-of-range part, queue full, or the
    /// provider's refusal.
    #[inline]
    pub fn post_send<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Send, local.into(), None, imm)
    }

    /// A receive into the local bytes (which need [`Access::LOCAL_WRITE`]).
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and an invalid argument without `LOCAL_WRITE`.
    #[inline]
    pub fn post_recv<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Recv, local.into(), None, None)
    }

    /// `IBV_WR_RDMA_WRITE` (with `imm`: `IBV_WR_RDMA_WRITE_WITH_IMM`, which consumes one of
    /// the peer's receives) of the local bytes to the start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`], and an invalid argument if `remote` is shorter.
    #[inline]
    pub fn post_write<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Write, local.into(), Some(remote), imm)
    }

    /// `IBV_WR_RDMA_READ` of the start of `remote` into the local bytes (which need
    /// [`Access::LOCAL_WRITE`]).
    ///
    /// # Errors
    /// As [`QueuePair::post_write`].
    #[inline]
    pub fn post_read<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Read, local.into(), Some(remote), None)
    }

    #[inline(always)]
    fn post<B: Backing>(
        &self,
        kind: WorkKind,
        local: Local<B>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post_owned(
            Shape::new(kind, remote, imm),
            local,
            |ticket| Pending { ticket },
            |error, local| WorkError {
                error,
                region: local.into_region(),
            },
        )
    }

    /// Checks a request on `range` of `region` against the region, the queue pair and the
    /// verb; returns the checked offset and length to post.
    ///
    /// The checks are plain comparisons on the hot path; only a refused request goes to
    /// [`QueuePair::refusal`], out of line, to find which check failed and say why.
    #[inline]
    pub(crate) fn check<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
    ) -> Result<(u64, u32)> {
        let through_srq = kind == WorkKind::Recv && self.raw.srq().is_some();
        if !self.is_in_error() && !through_srq {
            if let Some(checked) = self.part_accepted(kind, region, &range, remote.as_ref()) {
                return Ok(checked);
            }
        }
        Err(self.refuse(kind, region, range, remote))
    }

    /// The checks of [`QueuePair::check`] on the part alone (its range in the region, the
    /// access the verb needs, the protection domain, the remote's room), not the queue
    /// pair's state: plain comparisons, the checked offset and length when every one
    /// passes. For a batch, which tests the queue pair once and each part with this.
    #[inline(always)]
    fn part_accepted<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: &Range<u64>,
        remote: Option<&RemoteRegion>,
    ) -> Option<(u64, u32)> {
        let Range { start, end } = *range;
        let len = end.wrapping_sub(start);
        let accepted = end > start
            && end <= region.len()
            && len <= u64::from(u32::MAX)
            && (!kind.writes_local() || region.access().contains(Access::LOCAL_WRITE))
            && Arc::ptr_eq(region.pd(), self.raw.pd())
            && remote.is_none_or(|r| r.holds(len));
        // At most u32::MAX (checked above).
        accepted.then_some((start, len as u32))
    }

    /// Why [`QueuePair::check`] refuses a request (out of line: only a refused request
    /// gets here).
    #[cold]
    #[inline(never)]
    fn refuse<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
    ) -> Error {
        self.refusal(
            kind,
            Facts {
                region_len: region.len(),
                writable: region.access().contains(Access::LOCAL_WRITE),
                same_pd: Arc::ptr_eq(region.pd(), self.raw.pd()),
            },
            range,
            remote,
        )
    }

    /// Why [`QueuePair::check`] refused a request: the first check it fails, in words.
    #[cold]
    #[inline(never)]
    fn refusal(
        &self,
        kind: WorkKind,
        region: Facts,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
    ) -> Error {
        let op = post_op(kind);
        let refuse = |what: String| Error::invalid(op, what);
        let Range { start, end } = range;
        if self.is_in_error() {
            return refuse(format!(
                "{kind} on qp {:#x}, which is in the error state (flushed, or a request \
                 failed): it takes no more requests; connect a new one",
                self.local.qpn
            ));
        }
        if kind == WorkKind::Recv && self.raw.srq().is_some() {
            return refuse(format!(
                "receive on qp {:#x}, which receives through a shared receive queue: post it \
                 there (SharedReceiveQueue::post_recv)",
                self.local.qpn
            ));
        }
        if end <= start {
            return refuse(format!(
                "{kind} of {start}..{end}: an empty range (length 0) or a reversed one"
            ));
        }
        if end > region.region_len {
            return refuse(format!(
                "{kind} of {start}..{end} outside the region's {} bytes",
                region.region_len
            ));
        }
        let Ok(len) = u32::try_from(end - start) else {
            return refuse(format!(
                "{kind} of {start}..{end}: {} bytes, past the 4 GiB - 1 one request carries",
                end - start
            ));
        };
        if kind.writes_local() && !region.writable {
            return refuse(format!("{kind} into a region without LOCAL_WRITE access"));
        }
        if !region.same_pd {
            return refuse("the region belongs to another protection domain".into());
        }
        match remote {
            Some(r) if !r.holds(u64::from(len)) => refuse(r.refusal(kind, u64::from(len))),
            // Unreachable while `check` and this function test the same things.
            _ => refuse(format!("{kind} of {start}..{end} refused")),
        }
    }
}

impl QueuePair {
    /// The error of a post the provider refused with `rc` (`ibv_post_send`,
    /// `ibv_post_recv` or `ibv_wr_complete`), naming the device and the queue pair.
    #[cold]
    pub(super) fn post_error(&self, op: Op, rc: i32) -> Error {
        Error::from_errno(
            op,
            format!(
                "{} qp {:#x}",
                self.raw.pd().context().name(),
                self.local.qpn
            ),
            rc,
        )
    }
}

/// What [`QueuePair::refusal`] needs to know of the region a refused request was on.
struct Facts {
    region_len: u64,
    writable: bool,
    same_pd: bool,
}

/// The verb a request of `kind` is posted with, as errors name it.
pub(super) fn post_op(kind: WorkKind) -> Op {
    match kind {
        WorkKind::Recv => Op::PostRecv,
        _ => Op::PostSend,
    }
}

/// An SGE the post path may trust: made only by [`QueuePair::checked_sge`] (bytes inside a
/// region of this queue pair's PD, with its lkey, after every check of `check`), by
/// [`QueuePair::checked_part_sge`] (the same checks but the queue pair's state, which a
/// batch tests once for all its parts) or by [`Sge::inline`] (bytes the provider copies at
/// post time). A [`Request`] takes only these, so no unchecked range reaches `post_raw`. Laid out as `ibv_sge` (`repr(transparent)`), so
/// a slice of them is the SGE list the verbs take.
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct Sge(ffi::ibv_sge);

impl Sge {
    /// Zero bytes: a placeholder for arrays filled with checked SGEs before use.
    pub(super) const EMPTY: Sge = Sge(ffi::ibv_sge {
        addr: 0,
        length: 0,
        lkey: 0,
    });

    /// `data` for an inline request (`IBV_SEND_INLINE`), which the provider copies into the
    /// work request before `ibv_post_send` returns; valid only for [`Request::inline`].
    pub(super) fn inline(data: &[u8]) -> Sge {
        Sge(ffi::ibv_sge {
            addr: data.as_ptr() as u64,
            // At most max_inline (a u32), checked by the inline posts.
            length: data.len() as u32,
            lkey: 0,
        })
    }

    /// The SGE's length in bytes.
    pub(super) fn len(&self) -> u32 {
        self.0.length
    }

    /// The SGE as the verbs take it.
    #[inline(always)]
    pub(super) fn raw(&self) -> &ffi::ibv_sge {
        &self.0
    }
}

impl QueuePair {
    /// [`QueuePair::check`], then the SGE of the checked bytes of `region`: the only way to
    /// an SGE of a region.
    #[inline]
    pub(crate) fn checked_sge<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
    ) -> Result<Sge> {
        let (offset, len) = self.check(kind, region, range, remote)?;
        Ok(Sge::of(region, offset, len))
    }

    /// The SGE of `range` of `region` if it passes the checks on the part alone
    /// ([`QueuePair::check`]'s but the queue pair's state: the caller tests
    /// [`QueuePair::is_in_error`] first); `None` otherwise, when [`QueuePair::checked_sge`]
    /// says why.
    #[inline(always)]
    pub(super) fn checked_part_sge<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: &Range<u64>,
        remote: Option<&RemoteRegion>,
    ) -> Option<Sge> {
        let (offset, len) = self.part_accepted(kind, region, range, remote)?;
        Some(Sge::of(region, offset, len))
    }
}

impl Sge {
    /// The SGE of `len` bytes at `offset` in `region`, which the caller has checked (the
    /// two constructors above).
    #[inline(always)]
    fn of<B: Backing>(region: &MemoryRegion<B>, offset: u64, len: u32) -> Sge {
        Sge(ffi::ibv_sge {
            addr: region.addr() + offset,
            length: len,
            lkey: region.lkey(),
        })
    }
}

/// The shape of a request besides what it lends: its verb, remote region, immediate data
/// and atomic operation.
#[derive(Clone, Copy)]
pub(super) struct Shape {
    pub kind: WorkKind,
    pub remote: Option<RemoteRegion>,
    pub imm: Option<u32>,
    pub atomic: Option<AtomicOp>,
}

impl Shape {
    /// A request of `kind` to `remote` (with `imm`), not an atomic.
    #[inline(always)]
    pub fn new(kind: WorkKind, remote: Option<RemoteRegion>, imm: Option<u32>) -> Shape {
        Shape {
            kind,
            remote,
            imm,
            atomic: None,
        }
    }
}

/// One work request as the verbs take it, before it has a slot.
pub(super) struct Request<'s> {
    pub kind: WorkKind,
    /// The parts, in order (one for most requests; never empty).
    pub sges: &'s [Sge],
    pub remote: Option<RemoteRegion>,
    pub imm: Option<u32>,
    pub atomic: Option<AtomicOp>,
    pub inline: bool,
}

impl<'s> Request<'s> {
    /// The bytes it posts: its parts' lengths together (saturating; the posts' checks keep
    /// a request under 4 GiB).
    #[inline(always)]
    pub fn len(&self) -> u32 {
        self.sges
            .iter()
            .fold(0u32, |sum, sge| sum.saturating_add(sge.len()))
    }

    /// A request on the parts `sges` (checked SGEs: see [`Sge`]).
    pub fn new(
        kind: WorkKind,
        sges: &'s [Sge],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Request<'s> {
        Request {
            kind,
            sges,
            remote,
            imm,
            atomic: None,
            inline: false,
        }
    }

    /// The request's one part and remote region, with the queue pair's extended send verbs,
    /// when it is a plain RDMA write (one part, no immediate data, not inline) and the queue
    /// pair has them: the single writes posted through `ibv_wr_*`.
    #[inline(always)]
    pub(super) fn single_write<'o>(
        &self,
        ops: Option<&'o WrOps>,
    ) -> Option<(&'o WrOps, &'s Sge, RemoteRegion)> {
        if self.kind != WorkKind::Write || self.imm.is_some() || self.inline {
            return None;
        }
        match (ops, self.sges, self.remote) {
            (Some(ops), [sge], Some(remote)) => Some((ops, sge, remote)),
            _ => None,
        }
    }

    /// An inline request on `sges` (made by [`Sge::inline`]).
    pub fn inline(
        kind: WorkKind,
        sges: &'s [Sge],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Request<'s> {
        Request {
            inline: true,
            ..Request::new(kind, sges, remote, imm)
        }
    }

    /// The send-queue work request, its SGE list pointing to `self.sges`.
    #[inline(always)]
    pub(super) fn send_wr(&self, id: u64, num_sge: i32) -> ffi::ibv_send_wr {
        // SAFETY: ibv_send_wr is a plain C struct (unions of integers and pointers); zero is
        // valid.
        let mut wr: ffi::ibv_send_wr = crate::sys::zeroed();
        wr.wr_id = id;
        // The provider only reads the list (ibv_post_send copies what it needs); `Sge` is
        // laid out as `ibv_sge` (repr(transparent)).
        wr.sg_list = self.sges.as_ptr().cast::<ffi::ibv_sge>().cast_mut();
        wr.num_sge = num_sge;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        if self.inline {
            wr.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        use ffi::ibv_wr_opcode as W;
        wr.opcode = match (self.kind, self.imm) {
            (WorkKind::Send, None) => W::IBV_WR_SEND,
            (WorkKind::Send, Some(_)) => W::IBV_WR_SEND_WITH_IMM,
            (WorkKind::Write, None) => W::IBV_WR_RDMA_WRITE,
            (WorkKind::Write, Some(_)) => W::IBV_WR_RDMA_WRITE_WITH_IMM,
            (WorkKind::FetchAdd, _) => W::IBV_WR_ATOMIC_FETCH_AND_ADD,
            (WorkKind::CompareSwap, _) => W::IBV_WR_ATOMIC_CMP_AND_SWP,
            (WorkKind::Read, _) => W::IBV_WR_RDMA_READ,
            // Exhaustive on purpose: a new kind must fail to compile here, not post a read.
            // `post_raw` sends receives to `recv_wr`; one here is refused by the provider
            // (an invalid opcode), never posted as something else.
            (WorkKind::Recv, _) => W::Type::MAX,
        };
        if let Some(v) = self.imm {
            wr.imm_data_invalidated_rkey_union.imm_data = v.to_be();
        }
        match (self.atomic, self.remote) {
            (Some(op), Some(r)) => {
                let (compare_add, swap) = match op {
                    AtomicOp::FetchAdd { add } => (add, 0),
                    AtomicOp::CompareSwap { compare, swap } => (compare, swap),
                };
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr: r.addr,
                    compare_add,
                    swap,
                    rkey: r.rkey,
                };
            }
            (None, Some(r)) => {
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                };
            }
            _ => {}
        }
        wr
    }
}
