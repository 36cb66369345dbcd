//! Batched writes: `k` owned writes of which only the last is signalled, all `k` parts handed
//! back by that one completion.
//!
//! Sound because a send queue completes in order: an RC queue pair reports the last request's
//! completion only after every earlier request on its send queue has completed (acknowledged
//! by the peer, or failed or flushed, each of those with a completion of its own, which the
//! completion queue delivers first). So when the last write's completion is polled, the NIC is
//! done with every part of the batch. The parts travel as one array inside one handle, which
//! gives them back only with that completion.

use super::parts::PartsPending;
use super::post::Sge;
use super::ticket::Ticket;
use super::QueuePair;
use crate::error::{Error, Op};
use crate::part::{sealed::TOKEN, OwnedPart};
use crate::remote::RemoteRegion;
use crate::slots::{wr_id, MEMBER};
use crate::sys::qp_ex::WrOps;
use crate::wr::WorkKind;
use rdma_sys as ffi;
use std::fmt;

/// A batch that was refused: the error, and the parts back when the NIC has none of them.
#[derive(Debug)]
pub struct BatchError<P, const K: usize> {
    /// What went wrong.
    pub error: Error,
    /// The parts, in the order given, back with the CPU; `None` only when the provider may
    /// have taken part of the batch: it took part of an `ibv_post_send` chain and refused
    /// the rest, or `ibv_wr_complete` failed (never seen: every check a provider makes is
    /// made first). The queue pair is then moved to the error state and keeps the parts until it
    /// is destroyed, since requests it accepted may still read them and nothing would tell
    /// when they stop.
    pub parts: Option<[P; K]>,
}

impl<P, const K: usize> fmt::Display for BatchError<P, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<P: fmt::Debug, const K: usize> std::error::Error for BatchError<P, K> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// The error of a refused batch, its parts dropped.
impl<P, const K: usize> From<BatchError<P, K>> for Error {
    fn from(e: BatchError<P, K>) -> Error {
        e.error
    }
}

/// The most writes one batch may hold. The batch's work requests, SGEs and parts live on the
/// caller's stack (nothing is allocated), so `K` is bounded at compile time: 256 writes take
/// some tens of KiB, well within a default 2 MiB thread stack, and amortise the completion as
/// well as perftest's one in a hundred. A larger `K` does not compile (checked when the
/// function is instantiated).
pub const MAX_BATCH: usize = 256;

