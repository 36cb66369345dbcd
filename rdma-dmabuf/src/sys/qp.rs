//! Queue pairs (`ibv_create_qp_ex`, `rdma_create_qp_ex`, `ibv_modify_qp`, `ibv_query_qp`,
//! `ibv_post_send`, `ibv_post_recv`, `ibv_destroy_qp`, `rdma_destroy_qp`): the verbs
//! objects of one queue pair and their teardown, whoever created them.

use super::cm::CmId;
use super::cq::CompletionQueue;
use super::device::AtomicCap;
use super::event::Registered;
use super::pd::ProtectionDomain;
use super::qp_ex::WrOps;
use super::srq::SrqCore;
use rdma_sys as ffi;
use std::ptr::NonNull;
use std::sync::Arc;

/// Who created a queue pair, and so who destroys it and how it is flushed.
pub(crate) enum Origin {
    /// `ibv_create_qp`, connected by exchanging endpoints.
    Verbs,
    /// `rdma_create_qp` on this cm id, which the queue pair owns from then on.
    Cm(CmId),
}

/// What a queue pair is created with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpRequest {
    /// Send queue entries.
    pub send_depth: u32,
    /// Receive queue entries (0 when receiving through a shared queue).
    pub recv_depth: u32,
    /// SGEs per request.
    pub sge: u32,
    /// Inline bytes per send or write.
    pub max_inline: u32,
    /// Ask for the extended send verbs (`IBV_QP_EX_WITH_RDMA_WRITE`), and create a plain
    /// queue pair if the provider refuses them.
    pub extended: bool,
}

/// A queue pair's limits, as granted at creation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpCaps {
    /// The inline data size per send or write.
    pub max_inline: u32,
    /// The device's remote atomic capability.
    pub atomics: AtomicCap,
    /// Parts (SGEs) per send, write, read or atomic.
    pub send_sge: u32,
    /// Parts (SGEs) per receive.
    pub recv_sge: u32,
    /// Parts per RDMA read: the send queue's and the device's `max_sge_rd`, the lower.
    pub read_sge: u32,
}

/// The queue pair, its completion queue (with the CQ's completion channel) and its origin;
/// destroyed children first, as libibverbs requires: `Drop` removes its entry among the
/// queue pairs fatal events flush, destroys the QP, and the fields then drop in declaration
/// order (the CQ and then its channel, the shared receive queue, the cm id and its event
/// channel, and last the protection domain, which may be the last reference to the context).
pub(crate) struct RawQp {
    /// Taken out (and so removed) first in Drop, before the QP is destroyed.
    events: Option<Registered>,
    qp: NonNull<ffi::ibv_qp>,
    /// Dropped after the QP (Drop below).
    cq: CompletionQueue,
    /// The shared receive queue it receives through, if any (its receive CQ): dropped after
    /// the QP, so the SRQ is destroyed only after every queue pair using it.
    srq: Option<Arc<SrqCore>>,
    /// Dropped after the CQ and before `pd` (field order).
    origin: Origin,
    /// Dropped last: every object above lives in this PD's context.
    pd: Arc<ProtectionDomain>,
    /// What the provider granted at creation, and the device's limits posts are checked
    /// against.
    caps: QpCaps,
    /// The extended send verbs, when the queue pair was created with them. Plain pointers
    /// into the QP's provider struct, used only while the QP lives (no drop glue).
    wr: Option<WrOps>,
}

// SAFETY: libibverbs lets a QP be posted to, modified and destroyed from any thread; the
// owning types decide sharing (`QueuePair` is `!Sync`). The same holds of the extended send
// verbs (`wr`: pointers into the QP's provider struct): the provider's scratch fields
// `wr_id` and `wr_flags` are written only inside a send section, which one thread holds at
// a time (the provider's send-queue lock, and the `!Sync` owner).
unsafe impl Send for RawQp {}

