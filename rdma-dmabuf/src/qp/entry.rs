//! The entries of the posts on a queue pair's queues, one per way of lending memory to the
//! NIC, and under them the verbs call ([`QueuePair::post_raw`]), which only they reach:
//!
//! * [`QueuePair::post_owned`]: what the request names moves into its handle (and, if the
//!   handle is dropped early, into its slot) until the completion: the owned posts of one
//!   part (`post_send`, `post_write`, `post_atomic` and the rest) and of several
//!   (`post_write_parts` and the rest) are shapes over it ([`Lend`]);
//! * [`QueuePair::post_copied`]: inline data, which the provider copies during the call;
//! * [`QueuePair::post_borrowed`] and [`QueuePair::post_borrowed_parts`]: parts a scope
//!   borrows, drained before the borrow ends.
//!
//! Each checks what it lends (ranges inside their regions, the access the verb needs, the
//! protection domain, the number of parts, the remote's room) before anything reaches the
//! provider, and builds the work request from the checked entries alone ([`Sge`]).
//!
//! The owned entry builds the caller's handle (or its refusal) in place, through the two
//! closures it is given: inlined, it costs what a post written out by hand does, where
//! returning the lent value up through a `Result` cost a write a hundred instructions more.

use super::post::{post_op, Request, Sge, Shape};
use super::ticket::Ticket;
use super::QueuePair;
use crate::error::{Error, Result};
use crate::mr::{Backing, MemoryRegion};
use crate::part::{sealed::TOKEN, Local, OwnedPart, Part};
use crate::remote::RemoteRegion;
use crate::slots::wr_id;
use crate::wr::WorkKind;
use rdma_sys as ffi;
use std::ops::Range;

/// What an owned post lends the NIC for the time of its request, checked into the entries
/// of its work request. Implemented here for one part ([`Local`]) and an array of owned
/// parts, and nowhere else (the trait is the `qp` module's): every entry `checked` returns
/// lies in a region that `self` holds, so moving `self` into the request's ticket keeps
/// that memory registered until the completion, and out of the CPU's reach unless it is
/// [`Lend::SHARED`] (leases many requests read at once, which nothing writes meanwhile).
pub(super) trait Lend: Send + 'static {
    /// The checked entries: one per part.
    type Sges: AsRef<[Sge]>;
    /// Whether other requests may hold the same memory at once: then the NIC must not
    /// write it, and [`QueuePair::post_owned`] refuses it for a receive or a read.
    const SHARED: bool;
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
    const SHARED: bool = false;
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
    const SHARED: bool = P::SHARED;
    #[inline(always)]
    fn checked(
        &self,
        qp: &QueuePair,
        kind: WorkKind,
        remote: Option<RemoteRegion>,
    ) -> Result<[Sge; N]> {
        qp.check_parts::<P::Backing, N>(kind, self.iter().map(|p| p.lent(TOKEN)), remote)
    }
}

/// The refusal of memory lent to many requests at once as the target of a receive or read.
#[cold]
fn shared_refused(kind: WorkKind) -> Error {
    Error::invalid(
        post_op(kind),
        format!("{kind} into a shared source (many requests read it: the NIC must not write it)"),
    )
}

