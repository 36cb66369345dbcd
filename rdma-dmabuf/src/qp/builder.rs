//! Settings of a new queue pair, checked before anything is created, and its creation.

use super::connect::PreparedQp;
use super::raw::{QpRequest, RawQp};
use super::srq::{SharedReceiveQueue, SrqCore};
use crate::cm_id::CmId;
use crate::cq::CompletionQueue;
use crate::device::{Context, DeviceAttr, Gid};
use crate::endpoint::Endpoint;
use crate::error::{Error, Op, Result};
use crate::mr::Access;
use crate::sys::pd::ProtectionDomain;
use rdma_sys as ffi;
use std::sync::Arc;
use std::time::Duration;

use super::retry::{Retry, DEFAULT_HOP_LIMIT, RNR_RETRY_FOREVER, RNR_TIMER_US};
#[cfg(doc)]
use super::retry::{
    DEFAULT_ACK_TIMEOUT, DEFAULT_MIN_RNR_TIMER, DEFAULT_RETRY_COUNT, DEFAULT_RNR_RETRY,
};

/// Settings of a new queue pair; required arguments are in [`QueuePairBuilder::new`].
///
/// No default waits forever: a request the peer never acknowledges fails after the retry
/// budget ([`DEFAULT_RETRY_COUNT`] retries of [`DEFAULT_ACK_TIMEOUT`]), and a send the peer
/// has no receive for fails after [`DEFAULT_RNR_RETRY`] RNR retries.
#[derive(Clone, Debug)]
pub struct QueuePairBuilder {
    pd: Arc<ProtectionDomain>,
    port: u8,
    gid_index: Option<u32>,
    send_depth: u32,
    recv_depth: u32,
    channel: bool,
    retry: Retry,
    /// A retry variable of the environment that is set but unreadable (refused at build).
    retry_env_error: Option<super::retry_env::Refusal>,
    rnr_forever: bool,
    hop_limit: u8,
    max_inline: u32,
    max_sge: u32,
    srq: Option<Arc<SrqCore>>,
    extended: bool,
}

impl QueuePairBuilder {
    /// A builder for an RC queue pair in `pd`: port 1, 128 sends and 128 receives
    /// outstanding, the port's RoCEv2 IPv4 GID, and finite retries (the `DEFAULT_*`
    /// constants of this module).
    ///
    /// The environment variables [`ACK_TIMEOUT_ENV`](crate::qp::ACK_TIMEOUT_ENV)
    /// (`RDMA_DMABUF_ACK_TIMEOUT`) and [`RETRY_COUNT_ENV`](crate::qp::RETRY_COUNT_ENV)
    /// (`RDMA_DMABUF_RETRY_COUNT`), when set, replace the default ACK timeout exponent and
    /// retry count, for fabrics far slower than a NIC (emulated machines). They accept only
    /// bounded values (a dead peer fails a request within 8 minutes at most);
    /// [`build`](QueuePairBuilder::build) refuses a value that is not UTF-8, not a number or
    /// outside its range with [`Error::Setting`](crate::Error::Setting).
    pub fn new(pd: &Arc<ProtectionDomain>) -> QueuePairBuilder {
        let (retry, retry_env_error) = super::retry_env::apply(Retry::default());
        QueuePairBuilder {
            pd: pd.clone(),
            port: 1,
            gid_index: None,
            send_depth: 128,
            recv_depth: 128,
            channel: false,
            retry,
            retry_env_error,
            rnr_forever: false,
            hop_limit: DEFAULT_HOP_LIMIT,
            max_inline: 0,
            max_sge: 1,
            srq: None,
            extended: true,
        }
    }

    /// Receives through `srq` (of the same protection domain) instead of a receive queue of
    /// its own: post receives with [`SharedReceiveQueue::post_recv`], and the queue pair's
    /// own `post_recv` is refused. The queue pair keeps the shared queue's verbs objects
    /// alive.
    pub fn srq(mut self, srq: &SharedReceiveQueue) -> Self {
        self.srq = Some(srq.core().clone());
        self
    }

