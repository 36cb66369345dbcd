//! The queue pair's verbs objects and their teardown, whoever created them.

use super::srq::SrqCore;
use crate::cm_id::{CmId, ConnectionEnd};
use crate::cq::CompletionQueue;
use crate::device::AtomicCap;
use crate::error::{Error, Op, Result};
use crate::sys::pd::ProtectionDomain;
use rdma_sys as ffi;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// Who created a queue pair, and so who destroys it and how it is flushed.
pub(crate) enum Origin {
    /// `ibv_create_qp`, connected by exchanging endpoints.
    Verbs,
    /// `rdma_create_qp` on this cm id, which the queue pair owns from then on.
    Cm(CmId),
}

/// The queue pair, its completion queue (with the CQ's completion channel) and its origin;
/// destroyed children first, as libibverbs requires: `Drop` destroys the QP, and the fields
/// then drop in declaration order (the CQ and then its channel, the cm id and its event
/// channel, and last the protection domain, which may be the last reference to the context).
pub(crate) struct RawQp {
    qp: NonNull<ffi::ibv_qp>,
    /// Dropped after the QP (Drop below).
    pub(crate) cq: CompletionQueue,
    /// The shared receive queue it receives through, if any (its receive CQ): dropped after
    /// the QP, so the SRQ is destroyed only after every queue pair using it.
    pub(crate) srq: Option<Arc<SrqCore>>,
    /// Dropped after the CQ and before `pd` (field order).
    origin: Origin,
    /// Dropped last: every object above lives in this PD's context.
    pub(crate) pd: Arc<ProtectionDomain>,
    /// What the provider granted at creation, and the device's limits posts are checked
    /// against.
    pub(crate) caps: QpCaps,
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

// SAFETY: libibverbs lets a QP be posted to, modified and destroyed from any thread; the
// owning types decide sharing (`QueuePair` is `!Sync`).
unsafe impl Send for RawQp {}

impl RawQp {
    /// Takes ownership of a created queue pair.
    ///
    /// # Safety
    /// `qp` is a live QP in `pd`, using `cq` for both queues, that nothing else destroys
    /// (`caps`: what was granted at its creation; posts within them are valid; `srq`: the
    /// shared receive queue it was created with, whose CQ takes its receive completions):
    /// created by `ibv_create_qp` for [`Origin::Verbs`], or by `rdma_create_qp` on the cm id
    /// of [`Origin::Cm`].
    pub(crate) unsafe fn from_parts(
        qp: NonNull<ffi::ibv_qp>,
        cq: CompletionQueue,
        origin: Origin,
        pd: Arc<ProtectionDomain>,
        caps: QpCaps,
        srq: Option<Arc<SrqCore>>,
    ) -> RawQp {
        RawQp {
            qp,
            cq,
            srq,
            origin,
            pd,
            caps,
        }
    }

    /// The raw QP, for posting.
    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_qp {
        self.qp.as_ptr()
    }

    /// The queue pair number.
    pub(crate) fn qpn(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is a plain field.
        unsafe { self.qp.as_ref() }.qp_num
    }

    /// The cm id, for a queue pair created through rdma_cm.
    pub(crate) fn cm(&self) -> Option<&CmId> {
        match &self.origin {
            Origin::Cm(id) => Some(id),
            Origin::Verbs => None,
        }
    }

    /// `ibv_modify_qp` with the fields `mask` names; `to` names the target state in errors.
    pub(crate) fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32, to: &str) -> Result<()> {
        // SAFETY: live QP; `attr` is valid for the call and `mask` names only fields set.
        let rc = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), attr, mask as i32) };
        if rc != 0 {
            return Err(Error::from_errno(
                Op::ModifyQp,
                format!("{} qp {:#x} to {to}", self.pd.context().name(), self.qpn()),
                rc,
            ));
        }
        Ok(())
    }

    /// `ibv_query_qp` of the fields `mask` names.
    pub(crate) fn query(&self, mask: u32) -> Result<ffi::ibv_qp_attr> {
        // SAFETY: both are plain C structs; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: live QP; both out-structs are valid for the call.
        let rc = unsafe { ffi::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask as i32, &mut init) };
        if rc != 0 {
            return Err(Error::from_errno(
                Op::ModifyQp,
                format!(
                    "{} ibv_query_qp {:#x}",
                    self.pd.context().name(),
                    self.qpn()
                ),
                rc,
            ));
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
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        let _ = self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0, "ERR");
    }

    /// For an rdma_cm connection: waits, for at most `timeout`, until the peer disconnects.
    pub(crate) fn wait_disconnected(&self, timeout: Duration) -> Result<ConnectionEnd> {
        match &self.origin {
            Origin::Cm(id) => id.wait_disconnected(timeout),
            Origin::Verbs => Err(Error::invalid(Op::Cm, "not an rdma_cm connection")),
        }
    }
}

#[cfg(feature = "tokio")]
impl RawQp {
    /// As [`RawQp::wait_disconnected`], awaited on tokio's reactor.
    pub(crate) async fn wait_disconnected_async(&self, timeout: Duration) -> Result<ConnectionEnd> {
        match &self.origin {
            Origin::Cm(id) => id.wait_disconnected_async(timeout).await,
            Origin::Verbs => Err(Error::invalid(Op::Cm, "not an rdma_cm connection")),
        }
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        match &self.origin {
            // SAFETY: the QP was created by rdma_create_qp on this id (from_parts' contract)
            // and is destroyed once, here. After it returns the NIC touches no buffer posted
            // on it.
            Origin::Cm(id) => unsafe { ffi::rdma_destroy_qp(id.id()) },
            Origin::Verbs => {
                // SAFETY: created by ibv_create_qp (from_parts' contract), destroyed once,
                // before the CQ it uses (a field, dropped after this); same guarantee as above.
                let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
                if rc != 0 {
                    crate::diag::warn(format_args!(
                        "ibv_destroy_qp on {} failed: {rc}",
                        self.pd.context().name()
                    ));
                }
            }
        }
        // The fields drop next, in order: the CQ and its channel, the cm id and its event
        // channel, then the protection domain (and with it, perhaps, the context).
    }
}