impl QueuePair {
    /// Posts a request of `shape` on what `lent` lends. Posted, `lent` moves into the
    /// request's ticket, which `handle` makes the caller's handle of (the handle keeps it
    /// until the completion, or hands it to the slot if dropped early); refused or failed to
    /// post, `back` makes the caller's error of the error and `lent`.
    #[inline(always)]
    #[allow(unsafe_code)] // the owned entry: what the request names moves into its ticket
    pub(super) fn post_owned<'q, L: Lend, H, E>(
        &'q self,
        shape: Shape,
        lent: L,
        handle: impl FnOnce(Ticket<'q, L>) -> H,
        back: impl FnOnce(Error, L) -> E,
    ) -> std::result::Result<H, E> {
        if L::SHARED && shape.kind.writes_local() {
            // Folded away for every other kind of part: the public posts' `ExclusivePart`
            // bound keeps this from compiling; here it holds whoever calls.
            return Err(back(shared_refused(shape.kind), lent));
        }
        let posted = lent
            .checked(self, shape.kind, shape.remote)
            .and_then(|sges| {
                let mut req = Request::new(shape.kind, sges.as_ref(), shape.remote, shape.imm);
                req.atomic = shape.atomic;
                // SAFETY: `checked` put every part inside its region, each of this QP's PD
                // and named by its lkey, and held their number to the QP's grant (`Lend`);
                // `lent` moves into the ticket below (and, if its handle is dropped early,
                // into the request's slot, which lives until the QP is destroyed), so every
                // region stays registered and out of the CPU's reach until the completion is
                // polled. Owned parts of one region (shards) are disjoint, and a part lent to
                // many requests at once (`Lend::SHARED`, a `Source`) was refused above for a
                // request the NIC writes into.
                unsafe { self.post_raw(req) }
            });
        match posted {
            Ok((index, gen)) => Ok(handle(Ticket {
                qp: self,
                index,
                gen,
                kind: shape.kind,
                lent: Some(lent),
            })),
            Err(error) => Err(back(error, lent)),
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

    /// Posts a request on part of a region the caller only borrows; returns its slot.
    ///
    /// # Safety
    /// `region` stays alive (registered) and, for what the NIC writes, unread and unwritten
    /// by the CPU until the request's completion has been polled from this queue pair (the
    /// scoped layer: the borrow lasts for the scope, whose end drains every request).
    #[inline]
    #[allow(unsafe_code)] // the borrowed entry: the scope keeps what the request names
    pub(crate) unsafe fn post_borrowed<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let sges = [self.checked_sge(kind, region, range, remote)?];
        // SAFETY: `checked_sge` put the part inside `region`, a region of this QP's PD; the
        // caller keeps it registered and out of the CPU's reach until the completion (our
        // contract).
        unsafe { self.post_raw(Request::new(kind, &sges, remote, imm)) }
    }

    /// Posts a request of several parts the caller only borrows; returns its slot.
    ///
    /// # Safety
    /// As [`QueuePair::post_borrowed`], for every part's region.
    #[allow(unsafe_code)] // the borrowed entry: the scope keeps what the request names
    pub(crate) unsafe fn post_borrowed_parts<B: Backing, const N: usize>(
        &self,
        kind: WorkKind,
        parts: &[Part<'_, B>; N],
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let sges =
            self.check_parts::<B, N>(kind, parts.iter().map(|p| (p.region(), p.range())), remote)?;
        // SAFETY: `check_parts` put every part inside its region, each of this QP's PD, and
        // held their number to the grant; the caller keeps the regions registered and out
        // of the CPU's reach until the completion (our contract).
        unsafe { self.post_raw(Request::new(kind, &sges, remote, imm)) }
    }

    /// Takes a slot and posts one work request; returns the slot.
    ///
    /// # Safety
    /// Each SGE's bytes lie in a region of this queue pair's protection domain registered
    /// with its lkey, and that memory stays registered, allocated and untouched by the CPU
    /// (for what the NIC writes) until the request's completion has been polled: the owned
    /// layer moves the regions into the `Pending` (or its slot), the scoped layer borrows them
    /// for a scope that drains before the borrow ends. For an inline request the SGE instead
    /// points to bytes valid for the call only (the provider copies them before it returns).
    /// There are at most as many SGEs as the queue pair was granted for the request's queue
    /// (the provider refuses more, and the request then fails cleanly; the checks of the
    /// `*_parts` posts keep that from happening).
    #[inline(always)]
    #[allow(unsafe_code)] // the post contract: what a work request names stays with the NIC until its completion (see `post_raw`)
    pub(super) unsafe fn post_raw(&self, req: Request<'_>) -> Result<(u32, u32)> {
        let kind = req.kind;
        let (index, gen) = self.slots.borrow_mut().acquire(kind, req.len())?;
        let id = wr_id(index, gen);
        // At most the granted max_sge (a u32 from the provider), so it fits an i32.
        let num_sge = req.sges.len() as i32;
        let posted = if kind == WorkKind::Recv {
            let mut wr = ffi::ibv_recv_wr {
                wr_id: id,
                next: std::ptr::null_mut(),
                // `Sge` is laid out as `ibv_sge` (repr(transparent)).
                sg_list: req.sges.as_ptr().cast::<ffi::ibv_sge>().cast_mut(),
                num_sge,
            };
            // SAFETY: `wr` and the SGE list are valid for the call (the provider copies
            // them, and never writes the list); the SGEs' memory outlives the request (this
            // function's contract).
            unsafe { self.raw.post_recv(&mut wr) }
        } else if let Some((ops, sge, remote)) = req.single_write(self.raw.wr_ops()) {
            // One signalled write through the extended send verbs: built in the send queue
            // by the provider, no `ibv_send_wr` to fill and convert.
            // SAFETY: nothing else posts to this queue pair until the chain ends (`!Sync`,
            // and the section holds only the write below).
            let mut chain = unsafe { ops.start() };
            // SAFETY: as for `post_send` below: the SGE's memory outlives the request (this
            // function's contract).
            unsafe {
                chain.write(
                    id,
                    ffi::ibv_send_flags::IBV_SEND_SIGNALED.0,
                    remote.rkey,
                    remote.addr,
                    sge.raw(),
                )
            };
            // A failure is taken as "not posted", as `ibv_post_send`'s is: see the SAFETY
            // comment of the `cancel` below (rxe also discards a section that hit a full
            // queue, which the slots keep from happening).
            chain.complete()
        } else {
            let mut wr = req.send_wr(id, num_sge);
            // SAFETY: `wr` and the SGE list are valid for the call (the provider copies
            // them, and inline data too, and never writes the list); the SGEs' memory
            // outlives the request (this function's contract). The remote address and rkey
            // need no trust: the peer's NIC checks them against its registrations and fails
            // the request otherwise.
            unsafe { self.raw.post_send(&mut wr) }.map_err(|(rc, _)| rc)
        };
        if let Err(rc) = posted {
            // SAFETY: the provider refused this request (`rc != 0`): the NIC has nothing of
            // it. Providers refuse a request before they queue it (mlx5, hns and efa report
            // it as `bad_wr`); the one step after rxe's user library queues it, the doorbell,
            // fails in the kernel only for a queue pair below RTS (never a `QueuePair`'s
            // state) or destroyed (a removed device's, whose queue never runs again). A
            // provider that queued a request and then failed would break this (a batch, whose
            // provider may take part of a chain, takes such a failure as "perhaps posted").
            unsafe { self.slots.borrow_mut().cancel(index) };
            return Err(self.post_error(post_op(kind), rc));
        }
        Ok((index, gen))
    }
}