impl RawQp {
    /// Creates an RC queue pair in `pd` on `cq` (both queues; receives on `srq`'s CQ when it
    /// receives through `srq`, which must be of the same PD), through `rdma_create_qp_ex` on
    /// `cm` when given (the connection manager then drives its state), else
    /// `ibv_create_qp_ex`. With `req.extended`, first with the extended send verbs for
    /// writes, and again without them if the provider refuses that (rdma-core's irdma,
    /// mlx4, bnxt_re, siw and others have none). `atomics` and `max_sge_rd` are the
    /// device's, for the caps.
    ///
    /// # Errors
    /// The OS error of the creation; `cq` and `cm` are destroyed as they drop.
    pub(crate) fn create(
        pd: &Arc<ProtectionDomain>,
        cq: CompletionQueue,
        srq: Option<Arc<SrqCore>>,
        cm: Option<CmId>,
        req: QpRequest,
        atomics: AtomicCap,
        max_sge_rd: u32,
    ) -> std::io::Result<RawQp> {
        if srq.as_ref().is_some_and(|s| !Arc::ptr_eq(s.pd(), pd)) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut init: ffi::ibv_qp_init_attr_ex = super::zeroed();
        init.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0;
        init.pd = pd.as_ptr();
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        if let Some(srq) = &srq {
            (init.srq, init.recv_cq) = srq.raw();
        }
        init.cap.max_send_wr = req.send_depth;
        init.cap.max_recv_wr = req.recv_depth;
        init.cap.max_send_sge = req.sge;
        init.cap.max_recv_sge = if srq.is_some() { 0 } else { req.sge };
        init.cap.max_inline_data = req.max_inline;
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        let mut made = None;
        if req.extended {
            let mut ex = init;
            ex.comp_mask |= ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
            ex.send_ops_flags =
                u64::from(ffi::ibv_qp_create_send_ops_flags::IBV_QP_EX_WITH_RDMA_WRITE.0);
            if let Ok(qp) = create_one(pd, cm.as_ref(), &mut ex) {
                // SAFETY: just created with the send operations flag for writes; the
                // entry points live in the QP's provider struct, which `RawQp` holds.
                made = Some((qp, ex.cap, unsafe { WrOps::of(qp) }));
            }
        }
        let (qp, cap, wr) = match made {
            Some(made) => made,
            None => {
                let qp = create_one(pd, cm.as_ref(), &mut init)?;
                (qp, init.cap, None)
            }
        };
        // The provider wrote back what it granted (at least what was asked).
        let caps = QpCaps {
            max_inline: cap.max_inline_data,
            atomics,
            send_sge: cap.max_send_sge,
            recv_sge: cap.max_recv_sge,
            read_sge: cap.max_send_sge.min(max_sge_rd.max(1)),
        };
        // SAFETY: the QP is live; qp_num is a plain field.
        let qpn = unsafe { qp.as_ref() }.qp_num;
        // SAFETY: `qp` is a live QP of the PD's context using `cq`; the entry is taken out
        // of `events` first in Drop, before the QP is destroyed.
        let events =
            unsafe { Registered::new(pd.context().as_ptr(), qp.as_ptr(), cq.as_ptr(), qpn) };
        Ok(RawQp {
            events: Some(events),
            qp,
            cq,
            srq,
            origin: match cm {
                Some(id) => Origin::Cm(id),
                None => Origin::Verbs,
            },
            pd: pd.clone(),
            caps,
            wr,
        })
    }

    /// The extended send verbs, when the queue pair has them.
    #[inline]
    pub(crate) fn wr_ops(&self) -> Option<&WrOps> {
        self.wr.as_ref()
    }

