//! Shared receive queues (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_modify_srq`,
//! `ibv_query_srq`, `ibv_destroy_srq`).

use super::cq::CompletionQueue;
use super::pd::ProtectionDomain;
use rdma_sys as ffi;
use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The right to use one [`SrqCore`]'s completion queue (to poll it, arm it, read its
/// channel): made once with the core and kept by the one handle that polls it (the
/// `SharedReceiveQueue`), so that no other path can reach the queue. Neither `Clone` nor
/// `Sync`: one thread at a time holds a reference to it, and so uses the queue. That is what
/// `SrqCore`'s `Sync` rests on (the queue's `Cell`s and its poll area are written by a poll).
pub(crate) struct CqKey {
    /// The number of the core it opens, checked on each use.
    core: u64,
    /// Not `Sync` (a `Cell`'s marker); `Send`, as the handle that holds it.
    _one_thread: PhantomData<Cell<()>>,
}

/// The numbers of the cores, for their keys.
static NEXT_CORE: AtomicU64 = AtomicU64::new(0);

/// The verbs objects of a shared receive queue, shared with the queue pairs that receive
/// through them (each holds an `Arc`, so the SRQ is destroyed after its last queue pair).
pub(crate) struct SrqCore {
    srq: NonNull<ffi::ibv_srq>,
    /// Its number, which its [`CqKey`] carries.
    id: u64,
    /// Every joined queue pair's receive completions, with a completion channel (for
    /// awaited receives). Dropped after the SRQ (Drop below).
    cq: CompletionQueue,
    /// What must outlive the SRQ (a dropped handle's receives still posted: their buffers),
    /// dropped after it is destroyed (field order), when the NIC can no longer fill them.
    orphans: Mutex<Option<Box<dyn Any + Send>>>,
    /// Dropped last: the SRQ lives in this PD.
    pd: Arc<ProtectionDomain>,
    depth: u32,
    max_sge: u32,
}

// SAFETY: libibverbs lets an SRQ be posted to and destroyed from any thread. The CQ (its
// `Cell`s and its poll area, which a poll writes and reads) is reachable only with the core's
// one `CqKey` (`SrqCore::cq`), which is `!Sync` and held by the one `SharedReceiveQueue`
// handle, so it is used by one thread at a time. Queue pairs use only its pointer: at
// creation, and in the provider when one is destroyed (which may clean that queue pair's
// entries out of the CQ from the queue pair's thread, under the provider's own CQ lock: the CQ
// is made by `ibv_create_cq`, never single-threaded, and nothing of ours is touched). The
// last `Arc` may drop on any thread; the CQ's `Drop` then has it alone (`&mut`). `orphans` is
// behind a mutex.
unsafe impl Send for SrqCore {}
// SAFETY: as above: shared references to the core are used only for the raw pointers (at QP
// creation), posts (thread-safe in libibverbs), the CQ with the `!Sync` key, and the mutex.
unsafe impl Sync for SrqCore {}

impl fmt::Debug for SrqCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SrqCore")
            .field("device", &self.pd.context().name())
            .field("depth", &self.depth)
            .finish()
    }
}

impl SrqCore {
    /// `ibv_create_srq` of `depth` receives of one SGE each in `pd`, completing on `cq`'s
    /// queue pairs' behalf (the CQ is kept until after the SRQ is destroyed); with the one
    /// key to `cq` (see [`CqKey`]).
    ///
    /// # Errors
    /// The OS error of the call.
    pub(crate) fn create(
        pd: &Arc<ProtectionDomain>,
        cq: CompletionQueue,
        depth: u32,
    ) -> std::io::Result<(SrqCore, CqKey)> {
        let mut init: ffi::ibv_srq_init_attr = super::zeroed();
        init.attr.max_wr = depth;
        init.attr.max_sge = 1;
        // SAFETY: live PD; `init` is valid for the call.
        let srq = unsafe { ffi::ibv_create_srq(pd.as_ptr(), &mut init) };
        let srq = NonNull::new(srq).ok_or_else(std::io::Error::last_os_error)?;
        let id = NEXT_CORE.fetch_add(1, Ordering::Relaxed);
        let core = SrqCore {
            srq,
            id,
            cq,
            orphans: Mutex::new(None),
            pd: pd.clone(),
            depth,
            max_sge: init.attr.max_sge,
        };
        let key = CqKey {
            core: id,
            _one_thread: PhantomData,
        };
        Ok((core, key))
    }

    /// The raw SRQ and its CQ, for creating a queue pair on them.
    pub(in crate::sys) fn raw(&self) -> (*mut ffi::ibv_srq, *mut ffi::ibv_cq) {
        (self.srq.as_ptr(), self.cq.as_ptr())
    }

    /// The completion queue of every joined queue pair's receives, for the holder of its key.
    ///
    /// # Panics
    /// If `key` is another core's (a bug of this crate: each handle keeps its own core's).
    pub(crate) fn cq(&self, key: &CqKey) -> &CompletionQueue {
        assert_eq!(key.core, self.id, "another shared receive queue's key");
        &self.cq
    }

    /// The protection domain it was created in.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The most receives it holds.
    pub(crate) fn depth(&self) -> u32 {
        self.depth
    }

    /// The SGEs per receive granted.
    pub(crate) fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Keeps `held` until after the SRQ is destroyed.
    pub(crate) fn keep_until_destroyed(&self, held: Box<dyn Any + Send>) {
        let mut orphans = self
            .orphans
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *orphans = Some(held);
    }

    /// `ibv_post_srq_recv` of one receive.
    ///
    /// # Errors
    /// The errno the provider returned; the receive was then not posted.
    ///
    /// # Safety
    /// Each SGE of `wr` lies inside a region registered in this SRQ's PD, with its lkey, and
    /// that memory stays registered and out of the CPU's reach until the receive's
    /// completion is polled or the SRQ is destroyed.
    pub(crate) unsafe fn post_recv(
        &self,
        wr: &mut ffi::ibv_recv_wr,
    ) -> std::result::Result<(), i32> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live SRQ; `wr` and its SGEs are valid for the call (the provider copies
        // them); the memory they name is the caller's to keep (this function's contract).
        let rc = unsafe { ffi::ibv_post_srq_recv(self.srq.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// `ibv_modify_srq` of the limit.
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn set_limit(&self, limit: u32) -> std::result::Result<(), i32> {
        let mut attr: ffi::ibv_srq_attr = super::zeroed();
        attr.srq_limit = limit;
        let mask = ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32;
        // SAFETY: live SRQ; `attr` valid for the call; the mask names the one field set.
        let rc = unsafe { ffi::ibv_modify_srq(self.srq.as_ptr(), &mut attr, mask) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// `ibv_query_srq`: the current limit.
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn query_limit(&self) -> std::result::Result<u32, i32> {
        let mut attr: ffi::ibv_srq_attr = super::zeroed();
        // SAFETY: live SRQ; valid out-pointer.
        let rc = unsafe { ffi::ibv_query_srq(self.srq.as_ptr(), &mut attr) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(attr.srq_limit)
    }
}

impl Drop for SrqCore {
    fn drop(&mut self) {
        // SAFETY: every queue pair that joined holds this core and destroyed its QP before
        // releasing it, so none is attached; destroyed once. Its CQ and the orphaned buffers
        // drop after this (fields).
        let rc = unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_destroy_srq on {} failed: {rc}",
                self.pd.context().name()
            ));
        }
    }
}
