//! The queue pair's verbs objects (`sys::qp`, which creates and destroys them): their errors,
//! and the waits on an rdma_cm connection's end.

use crate::cm_id::ConnectionEnd;
use crate::error::{Error, Op, Result};
pub(crate) use crate::sys::qp::{QpRequest, RawQp};
use rdma_sys as ffi;
use std::time::Duration;

impl RawQp {
    /// `ibv_modify_qp` with the fields `mask` names; `to` names the target state in errors.
    pub(crate) fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32, to: &str) -> Result<()> {
        self.modify_raw(attr, mask).map_err(|rc| {
            Error::from_errno(
                Op::ModifyQp,
                format!(
                    "{} qp {:#x} to {to}",
                    self.pd().context().name(),
                    self.qpn()
                ),
                rc,
            )
        })
    }

    /// `ibv_query_qp` of the fields `mask` names.
    pub(crate) fn query(&self, mask: u32) -> Result<ffi::ibv_qp_attr> {
        self.query_raw(mask).map_err(|rc| {
            Error::from_errno(
                Op::ModifyQp,
                format!(
                    "{} ibv_query_qp {:#x}",
                    self.pd().context().name(),
                    self.qpn()
                ),
                rc,
            )
        })
    }

    /// For an rdma_cm connection: waits, for at most `timeout`, until the peer disconnects.
    pub(crate) fn wait_disconnected(&self, timeout: Duration) -> Result<ConnectionEnd> {
        match self.cm() {
            Some(id) => id.wait_disconnected(timeout),
            None => Err(Error::invalid(Op::Cm, "not an rdma_cm connection")),
        }
    }
}

#[cfg(feature = "tokio")]
impl RawQp {
    /// As [`RawQp::wait_disconnected`], awaited on tokio's reactor.
    pub(crate) async fn wait_disconnected_async(&self, timeout: Duration) -> Result<ConnectionEnd> {
        match self.cm() {
            Some(id) => id.wait_disconnected_async(timeout).await,
            None => Err(Error::invalid(Op::Cm, "not an rdma_cm connection")),
        }
    }
}