    /// The queue pair number.
    #[inline]
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is a plain field.
        unsafe { self.qp.as_ref() }.qp_num
    }

    /// Its completion queue.
    #[inline]
    pub(crate) fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// The shared receive queue it receives through, if any.
    #[inline]
    pub(crate) fn srq(&self) -> Option<&Arc<SrqCore>> {
        self.srq.as_ref()
    }

    /// Its protection domain.
    #[inline]
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// What was granted at creation.
    #[inline]
    pub(crate) fn caps(&self) -> &QpCaps {
        &self.caps
    }

    /// Whether a fatal device event moved it to the error state (one atomic load).
    #[inline]
    pub(crate) fn flushed_by_event(&self) -> bool {
        self.events.as_ref().is_some_and(Registered::flushed)
    }

    /// The cm id, for a queue pair created through rdma_cm.
    pub(crate) fn cm(&self) -> Option<&CmId> {
        match &self.origin {
            Origin::Cm(id) => Some(id),
            Origin::Verbs => None,
        }
    }

    /// `ibv_modify_qp` with the fields `mask` names.
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn modify_raw(
        &self,
        attr: &mut ffi::ibv_qp_attr,
        mask: u32,
    ) -> std::result::Result<(), i32> {
        // SAFETY: live QP; `attr` is valid for the call (plain integers: a field the mask
        // names but the caller left zero is a value the provider checks).
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask as i32) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// `ibv_query_qp` of the fields `mask` names.
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn query_raw(&self, mask: u32) -> std::result::Result<ffi::ibv_qp_attr, i32> {
        let mut attr: ffi::ibv_qp_attr = super::zeroed();
        let mut init: ffi::ibv_qp_init_attr = super::zeroed();
        // SAFETY: live QP; both out-structs are valid for the call.
        let rc = unsafe { ffi::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask as i32, &mut init) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(attr)
    }

    /// Moves the queue pair to the error state, so that everything in flight completes,
    /// flushed. rdma_cm connections are disconnected first (which tells the peer); the move
    /// to ERR follows in case the disconnect did not (a connection not yet established).
    pub(crate) fn flush(&self) {
        if let Origin::Cm(id) = &self.origin {
            id.disconnect();
        }
        let mut attr: ffi::ibv_qp_attr = super::zeroed();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        let _ = self.modify_raw(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0);
    }

    /// `ibv_post_send` of a chain of work requests.
    ///
    /// # Errors
    /// The errno the provider returned, and the request it stopped at (`bad`: null if
    /// none).
    ///
    /// # Safety
    /// `wr` heads a chain of valid work requests (each `next` null or the next one), with
    /// valid SGE lists, for the call. Every SGE of the chain lies inside a region registered in this queue pair's PD, with
    /// its lkey, and that memory stays registered, and out of the CPU's reach where the NIC
    /// writes it, until the request's completion is polled or the QP is destroyed (for an
    /// unsignalled request: until a later request's completion); `IBV_SEND_INLINE` data
    /// only for the call.
    #[inline]
    pub(crate) unsafe fn post_send(
        &self,
        wr: *mut ffi::ibv_send_wr,
    ) -> std::result::Result<(), (i32, *mut ffi::ibv_send_wr)> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: live QP; the chain is valid for the call (the provider copies it); the
        // memory it names is the caller's to keep (this function's contract).
        let rc = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err((rc, bad));
        }
        Ok(())
    }

    /// `ibv_post_recv` of one receive.
    ///
    /// # Errors
    /// The errno the provider returned; the receive was then not posted.
    ///
    /// # Safety
    /// As [`RawQp::post_send`], for memory the NIC writes.
    #[inline]
    pub(crate) unsafe fn post_recv(
        &self,
        wr: &mut ffi::ibv_recv_wr,
    ) -> std::result::Result<(), i32> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: as in `post_send`.
        let rc = unsafe { ffi::ibv_post_recv(self.qp.as_ptr(), wr, &mut bad) };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // Out of the list fatal events flush before the QP goes.
        drop(self.events.take());
        match &self.origin {
            // SAFETY: the QP was created by rdma_create_qp on this id (`create`) and is
            // destroyed once, here. After it returns the NIC touches no buffer posted on it.
            Origin::Cm(id) => unsafe { ffi::rdma_destroy_qp(id.id()) },
            Origin::Verbs => {
                // SAFETY: created by ibv_create_qp (`create`), destroyed once, before the CQ
                // it uses (a field, dropped after this); same guarantee as above.
                let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
                if rc != 0 {
                    crate::diag::warn(format_args!(
                        "ibv_destroy_qp on {} failed: {rc}",
                        self.pd.context().name()
                    ));
                }
            }
        }
        // The fields drop next, in order: the CQ and its channel, the shared receive queue,
        // the cm id and its event channel, then the protection domain (and with it, perhaps,
        // the context).
    }
}

/// One attempt at creating the queue pair `init` describes (its `pd` is `pd`): through
/// `rdma_create_qp_ex` on `cm` when given, else `ibv_create_qp_ex`. The OS error when
/// refused; the provider wrote what it granted into `init.cap` otherwise.
fn create_one(
    pd: &ProtectionDomain,
    cm: Option<&CmId>,
    init: &mut ffi::ibv_qp_init_attr_ex,
) -> std::io::Result<NonNull<ffi::ibv_qp>> {
    let qp = match cm {
        // SAFETY: live PD; `init` (an `ibv_qp_init_attr_ex`, which starts with the fields
        // of an `ibv_qp_init_attr`) is valid for the call and names live CQs (and SRQ),
        // which the queue pair keeps until after it is destroyed. As libibverbs' inline
        // `ibv_create_qp_ex`: `ibv_create_qp` when only the PD is given.
        None if init.comp_mask == ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 => unsafe {
            ffi::ibv_create_qp(pd.as_ptr(), (init as *mut ffi::ibv_qp_init_attr_ex).cast())
        },
        // SAFETY: the PD's context is open.
        None => match unsafe { super::ctx_ops::ctx_op!(pd.context().as_ptr(), create_qp_ex) } {
            // SAFETY: the provider's `create_qp_ex` of the PD's context; `init` as above.
            Some(create) => unsafe { create(pd.context().as_ptr(), init) },
            None => return Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP)),
        },
        Some(id) => {
            // SAFETY: live cm id, live PD of the id's device (librdmacm checks), `init` valid
            // for the call, as above.
            let rc = unsafe { ffi::rdma_create_qp_ex(id.id(), init) };
            if rc == 0 {
                // SAFETY: on success librdmacm stored the new QP in the live id.
                unsafe { (*id.id()).qp }
            } else {
                std::ptr::null_mut()
            }
        }
    };
    NonNull::new(qp).ok_or_else(std::io::Error::last_os_error)
}
