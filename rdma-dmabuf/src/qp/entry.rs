//! The entry points of every post on a queue pair's send and receive queues, one per way of
//! lending memory to the NIC, each the only caller of [`QueuePair::post_raw`] for its way:
//!
//! * [`QueuePair::post_owned`]: what the request names moves into its handle (and, if the
//!   handle is dropped early, into its slot) until the completion: the owned posts of one
//!   part (`post_send`, `post_write`, `post_atomic` and the rest) and of several
//!   (`post_write_parts` and the rest) are shapes over it ([`Lend`]);
//! * [`QueuePair::post_copied`]: inline data, copied by the provider during the call;
//! * [`QueuePair::post_borrowed`]: parts a scope borrows, drained before the borrow ends.
//!
//! Each checks what it lends (ranges inside their regions, the access the verb needs, the
//! protection domain, the number of parts, the remote's room) before anything reaches the
//! provider, and builds the work request from the checked entries alone ([`Sge`]).

use super::post::{Request, Sge};
use super::ticket::Ticket;
use super::QueuePair;
use crate::error::{Error, Result};
use crate::mr::Backing;
use crate::part::{sealed::TOKEN, Local, OwnedPart, Part};
use crate::remote::RemoteRegion;
use crate::wr::{AtomicOp, WorkKind};

/// What an owned post lends the NIC for the time of its request, and its checked entries.
pub(super) trait Lend: Send + 'static {
    /// The checked entries: one per part.
    type Sges: AsRef<[Sge]>;
    /// Every part checked against `qp` for a request of `kind` to `remote`.
    fn checked(
        &self,
        qp: &QueuePair,
        kind: WorkKind,
        remote: Option<RemoteRegion>,
    ) -> Result<Self::Sges>;
}

impl<B: Backing> Lend for Local<B> {
    type Sges = [Sge; 1];
    #[inline(always)]
    fn checked(
        &self,
        qp: &QueuePair,
        kind: WorkKind,
        remote: Option<RemoteRegion>,
    ) -> Result<[Sge; 1]> {
        qp.checked_sge(kind, self.region(), self.range(), remote)
            .map(|sge| [sge])
    }
}

impl<P: OwnedPart, const N: usize> Lend for [P; N] {
    type Sges = [Sge; N];
    fn checked(
        &self,
        qp: &QueuePair,
        kind: WorkKind,
        remote: Option<RemoteRegion>,
    ) -> Result<[Sge; N]> {
        qp.check_parts::<P::Backing, N>(kind, self.iter().map(|p| p.lent(TOKEN)), remote)
    }
}

/// The shape of a request besides what it lends.
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

impl QueuePair {
    /// Posts a request of `shape` on what `lent` lends, moving it into the returned ticket
    /// (whose handle keeps it until the completion, or hands it to the slot if dropped
    /// early); refused or failed to post, the error and `lent` back.
    #[inline(always)]
    #[allow(unsafe_code)] // the owned entry: what the request names moves into its ticket
    pub(super) fn post_owned<L: Lend>(
        &self,
        shape: Shape,
        lent: L,
    ) -> std::result::Result<Ticket<'_, L>, (Error, L)> {
        let posted = lent
            .checked(self, shape.kind, shape.remote)
            .and_then(|sges| {
                let mut req = Request::new(shape.kind, sges.as_ref(), shape.remote, shape.imm);
                req.atomic = shape.atomic;
                // SAFETY: `checked` put every part inside its region, each of this QP's PD
                // and registered with its lkey, and held their number to the QP's grant;
                // `lent` moves into the returned ticket (and, if its handle is dropped early,
                // into the request's slot, which lives until the QP is destroyed), so every
                // region stays registered and out of the CPU's reach until the completion is
                // polled. Owned parts of one region (shards) are disjoint, and a part lent to
                // many requests at once (a `Source`) is never posted where the NIC writes.
                unsafe { self.post_raw(req) }
            });
        match posted {
            Ok((index, gen)) => Ok(Ticket {
                qp: self,
                index,
                gen,
                kind: shape.kind,
                lent: Some(lent),
            }),
            Err(error) => Err((error, lent)),
        }
    }

    /// Posts `data` inline (`IBV_SEND_INLINE`) in a request of `kind` to `remote`; returns
    /// its slot. The caller checked `data` against the queue pair's inline size.
    #[allow(unsafe_code)] // the copied entry: the provider copies the data during the call
    pub(super) fn post_copied(
        &self,
        kind: WorkKind,
        data: &[u8],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let sges = [Sge::inline(data)];
        // SAFETY: an inline request: the provider copies `data` (valid for this call) into
        // the work request before ibv_post_send returns, so the NIC never reads it later and
        // no lkey is needed.
        unsafe { self.post_raw(Request::inline(kind, &sges, remote, imm)) }
    }

    /// Posts a request on parts the caller only borrows; returns its slot.
    ///
    /// # Safety
    /// Every part's region stays alive (registered) and, for what the NIC writes, unread and
    /// unwritten by the CPU until the request's completion has been polled from this queue
    /// pair (the scoped layer: the borrow lasts for the scope, whose end drains every
    /// request).
    #[allow(unsafe_code)] // the borrowed entry: the scope keeps what the request names
    pub(crate) unsafe fn post_borrowed<B: Backing, const N: usize>(
        &self,
        kind: WorkKind,
        parts: &[Part<'_, B>; N],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let sges = if N == 1 {
            // One part: the single post's checks and wording.
            let mut one = [Sge::EMPTY; N];
            one[0] = self.checked_sge(kind, parts[0].region(), parts[0].range(), remote)?;
            one
        } else {
            self.check_parts::<B, N>(kind, parts.iter().map(|p| (p.region(), p.range())), remote)?
        };
        // SAFETY: the checks put every part inside its region, each of this QP's PD, and held
        // their number to the grant; the caller keeps the regions registered and out of the
        // CPU's reach until the completion (our contract).
        unsafe { self.post_raw(Request::new(kind, &sges, remote, imm)) }
    }
}