impl QueuePair {
    /// `K` `IBV_WR_RDMA_WRITE`s, part `j` to the start of `remotes[j]`, posted in one call,
    /// of which only the last asks for a completion: one completion for `K` writes, as
    /// perftest signals one write in a hundred. All `K` parts come back together with it
    /// ([`PartsPending::spin`], or awaited); its `wc` is the last write's. If any write
    /// fails, the batch ends with the first failure's status, once the queue pair has
    /// flushed every later write (the last one's flush completion comes after them all).
    ///
    /// The batch holds `K` entries of the send queue (unsignalled requests stay there until
    /// a later signalled one completes), so `K` is at most
    /// [`QueuePairBuilder::send_depth`](crate::QueuePairBuilder::send_depth), less what is
    /// in flight, and at most [`MAX_BATCH`] (a larger `K` does not compile). Nothing is
    /// allocated: the work requests are built in the provider's send queue through the
    /// extended send verbs where the queue pair has them
    /// ([`QueuePair::extended_verbs`]), else in a stack array for `ibv_post_send`.
    ///
    /// # Errors
    /// A [`BatchError`] with every part back: `K` of 0, a part that fails the checks of
    /// [`QueuePair::post_write`], fewer than `K` free send-queue entries, or (through
    /// `ibv_post_send`) the provider's refusal of the first write. With `parts: None`, the
    /// queue pair has moved to the error state and keeps the parts until it is destroyed:
    /// `ibv_post_send` took part of the chain and refused the rest, or (through the extended
    /// send verbs) `ibv_wr_complete` failed. Neither has been seen: every check a provider
    /// makes is made first.
    #[allow(unsafe_code)] // gives a refused batch's slot back; see the SAFETY comment
    pub fn post_write_batch<P: OwnedPart, const K: usize>(
        &self,
        parts: [P; K],
        remotes: [RemoteRegion; K],
    ) -> std::result::Result<PartsPending<'_, P, K>, BatchError<P, K>> {
        const { assert!(K <= MAX_BATCH, "a batch holds at most MAX_BATCH writes") };
        let weight = match u32::try_from(K) {
            Ok(w) if w > 0 => w,
            _ => {
                let error = Error::invalid(Op::PostSend, format!("a batch of {K} writes"));
                return Err(BatchError {
                    error,
                    parts: Some(parts),
                });
            }
        };
        // The queue pair's state first, as for one write, and before the queue's room: a
        // queue pair in the error state says so, not that its queue is full (a batch
        // stranded there never gives its entries back).
        if self.is_in_error() {
            if let (Some(part), Some(remote)) = (parts.first(), remotes.first()) {
                return Err(BatchError {
                    error: self.batch_refusal(0, part, remote),
                    parts: Some(parts),
                });
            }
        }
        // Then the slot (a refused part gives it back below), so that one pass checks every
        // part with plain comparisons and builds its work request. The batch's completion
        // is its last write's, and says that write's length (the pass refuses a part of
        // 4 GiB or more, so the clamp never shows).
        let last_len = parts.last().map_or(0, |part| {
            let range = part.lent(TOKEN).1;
            u32::try_from(range.end.saturating_sub(range.start)).unwrap_or(u32::MAX)
        });
        let slot = self
            .slots
            .borrow_mut()
            .acquire_n(WorkKind::Write, weight, last_len);
        let (index, gen) = match slot {
            Ok(slot) => slot,
            Err(error) => {
                return Err(BatchError {
                    error,
                    parts: Some(parts),
                })
            }
        };
        let id = wr_id(index, gen);
        let posted = match self.raw.wr_ops() {
            Some(ops) => self.post_chain_extended(ops, &parts, &remotes, id),
            None => self.post_chain(&parts, &remotes, id),
        };
        match posted {
            Ok(()) => Ok(PartsPending {
                ticket: Ticket {
                    qp: self,
                    index,
                    gen,
                    kind: WorkKind::Write,
                    lent: Some(parts),
                },
            }),
            Err(Refused::Untouched(error)) => {
                // SAFETY: nothing of the batch was posted: the provider has none of it.
                unsafe { self.slots.borrow_mut().cancel(index) };
                Err(BatchError {
                    error,
                    parts: Some(parts),
                })
            }
            Err(Refused::PerhapsTaken(error)) => {
                // Part of the chain may have been taken, unsignalled: nothing will say when
                // the NIC is done with it. Stop the queue pair and keep the parts until it
                // is destroyed.
                self.flush();
                self.slots.borrow_mut().strand(index, gen, Box::new(parts));
                Err(BatchError { error, parts: None })
            }
        }
    }

    /// Why part `j` of a batch is refused, in words (`checked_sge`'s, out of line).
    #[cold]
    fn batch_refusal<P: OwnedPart>(&self, j: usize, part: &P, remote: &RemoteRegion) -> Error {
        let (region, range) = part.lent(TOKEN);
        match self.checked_sge(WorkKind::Write, region, range, Some(*remote)) {
            Err(error) => error,
            // Unreachable while both test the same things.
            Ok(_) => Error::invalid(Op::PostSend, format!("write {j} of a batch refused")),
        }
    }

    /// Checks the batch's parts and posts them as one chain of `ibv_send_wr`s through
    /// `ibv_post_send`: each write but the last unsignalled and marked as a member of the
    /// batch under `id` (their completions come only if they fail or are flushed).
    #[allow(unsafe_code)] // posts a chain whose parts the caller keeps; see the SAFETY comments
    #[inline]
    fn post_chain<P: OwnedPart, const K: usize>(
        &self,
        parts: &[P; K],
        remotes: &[RemoteRegion; K],
        id: u64,
    ) -> std::result::Result<(), Refused> {
        let mut sges = [Sge::EMPTY; K];
        let mut wrs: [ffi::ibv_send_wr; K] = [crate::sys::ZERO_SEND_WR; K];
        // Every write of the chain is written through these two pointers, taken once and
        // used alone until the post: each write points to its SGE and the next write.
        // `Sge` is laid out as `ibv_sge` (repr(transparent)); the provider only reads the
        // SGEs.
        let first = wrs.as_mut_ptr();
        let sge_list = sges.as_mut_ptr();
        for (j, (part, remote)) in parts.iter().zip(remotes).enumerate() {
            let (region, range) = part.lent(TOKEN);
            let Some(sge) = self.checked_part_sge(WorkKind::Write, region, &range, Some(remote))
            else {
                return Err(Refused::Untouched(self.batch_refusal(j, part, remote)));
            };
            let sge_at = sge_list.wrapping_add(j);
            // SAFETY: `j < K`: an element of `sges`, which nothing else borrows until the
            // post below.
            unsafe { sge_at.write(sge) };
            // SAFETY: `j < K`: an element of `wrs`, which nothing else borrows until the post
            // below (the values written are plain numbers and pointers into `wrs` and `sges`,
            // which stay where they are until it returns).
            let wr = unsafe { &mut *first.wrapping_add(j) };
            wr.wr_id = id | MEMBER;
            wr.next = first.wrapping_add(j + 1);
            wr.sg_list = sge_at.cast::<ffi::ibv_sge>();
            wr.num_sge = 1;
            wr.opcode = ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = ffi::rdma_t {
                remote_addr: remote.addr,
                rkey: remote.rkey,
            };
        }
        if let Some(last) = K.checked_sub(1) {
            // SAFETY: as above, `last < K`.
            let wr = unsafe { &mut *first.wrapping_add(last) };
            wr.wr_id = id;
            wr.next = std::ptr::null_mut();
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // SAFETY: the chain of `K` work requests and their SGE lists (`sges`) are
        // valid for the call (the provider copies them); every SGE was checked by
        // `checked_part_sge` to lie in a region of this QP's PD (and the queue pair's state
        // once); the caller keeps the parts in the returned handle (or, if that is dropped
        // early, its slot, which lives until the QP is destroyed), so their memory stays
        // registered and out of the CPU's reach until the last write's completion, which
        // the send queue delivers after every other's; on an error it gives them back only
        // for `Refused::Untouched`.
        // SAFETY: `first` heads the chain in `wrs`, which stays where it is for the call.
        match unsafe { self.raw.post_send(first) } {
            Ok(()) => Ok(()),
            // The provider refused the first request, and so the whole chain.
            Err((rc, bad)) if bad == first => {
                Err(Refused::Untouched(self.post_error(Op::PostSend, rc)))
            }
            Err((rc, _)) => Err(Refused::PerhapsTaken(self.post_error(Op::PostSend, rc))),
        }
    }

    /// As [`QueuePair::post_chain`], through the provider's extended send verbs: each write
    /// is built in the send queue by `ibv_wr_rdma_write` and `ibv_wr_set_sge`, with no work
    /// request structs, and the chain is posted by `ibv_wr_complete` (or discarded by
    /// `ibv_wr_abort` when a part is refused).
    #[allow(unsafe_code)] // posts a chain whose parts the caller keeps; see the SAFETY comments
    #[inline]
    fn post_chain_extended<P: OwnedPart, const K: usize>(
        &self,
        ops: &WrOps,
        parts: &[P; K],
        remotes: &[RemoteRegion; K],
        id: u64,
    ) -> std::result::Result<(), Refused> {
        // SAFETY: nothing else posts to this queue pair until the chain ends: `QueuePair`
        // is `!Sync`, and until `complete` (or the drop that discards the chain) this
        // function calls only the checks of the parts, which post nothing.
        let mut chain = unsafe { ops.start() };
        let last = K - 1; // K > 0: the caller refuses an empty batch.
        for (j, (part, remote)) in parts.iter().zip(remotes).enumerate() {
            let (region, range) = part.lent(TOKEN);
            let Some(sge) = self.checked_part_sge(WorkKind::Write, region, &range, Some(remote))
            else {
                drop(chain); // discarded: the NIC sees none of it
                return Err(Refused::Untouched(self.batch_refusal(j, part, remote)));
            };
            let (wr_id, flags) = if j == last {
                (id, ffi::ibv_send_flags::IBV_SEND_SIGNALED.0)
            } else {
                (id | MEMBER, 0)
            };
            // SAFETY: as in `post_chain`: the SGE was checked by `checked_part_sge` to lie
            // in a region of this QP's PD, and the caller keeps the part until the last
            // write's completion (or the QP's destruction), giving it back on an error only
            // for `Refused::Untouched`.
            unsafe { chain.write(wr_id, flags, remote.rkey, remote.addr, sge.raw()) };
        }
        // `ibv_wr_post(3)` says a failed `ibv_wr_complete` discards the whole chain, but a
        // provider may have queued it first (rxe stores its producer index before ringing
        // the doorbell): treated as perhaps taken.
        chain
            .complete()
            .map_err(|rc| Refused::PerhapsTaken(self.post_error(Op::PostSend, rc)))
    }
}

/// Why a chain was not posted, and whether the NIC may have part of it.
enum Refused {
    /// The provider has none of it: the parts may go back to the caller.
    Untouched(Error),
    /// The provider may have taken part of it, unsignalled.
    PerhapsTaken(Error),
}
