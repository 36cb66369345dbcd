//! Posting: the parts of regions a request reads or writes, the checks every request
//! passes, and the verbs calls.

use super::pending::{Pending, WorkError};
use super::QueuePair;
use crate::error::{Error, Op, Result};
use crate::mr::{Access, Backing, MemoryRegion};
use crate::remote::RemoteRegion;
use crate::slots::wr_id;
use crate::wr::WorkKind;
use rdma_sys as ffi;
use std::sync::Arc;

/// Part of a region to post: `[offset, offset + len)` of `region`.
#[derive(Debug)]
pub struct Local<B: Backing> {
    pub(super) region: MemoryRegion<B>,
    pub(super) offset: u64,
    pub(super) len: u64,
}

impl<B: Backing> Local<B> {
    /// `len` bytes of `region` from `offset` (checked when posted).
    pub fn new(region: MemoryRegion<B>, offset: u64, len: u64) -> Local<B> {
        Local {
            region,
            offset,
            len,
        }
    }

    /// The region back.
    pub fn into_region(self) -> MemoryRegion<B> {
        self.region
    }

    /// The region.
    pub fn region(&self) -> &MemoryRegion<B> {
        &self.region
    }
}

impl<B: Backing> From<MemoryRegion<B>> for Local<B> {
    fn from(region: MemoryRegion<B>) -> Local<B> {
        let len = region.len();
        Local {
            region,
            offset: 0,
            len,
        }
    }
}

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
        let r = &local.region;
        let posted = self
            .check(kind, r, local.offset, local.len, remote)
            .and_then(|()| {
                // SAFETY: `check` put the part inside `r`, a region of this QP's PD; `r`
                // moves into the returned `Pending` (and, if that is dropped early, into the
                // request's slot, which lives until the QP is destroyed), so it stays
                // registered and out of the CPU's reach until the completion is polled.
                unsafe {
                    self.post_raw(
                        kind,
                        r.addr() + local.offset,
                        local.len as u32,
                        r.lkey(),
                        remote,
                        imm,
                    )
                }
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
                region: local.region,
            }),
        }
    }

    /// Checks a request against the region, the queue pair and the verb.
    pub(crate) fn check<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        offset: u64,
        len: u64,
        remote: Option<RemoteRegion>,
    ) -> Result<()> {
        let op = if kind == WorkKind::Recv {
            Op::PostRecv
        } else {
            Op::PostSend
        };
        let refuse = |what: String| Err(Error::invalid(op, what));
        let region_len = region.len();
        if len == 0 {
            return refuse(format!("{kind} of length 0"));
        }
        if len > u64::from(u32::MAX) || offset.checked_add(len).is_none_or(|e| e > region_len) {
            return refuse(format!(
                "{kind} of {offset}+{len} outside the region's {region_len} bytes"
            ));
        }
        if matches!(kind, WorkKind::Recv | WorkKind::Read)
            && !region.access().contains(Access::LOCAL_WRITE)
        {
            return refuse(format!("{kind} into a region without LOCAL_WRITE access"));
        }
        if !Arc::ptr_eq(region.pd(), &self.raw.pd) {
            return refuse("the region belongs to another protection domain".into());
        }
        if let Some(r) = remote {
            if r.len < len {
                return refuse(format!(
                    "{kind} of {len} bytes to a remote region of {}",
                    r.len
                ));
            }
        }
        Ok(())
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
            let op = if kind == WorkKind::Recv {
                Op::PostRecv
            } else {
                Op::PostSend
            };
            return Err(Error::from_errno(
                op,
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
        offset: u64,
        len: u64,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        self.check(kind, region, offset, len, remote)?;
        // SAFETY: `check` put the part inside `region`, a region of this QP's PD; the caller
        // keeps it registered and out of the CPU's reach until the completion (our contract).
        unsafe {
            self.post_raw(
                kind,
                region.addr() + offset,
                len as u32,
                region.lkey(),
                remote,
                imm,
            )
        }
    }
}
