//! A created queue pair waiting for its peer's address, and the move to ready-to-send.

use super::raw::RawQp;
use super::retry::Retry;
use super::QueuePair;
use crate::endpoint::Endpoint;
use crate::error::Result;
use rdma_sys as ffi;
use std::fmt;

/// A queue pair in INIT: tell the peer [`PreparedQp::endpoint`], then
/// [`PreparedQp::connect`] with theirs.
pub struct PreparedQp {
    pub(super) raw: RawQp,
    pub(super) port: u8,
    pub(super) gid_index: u32,
    pub(super) local: Endpoint,
    pub(super) send_depth: u32,
    pub(super) recv_depth: u32,
    pub(super) retry: Retry,
    pub(super) hop_limit: u8,
}

impl fmt::Debug for PreparedQp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedQp")
            .field("local", &self.local)
            .finish()
    }
}

impl PreparedQp {
    /// This queue pair's address, for the peer.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// Moves to RTR then RTS against `remote`; the path MTU is the smaller of both ports'.
    ///
    /// # Errors
    /// [`Error::Verbs`](crate::Error::Verbs) from `ibv_modify_qp` (e.g. a GID index without a RoCEv2 GID).
    pub fn connect(self, remote: &Endpoint) -> Result<QueuePair> {
        use ffi::ibv_qp_attr_mask as M;
        let mut attr: ffi::ibv_qp_attr = crate::sys::zeroed();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = self.local.mtu.min(remote.mtu) as u32;
        attr.dest_qp_num = remote.qpn;
        attr.rq_psn = remote.psn;
        attr.max_dest_rd_atomic = 16;
        attr.min_rnr_timer = self.retry.min_rnr_timer;
        attr.ah_attr.is_global = 1;
        attr.ah_attr.dlid = remote.lid;
        attr.ah_attr.port_num = self.port;
        attr.ah_attr.grh.dgid = ffi::ibv_gid { raw: remote.gid.0 };
        // Checked at build: at most 255.
        attr.ah_attr.grh.sgid_index = u8::try_from(self.gid_index).unwrap_or(u8::MAX);
        attr.ah_attr.grh.hop_limit = self.hop_limit;
        let rtr = M::IBV_QP_STATE
            | M::IBV_QP_AV
            | M::IBV_QP_PATH_MTU
            | M::IBV_QP_DEST_QPN
            | M::IBV_QP_RQ_PSN
            | M::IBV_QP_MAX_DEST_RD_ATOMIC
            | M::IBV_QP_MIN_RNR_TIMER;
        self.raw.modify(&mut attr, rtr.0, "RTR")?;
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_RTS;
        attr.timeout = self.retry.ack_timeout;
        attr.retry_cnt = self.retry.retry_count;
        attr.rnr_retry = self.retry.rnr_retry;
        attr.sq_psn = self.local.psn;
        attr.max_rd_atomic = 16;
        let rts = M::IBV_QP_STATE
            | M::IBV_QP_TIMEOUT
            | M::IBV_QP_RETRY_CNT
            | M::IBV_QP_RNR_RETRY
            | M::IBV_QP_SQ_PSN
            | M::IBV_QP_MAX_QP_RD_ATOMIC;
        self.raw.modify(&mut attr, rts.0, "RTS")?;
        Ok(QueuePair::new(
            self.raw,
            self.send_depth,
            self.recv_depth,
            self.local,
            *remote,
        ))
    }
}