    /// The most parts (scatter/gather entries) one request may have, on both queues
    /// ([`QueuePair::post_write_parts`](crate::QueuePair::post_write_parts) and the other
    /// `*_parts` posts; default 1). Each part costs work-queue memory, so ask for what the
    /// program posts. Checked against the device's `max_sge` at creation; RDMA reads are
    /// also held to its `max_sge_rd` when posted.
    pub fn max_sge(mut self, parts: u32) -> Self {
        self.max_sge = parts;
        self
    }

    /// The inline data the queue pair must take per send or write
    /// ([`QueuePair::post_send_inline`](crate::QueuePair::post_send_inline); default 0:
    /// none). The provider may grant more; creation fails if it cannot take this much.
    pub fn max_inline_data(mut self, bytes: u32) -> Self {
        self.max_inline = bytes;
        self
    }

    /// The hop limit of the packets' global route header (the IP TTL on RoCEv2; default
    /// [`DEFAULT_HOP_LIMIT`]). Connections made by rdma_cm take the CM's route instead.
    pub fn hop_limit(mut self, hops: u8) -> Self {
        self.hop_limit = hops;
        self
    }

    /// The port (default 1).
    pub fn port(mut self, port: u8) -> Self {
        self.port = port;
        self
    }

    /// The source GID index (default: the port's RoCEv2 IPv4-mapped GID). Checked at
    /// [`build`](QueuePairBuilder::build): it must lie in the port's GID table, be at most
    /// 255 (the address vector's `sgid_index` is 8 bits) and hold a RoCE or IB GID, else
    /// [`Error::GidIndex`].
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// How many sends, writes and reads may be outstanding (default 128). Checked at
    /// [`build`](QueuePairBuilder::build) against the device's `max_qp_wr`.
    pub fn send_depth(mut self, n: u32) -> Self {
        self.send_depth = n;
        self
    }

    /// Gives the completion queue a completion channel, so that [`Pending::wait`](crate::Pending::wait)
    /// sleeps in the kernel instead of spinning (default: no channel).
    pub fn completion_channel(mut self, yes: bool) -> Self {
        self.channel = yes;
        self
    }

    /// Whether batches ([`QueuePair::post_write_batch`](crate::QueuePair::post_write_batch))
    /// and single plain RDMA writes (one part, no immediate data, not inline) post through
    /// the extended send verbs (`ibv_wr_start`, `ibv_wr_rdma_write`, `ibv_wr_set_sge`,
    /// `ibv_wr_complete`) where the provider has them (default: yes). They build the
    /// request in the send queue directly, where `ibv_post_send` converts and copies a work
    /// request per write: on rxe a write in a batch of 16 costs about a sixth fewer
    /// instructions (docs/performance.md). The queue pair is then created with
    /// `ibv_create_qp_ex` (`rdma_create_qp_ex` for rdma_cm) asking for them, and created
    /// without them if the provider refuses (rdma-core's irdma, mlx4, bnxt_re, siw, qedr,
    /// ocrdma and cxgb4 have none); [`QueuePair::extended_verbs`](crate::QueuePair::extended_verbs)
    /// says which. `false` creates a plain queue pair and posts everything through
    /// `ibv_post_send`. Other posts (reads, sends, atomics, several parts, immediate data,
    /// inline data) always go through `ibv_post_send`.
    pub fn extended_verbs(mut self, yes: bool) -> Self {
        self.extended = yes;
        self
    }

    /// How many receives may be outstanding (default 128). Checked at
    /// [`build`](QueuePairBuilder::build) against the device's `max_qp_wr`.
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// The local ACK timeout exponent `t` (`ibv_qp_attr.timeout`, 1 to 31, default
    /// [`DEFAULT_ACK_TIMEOUT`]): a request unacknowledged for 4.096 µs × 2^t is retried.
    /// 0, which the verbs read as "wait forever", is refused at build.
    pub fn ack_timeout(mut self, exponent: u8) -> Self {
        self.retry.ack_timeout = exponent;
        self
    }

