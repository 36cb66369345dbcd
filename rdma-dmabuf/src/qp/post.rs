//! Posting: the owned posts, the checks every request passes, and the verbs calls.

use super::pending::{Pending, WorkError};
use super::QueuePair;
use crate::error::{Error, Op, Result};
use crate::mr::{Access, Backing, MemoryRegion};
use crate::part::Local;
use crate::remote::RemoteRegion;
use crate::slots::wr_id;
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
    pub fn post_read<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        self.post(WorkKind::Read, local.into(), Some(remote), None)
    }

    fn post<B: Backing>(
        &self,
        kind: WorkKind,
        local: Local<B>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        let r = local.region();
        let posted = self
            .check(kind, r, local.range(), remote)
            .and_then(|(offset, len)| {
                // SAFETY: `check` put the part inside `r`, a region of this QP's PD; `r`
                // moves into the returned `Pending` (and, if that is dropped early, into the
                // request's slot, which lives until the QP is destroyed), so it stays
                // registered and out of the CPU's reach until the completion is polled.
                unsafe { self.post_raw(kind, r.addr() + offset, len, r.lkey(), remote, imm) }
            });
        match posted {
            // The region moves into the Pending (or, if that is dropped early, into the
            // slot), so it outlives the request.
            Ok((index, gen)) => Ok(Pending {
                qp: self,
                index,
                gen,
                kind,
                local: Some(local),
            }),
            Err(error) => Err(WorkError {
                error,
                region: local.into_region(),
            }),
        }
    }

    /// Checks a request on `range` of `region` against the region, the queue pair and the
    /// verb; returns the checked offset and length to post.
    pub(crate) fn check<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
    ) -> Result<(u64, u32)> {
        let op = post_op(kind);
        let refuse = |what: String| Err(Error::invalid(op, what));
        if self.is_in_error() {
            return refuse(format!(
                "{kind} on qp {:#x}, which is in the error state (flushed, or a request \
                 failed): it takes no more requests; connect a new one",
                self.local.qpn
            ));
        }
        let region_len = region.len();
        let Range { start, end } = range;
        if end <= start {
            return refuse(format!(
                "{kind} of {start}..{end}: an empty range (length 0) or a reversed one"
            ));
        }
        if end > region_len {
            return refuse(format!(
                "{kind} of {start}..{end} outside the region's {region_len} bytes"
            ));
        }
        let Ok(len) = u32::try_from(end - start) else {
            return refuse(format!(
                "{kind} of {start}..{end}: {} bytes, past the 4 GiB - 1 one request carries",
                end - start
            ));
        };
        if matches!(kind, WorkKind::Recv | WorkKind::Read)
            && !region.access().contains(Access::LOCAL_WRITE)
        {
            return refuse(format!("{kind} into a region without LOCAL_WRITE access"));
        }
        if !Arc::ptr_eq(region.pd(), &self.raw.pd) {
            return refuse("the region belongs to another protection domain".into());
        }
        if let Some(r) = remote {
            if r.len < u64::from(len) {
                return refuse(format!(
                    "{kind} of {len} bytes to a remote region of {}",
                    r.len
                ));
            }
        }
        Ok((start, len))
    }

    /// Takes a slot and posts one work request with one SGE; returns the slot.
    ///
    /// # Safety
    /// `addr..addr + len` lies in a region of this queue pair's protection domain registered
    /// with `lkey`, and that memory stays registered, allocated and untouched by the CPU
    /// (for what the NIC writes) until the request's completion has been polled: the owned
    /// layer moves the region into the `Pending` (or its slot), the scoped layer borrows it
    /// for a scope that drains before the borrow ends.
    unsafe fn post_raw(
        &self,
        kind: WorkKind,
        addr: u64,
        len: u32,
        lkey: u32,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let (index, gen) = self.slots.borrow_mut().acquire(kind)?;
        let mut sge = ffi::ibv_sge {
            addr,
            length: len,
            lkey,
        };
        let id = wr_id(index, gen);
        let rc = if kind == WorkKind::Recv {
            let mut wr = ffi::ibv_recv_wr {
                wr_id: id,
                next: std::ptr::null_mut(),
                sg_list: &mut sge,
                num_sge: 1,
            };
            let mut bad = std::ptr::null_mut();
            // SAFETY: live QP; `wr` and `sge` are valid for the call (the provider copies
            // them); the SGE's memory outlives the request (this function's contract).
            unsafe { ffi::ibv_post_recv(self.raw.as_ptr(), &mut wr, &mut bad) }
        } else {
            // SAFETY: ibv_send_wr is a plain C struct (unions of integers and pointers); zero
            // is valid.
            let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = id;
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
            wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
            wr.opcode = match (kind, imm) {
                (WorkKind::Send, None) => ffi::ibv_wr_opcode::IBV_WR_SEND,
                (WorkKind::Send, Some(_)) => ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM,
                (WorkKind::Write, None) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                (WorkKind::Write, Some(_)) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
                _ => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
            };
            if let Some(v) = imm {
                wr.imm_data_invalidated_rkey_union.imm_data = v.to_be();
            }
            if let Some(r) = remote {
                wr.wr.rdma = ffi::rdma_t {
                    remote_addr: r.addr,
                    rkey: r.rkey,
                };
            }
            let mut bad = std::ptr::null_mut();
            // SAFETY: live QP; `wr` and `sge` are valid for the call (the provider copies
            // them); the SGE's memory outlives the request (this function's contract). The
            // remote address and rkey need no trust: the peer's NIC checks them against its
            // registrations and fails the request otherwise.
            unsafe { ffi::ibv_post_send(self.raw.as_ptr(), &mut wr, &mut bad) }
        };
        if rc != 0 {
            self.slots.borrow_mut().cancel(index);
            return Err(Error::from_errno(
                post_op(kind),
                format!("{} qp {:#x}", self.raw.pd.context().name(), self.local.qpn),
                rc,
            ));
        }
        Ok((index, gen))
    }

    /// Posts a request on part of a region the caller only borrows; returns its slot.
    ///
    /// # Safety
    /// `region` stays alive (registered) and, for what the NIC writes, unread and unwritten
    /// by the CPU until the request's completion has been polled from this queue pair (the
    /// scoped layer: the borrow lasts for the scope, whose end drains every request).
    pub(crate) unsafe fn post_borrowed<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        range: Range<u64>,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        let (offset, len) = self.check(kind, region, range, remote)?;
        // SAFETY: `check` put the part inside `region`, a region of this QP's PD; the caller
        // keeps it registered and out of the CPU's reach until the completion (our contract).
        unsafe {
            self.post_raw(
                kind,
                region.addr() + offset,
                len,
                region.lkey(),
                remote,
                imm,
            )
        }
    }
}

/// The verb a request of `kind` is posted with, as errors name it.
fn post_op(kind: WorkKind) -> Op {
    match kind {
        WorkKind::Recv => Op::PostRecv,
        _ => Op::PostSend,
    }
}
