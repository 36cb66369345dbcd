//! The extended send verbs of a queue pair (`ibv_qp_to_qp_ex`, `ibv_wr_start`,
//! `ibv_wr_rdma_write`, `ibv_wr_set_sge`, `ibv_wr_complete`, `ibv_wr_abort`): a chain of
//! writes built in the provider's send queue by function calls, without the `ibv_send_wr`
//! structs `ibv_post_send` converts and copies.
//!
//! A queue pair has them only when it was created with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`
//! naming `IBV_QP_EX_WITH_RDMA_WRITE` and the provider took that (`sys::qp` asks, and falls
//! back to a plain queue pair when refused). Per `ibv_wr_post(3)`, chains posted this way
//! and through `ibv_post_send` may interleave on one queue pair so long as neither is
//! posted inside the other's `ibv_wr_start` .. `ibv_wr_complete`/`ibv_wr_abort` section:
//! a [`WrChain`] borrows its queue pair's [`WrOps`] for that section and posts nothing else.

use rdma_sys as ffi;
use std::os::raw::c_int;
use std::ptr::NonNull;

type Start = unsafe extern "C" fn(*mut ffi::ibv_qp_ex);
type RdmaWrite = unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64);
type SetSge = unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32);
type Complete = unsafe extern "C" fn(*mut ffi::ibv_qp_ex) -> c_int;

/// The provider's extended send entry points of one queue pair, read once at creation.
pub(crate) struct WrOps {
    qpx: NonNull<ffi::ibv_qp_ex>,
    start: Start,
    rdma_write: RdmaWrite,
    set_sge: SetSge,
    complete: Complete,
    abort: Start,
    /// Whether a section is open: checked in debug builds only (the contract of
    /// [`WrOps::start`] keeps sections apart; this catches a broken caller in tests).
    #[cfg(debug_assertions)]
    open: std::cell::Cell<bool>,
}

impl WrOps {
    /// The extended send entry points of `qp`, or `None` when the provider did not fill
    /// every one a chain of writes uses.
    ///
    /// # Safety
    /// `qp` is a live queue pair created by `ibv_create_qp_ex` (or `rdma_create_qp_ex`)
    /// with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS` naming `IBV_QP_EX_WITH_RDMA_WRITE`; the
    /// result is used only while it lives (its owner, `sys::qp::RawQp`, holds both).
    pub(crate) unsafe fn of(qp: NonNull<ffi::ibv_qp>) -> Option<WrOps> {
        // SAFETY: a live QP (this function's contract); libibverbs returns its `ibv_qp_ex`
        // when it was created through the extended call, else null.
        let qpx = NonNull::new(unsafe { ffi::ibv_qp_to_qp_ex(qp.as_ptr()) })?;
        // SAFETY: `qpx` points into the live QP's provider struct; the entry points are
        // plain fields the provider set at creation and never changes.
        let q = unsafe { qpx.as_ref() };
        Some(WrOps {
            qpx,
            start: q.wr_start?,
            rdma_write: q.wr_rdma_write?,
            set_sge: q.wr_set_sge?,
            complete: q.wr_complete?,
            abort: q.wr_abort?,
            #[cfg(debug_assertions)]
            open: std::cell::Cell::new(false),
        })
    }

    /// Opens the queue pair's send section (`ibv_wr_start`: the provider takes the send
    /// queue's lock): the writes of the chain are added to it, and it ends posted
    /// ([`WrChain::complete`]) or discarded (dropped).
    ///
    /// # Safety
    /// Until the returned chain ends, nothing else posts to this queue pair: no other
    /// chain, and no `ibv_post_send` (a request posted inside the section would be mixed
    /// into the provider's half-built chain; on rxe the thread would also spin forever on
    /// the send queue's lock). The crate's queue pairs are `!Sync`, and a chain is opened
    /// and ended inside one call that posts nothing else.
    #[inline]
    pub(crate) unsafe fn start(&self) -> WrChain<'_> {
        #[cfg(debug_assertions)]
        assert!(
            !self.open.replace(true),
            "a second send section opened inside one"
        );
        // SAFETY: a live `ibv_qp_ex` with its provider's entry point (`of`); no other
        // section of this queue pair is open (this function's contract).
        unsafe { (self.start)(self.qpx.as_ptr()) };
        WrChain { ops: self }
    }
}

/// An open send section of one queue pair: writes added by [`WrChain::write`], posted
/// together by [`WrChain::complete`]; dropped before that, it is discarded
/// (`ibv_wr_abort`) and the NIC sees none of it.
pub(crate) struct WrChain<'a> {
    ops: &'a WrOps,
}

impl WrChain<'_> {
    /// Adds an `IBV_WR_RDMA_WRITE` of `sge` to `raddr` under `rkey`, completed under
    /// `wr_id` if it fails or if `flags` asks for a completion (`IBV_SEND_SIGNALED`).
    ///
    /// # Safety
    /// As `RawQp::post_send` for the one request: `sge` lies inside a region registered in
    /// this queue pair's PD, with its lkey, and that memory stays registered and out of the
    /// CPU's reach until this request's completion (or a later one's, if unsignalled) is
    /// polled or the queue pair is destroyed, unless the chain is discarded by dropping it.
    /// A chain whose [`WrChain::complete`] failed counts as posted (see there), unless the
    /// caller knows why its provider fails and that it queued nothing.
    #[inline]
    pub(crate) unsafe fn write(
        &mut self,
        wr_id: u64,
        flags: u32,
        rkey: u32,
        raddr: u64,
        sge: &ffi::ibv_sge,
    ) {
        let qpx = self.ops.qpx.as_ptr();
        // SAFETY: inside this chain's section of a live `ibv_qp_ex` (`WrOps::start`), which
        // only this thread touches until the section ends; `wr_id` and `wr_flags` are plain
        // data the builder reads for the request it adds.
        unsafe { (*qpx).wr_id = wr_id };
        // SAFETY: as above.
        unsafe { (*qpx).wr_flags = flags };
        // SAFETY: the provider's builder for a write, in the open section; it records what
        // it cannot take (a full queue) for `ibv_wr_complete` to report.
        unsafe { (self.ops.rdma_write)(qpx, rkey, raddr) };
        // SAFETY: the data of the write just built; the memory it names is the caller's to
        // keep (this function's contract).
        unsafe { (self.ops.set_sge)(qpx, sge.lkey, sge.addr, sge.length) };
    }

    /// Posts the chain (`ibv_wr_complete`).
    ///
    /// # Errors
    /// The provider's errno. `ibv_wr_post(3)` says the whole chain is then discarded, but
    /// a provider may have queued it before its doorbell failed (rxe stores the producer
    /// index first), so a caller treats the chain as perhaps taken unless it knows why its
    /// provider failed (see [`WrChain::write`]).
    #[inline]
    pub(crate) fn complete(self) -> Result<(), i32> {
        let me = std::mem::ManuallyDrop::new(self);
        #[cfg(debug_assertions)]
        me.ops.open.set(false);
        // SAFETY: ends this chain's section of a live `ibv_qp_ex` once (`Drop` does not
        // run: `me` is never dropped).
        let rc = unsafe { (me.ops.complete)(me.ops.qpx.as_ptr()) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }
}

impl Drop for WrChain<'_> {
    fn drop(&mut self) {
        #[cfg(debug_assertions)]
        self.ops.open.set(false);
        // SAFETY: ends this chain's section of a live `ibv_qp_ex` once, discarding what
        // was added (`complete` consumes the chain without dropping it).
        unsafe { (self.ops.abort)(self.ops.qpx.as_ptr()) };
    }
}