    /// How many times an unacknowledged request is sent again before it fails with
    /// `IBV_WC_RETRY_EXC_ERR` (`ibv_qp_attr.retry_cnt`, 0 to 7, default
    /// [`DEFAULT_RETRY_COUNT`]). Note that soft-RoCE (rxe) reads 7 as "forever": the
    /// environment's [`RETRY_COUNT_ENV`](crate::qp::RETRY_COUNT_ENV) stops at 6, so only this
    /// call can ask for 7.
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry.retry_count = n;
        self
    }

    /// How many times a send that found no receive posted at the peer is retried before it
    /// fails with `IBV_WC_RNR_RETRY_EXC_ERR` (`ibv_qp_attr.rnr_retry`, 0 to 6, default
    /// [`DEFAULT_RNR_RETRY`]). 7, which the specification defines as "forever", is refused
    /// here: use [`rnr_retry_forever`](QueuePairBuilder::rnr_retry_forever).
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.retry.rnr_retry = n;
        self.rnr_forever = false;
        self
    }

    /// Retries a send that found no receive posted at the peer forever (`rnr_retry = 7`): a
    /// peer that never posts a receive then stalls this queue pair until it is destroyed or
    /// moved to the error state.
    pub fn rnr_retry_forever(mut self) -> Self {
        self.retry.rnr_retry = RNR_RETRY_FOREVER;
        self.rnr_forever = true;
        self
    }

    /// The minimum RNR timer this queue pair asks its peer to wait before retrying a send it
    /// had no receive for (`ibv_qp_attr.min_rnr_timer`, a code of the InfiniBand table: 1 is
    /// 10 µs, 12 is 0.64 ms, 28 is 163.84 ms, 31 is 491.52 ms and 0 is 655.36 ms; default
    /// [`DEFAULT_MIN_RNR_TIMER`]). Connections made by rdma_cm take the CM's value.
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.retry.min_rnr_timer = code;
        self
    }

    /// The longest a request of this queue pair can stay unacknowledged before it fails with
    /// `IBV_WC_RETRY_EXC_ERR`: (retry count + 1) × 4 × 4.096 µs × 2^ack_timeout, the
    /// specification's bound (soft-RoCE waits a quarter of it: about 1.9 s with the defaults,
    /// against 7.5 s here).
    pub fn retry_budget(&self) -> Duration {
        self.retry.transport_budget()
    }

    /// The longest a peer's send can wait for a receive on this queue pair before it fails
    /// with `IBV_WC_RNR_RETRY_EXC_ERR`, if the peer uses the same RNR retry count: RNR retry
    /// count × the minimum RNR timer; `None` with [`rnr_retry_forever`], and for settings
    /// [`build`](QueuePairBuilder::build) refuses (a timer code past 31, a count past 7).
    ///
    /// [`rnr_retry_forever`]: QueuePairBuilder::rnr_retry_forever
    pub fn rnr_budget(&self) -> Option<Duration> {
        if self.retry.rnr_retry >= RNR_RETRY_FOREVER {
            return None;
        }
        let us = *RNR_TIMER_US.get(usize::from(self.retry.min_rnr_timer))?;
        Some(Duration::from_micros(
            u64::from(us) * u64::from(self.retry.rnr_retry),
        ))
    }

    /// Creates the completion queue and the queue pair and moves it to INIT.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero depths, depths past the device's limits and
    /// invalid retry settings; [`Error::GidIndex`] for a GID index the port cannot use;
    /// [`Error::Verbs`] from the provider.
    pub fn build(self) -> Result<PreparedQp> {
        let ctx = self.pd.context().clone();
        self.check_settings()?;
        let port_attr = ctx.query_port(self.port)?;
        // The index asked for, or the port's RoCEv2 IPv4 GID; either way checked (the
        // automatic pick, too, may lie past what the address vector holds).
        let gid_index = match self.gid_index {
            Some(i) => i,
            None => ctx.roce_v2_ipv4_gid(self.port)?.0,
        };
        let gid = self.usable_gid(&ctx, port_attr.gid_table_len, gid_index)?;
        let raw = self.create(None)?;
        let mut attr: ffi::ibv_qp_attr = crate::sys::zeroed();
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = self.port;
        attr.qp_access_flags = (Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC)
            .bits();
        use ffi::ibv_qp_attr_mask as M;
        raw.modify(
            &mut attr,
            (M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS).0,
            "INIT",
        )?;
        let qpn = raw.qpn();
        Ok(PreparedQp {
            raw,
            port: self.port,
            gid_index,
            local: Endpoint {
                qpn,
                psn: initial_psn(qpn),
                lid: port_attr.lid,
                gid,
                mtu: port_attr.active_mtu,
            },
            send_depth: self.send_depth,
            recv_depth: self.recv_depth,
            retry: self.retry,
            hop_limit: self.hop_limit,
        })
    }
}

impl QueuePairBuilder {
    /// Creates the completion queue and the queue pair, through `rdma_create_qp` when `cm`
    /// is given (the connection manager then drives its state).
    pub(crate) fn create(&self, cm: Option<CmId>) -> Result<RawQp> {
        let ctx = self.pd.context().clone();
        self.check_settings()?;
        let dev = ctx.query_device()?;
        let cq = CompletionQueue::new(&ctx, self.cq_entries(&dev)?, self.channel)?;
        if let Some(srq) = &self.srq {
            if !Arc::ptr_eq(srq.pd(), &self.pd) {
                return Err(Error::invalid(
                    Op::CreateQp,
                    "the shared receive queue belongs to another protection domain",
                ));
            }
        }
        let req = QpRequest {
            send_depth: self.send_depth,
            recv_depth: if self.srq.is_some() {
                0
            } else {
                self.recv_depth
            },
            sge: self.checked_sge(&dev)?,
            max_inline: self.max_inline,
            extended: self.extended,
        };
        RawQp::create(
            &self.pd,
            cq,
            self.srq.clone(),
            cm,
            req,
            dev.atomics,
            dev.max_sge_rd,
        )
        .map_err(|e| {
            // `cq` (no QP attached) and `cm` were destroyed as they dropped.
            Error::from_errno(
                Op::CreateQp,
                format!(
                    "{} (send {} / recv {}, {} bytes inline: a provider refuses more inline \
                     data than it can take)",
                    ctx.name(),
                    self.send_depth,
                    self.recv_depth,
                    self.max_inline
                ),
                e.raw_os_error().unwrap_or(libc::EIO),
            )
        })
    }

    /// GID `index` of the port, if a queue pair can send from it: inside the port's table of
    /// `table_len` entries, within the address vector's 8-bit `sgid_index`, and a filled
    /// entry of a RoCE or IB type.
    fn usable_gid(&self, ctx: &Context, table_len: u32, index: u32) -> Result<Gid> {
        let refuse = |why: String| Error::GidIndex {
            op: Op::CreateQp,
            device: ctx.name().to_string(),
            port: self.port,
            index,
            table_len,
            why,
        };
        if index >= table_len {
            return Err(refuse(format!(
                "outside the table (indices 0 to {})",
                table_len.saturating_sub(1)
            )));
        }
        if index > u32::from(u8::MAX) {
            return Err(refuse(
                "the address vector's sgid_index has 8 bits, so a connected queue pair can \
                 only send from indices 0 to 255"
                    .into(),
            ));
        }
        let ty = ctx.gid_type(self.port, index);
        let gid = match ctx.gid(self.port, index) {
            Ok(g) if g != Gid::default() => g,
            _ => return Err(refuse("an empty entry (no GID)".into())),
        };
        match ty.as_deref() {
            None | Some("RoCE v2") | Some("IB/RoCE v1") => Ok(gid),
            Some(other) => Err(refuse(format!(
                "GID {gid} is of type {other:?}, neither RoCE v2 nor IB/RoCE v1"
            ))),
        }
    }

    /// The protection domain the queue pair is built in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Whether the queue pair will receive through a shared receive queue.
    pub(crate) fn uses_srq(&self) -> bool {
        self.srq.is_some()
    }

    pub(crate) fn depths(&self) -> (u32, u32) {
        (self.send_depth, self.recv_depth)
    }

    pub(crate) fn retry(&self) -> Retry {
        self.retry
    }

    /// Refuses zero depths and invalid retry settings before anything is created.
    fn check_settings(&self) -> Result<()> {
        if let Some(bad) = &self.retry_env_error {
            return Err(bad.to_error());
        }
        if self.send_depth == 0 || self.recv_depth == 0 {
            return Err(Error::invalid(
                Op::CreateQp,
                format!(
                    "send_depth {} and recv_depth {}: each must be at least 1",
                    self.send_depth, self.recv_depth
                ),
            ));
        }
        self.retry.check(self.rnr_forever)
    }

    /// The parts per request asked for, checked against the device's `max_sge`.
    fn checked_sge(&self, dev: &DeviceAttr) -> Result<u32> {
        let n = self.max_sge;
        if n == 0 || n > dev.max_sge {
            return Err(Error::invalid(
                Op::CreateQp,
                format!(
                    "max_sge {n}: {} takes 1 to {} parts per request (max_sge)",
                    self.pd.context().name(),
                    dev.max_sge
                ),
            ));
        }
        Ok(n)
    }

    /// The completion queue's size (one entry per request that may be outstanding), after
    /// checking both depths against the device's `max_qp_wr` and their sum against its
    /// `max_cqe`.
    fn cq_entries(&self, dev: &DeviceAttr) -> Result<i32> {
        let ctx = self.pd.context();
        let (send, recv) = (self.send_depth, self.recv_depth);
        if send > dev.max_qp_wr || recv > dev.max_qp_wr {
            return Err(Error::invalid(
                Op::CreateQp,
                format!(
                    "send_depth {send} and recv_depth {recv}: {} allows at most {} work \
                     requests per queue (max_qp_wr)",
                    ctx.name(),
                    dev.max_qp_wr
                ),
            ));
        }
        let cqe = u64::from(send) + u64::from(recv);
        match i32::try_from(cqe) {
            Ok(n) if cqe <= u64::from(dev.max_cqe) => Ok(n),
            _ => Err(Error::invalid(
                Op::CreateCq,
                format!(
                    "send_depth {send} + recv_depth {recv} = {cqe} completion queue entries: \
                     {} allows at most {} (max_cqe)",
                    ctx.name(),
                    dev.max_cqe
                ),
            )),
        }
    }
}

/// A 24-bit starting PSN that differs between queue pairs and runs.
fn initial_psn(qpn: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    (t ^ qpn.wrapping_mul(0x9e37_79b9)) & 0x00ff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qp::retry::DEFAULT_MIN_RNR_TIMER;

    #[test]
    fn retry_settings_are_checked_and_budgeted() {
        let r = Retry::default();
        assert!(r.check(false).is_ok());
        // (6 + 1) tries of 4 × 4.096 µs × 2^16.
        assert_eq!(
            r.transport_budget(),
            Duration::from_nanos(7 * 4 * (4096 << 16))
        );
        let bad = |r: Retry, forever: bool| r.check(forever).unwrap_err().to_string();
        assert!(bad(
            Retry {
                retry_count: 8,
                ..r
            },
            false
        )
        .contains("retry_count 8"));
        let e = bad(Retry { rnr_retry: 7, ..r }, false);
        assert!(e.contains("rnr_retry_forever"), "{e}");
        assert!(Retry { rnr_retry: 7, ..r }.check(true).is_ok());
        assert!(bad(Retry { rnr_retry: 9, ..r }, true).contains("rnr_retry 9"));
        assert!(bad(
            Retry {
                ack_timeout: 0,
                ..r
            },
            false
        )
        .contains("forever"));
        assert!(bad(
            Retry {
                ack_timeout: 32,
                ..r
            },
            false
        )
        .contains("32"));
        assert!(bad(
            Retry {
                min_rnr_timer: 32,
                ..r
            },
            false
        )
        .contains("32"));
        assert_eq!(RNR_TIMER_US[usize::from(DEFAULT_MIN_RNR_TIMER)], 163_840);
    }
}
