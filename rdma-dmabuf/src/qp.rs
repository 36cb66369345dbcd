//! Reliable-connected queue pairs: typestate bring-up ([`QueuePairBuilder`] ->
//! [`PreparedQp`] -> [`QueuePair`]) and posts that take ownership of their buffers.
//!
//! A post moves a [`Local`] (a region, or a part of one) into the queue and returns a
//! [`Pending`] handle; its completion hands the region back. Dropping a `Pending` early leaves
//! the region with the queue until the NIC is done with it; dropping the queue pair moves it to
//! the error state, drains the flushed requests, destroys it, and only then frees what was in
//! flight.

use crate::device::{Context, Gid};
use crate::endpoint::Endpoint;
use crate::error::{Error, Op, Result};
use crate::mr::{Access, Backing, MemoryRegion};
use crate::pd::ProtectionDomain;
use crate::remote::RemoteRegion;
use crate::slots::{wr_id, RawCompletion, Slots};
use crate::wr::{WorkCompletion, WorkKind};
use rdma_sys as ffi;
use std::cell::RefCell;
use std::fmt;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The default local ACK timeout exponent: a request unacknowledged for 4.096 µs × 2^16 ≈
/// 268 ms is sent again.
pub const DEFAULT_ACK_TIMEOUT: u8 = 16;
/// The default transport retry count: after the first try and 6 retries, each unacknowledged
/// for the ACK timeout, the request fails with `IBV_WC_RETRY_EXC_ERR` (about 7 × 268 ms ≈
/// 1.9 s on soft-RoCE; the specification lets a NIC wait up to 4 times the timeout per try,
/// 7.5 s in all).
pub const DEFAULT_RETRY_COUNT: u8 = 6;
/// The default RNR retry count: a send that finds no receive posted is retried 6 times, each
/// after the peer's RNR timer, then fails with `IBV_WC_RNR_RETRY_EXC_ERR`. (7 would mean
/// "forever": see [`QueuePairBuilder::rnr_retry_forever`].)
pub const DEFAULT_RNR_RETRY: u8 = 6;
/// The default minimum RNR timer code (the IB table's code 28, 163.84 ms) that this queue
/// pair asks a peer to wait after finding no receive posted: with the default RNR retry
/// count, a peer's send waits up to 6 × 163.84 ms ≈ 0.98 s for a receive.
pub const DEFAULT_MIN_RNR_TIMER: u8 = 28;

/// The RNR timer codes of the InfiniBand specification (table 45), in microseconds; code 0
/// is the longest.
const RNR_TIMER_US: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// How long a requester waits and how often it retries before failing a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retry {
    pub ack_timeout: u8,
    pub retry_count: u8,
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            ack_timeout: DEFAULT_ACK_TIMEOUT,
            retry_count: DEFAULT_RETRY_COUNT,
            rnr_retry: DEFAULT_RNR_RETRY,
            min_rnr_timer: DEFAULT_MIN_RNR_TIMER,
        }
    }
}

/// The value of [`QueuePairBuilder::rnr_retry_forever`]: `rnr_retry = 7`.
const RNR_RETRY_FOREVER: u8 = 7;

impl Retry {
    /// Refuses values the verbs would misread (a 3-bit count past 7, an infinite ACK timeout).
    fn check(&self, forever: bool) -> Result<()> {
        let refuse = |what: String| Err(Error::invalid(Op::CreateQp, what));
        if self.retry_count > 7 {
            return refuse(format!(
                "retry_count {}: at most 7 (a 3-bit field)",
                self.retry_count
            ));
        }
        if self.rnr_retry == RNR_RETRY_FOREVER && !forever {
            return refuse(
                "rnr_retry 7 means retry forever: ask for it with rnr_retry_forever()".into(),
            );
        }
        if self.rnr_retry > 7 {
            return refuse(format!(
                "rnr_retry {}: at most 6 (7, which means forever, through rnr_retry_forever())",
                self.rnr_retry
            ));
        }
        if self.ack_timeout == 0 || self.ack_timeout > 31 {
            return refuse(format!(
                "ack_timeout exponent {}: 1 to 31 (0 would mean wait forever)",
                self.ack_timeout
            ));
        }
        if self.min_rnr_timer > 31 {
            return refuse(format!(
                "min_rnr_timer code {}: 0 to 31",
                self.min_rnr_timer
            ));
        }
        Ok(())
    }

    /// The longest a request can stay unacknowledged before failing with
    /// `IBV_WC_RETRY_EXC_ERR`: (retry count + 1) tries of up to 4 × 4.096 µs × 2^timeout
    /// each (the specification's bound on the NIC's timer).
    fn transport_budget(&self) -> Duration {
        let per_try_ns = 4096u64 << self.ack_timeout;
        Duration::from_nanos(per_try_ns.saturating_mul(4 * (u64::from(self.retry_count) + 1)))
    }
}

/// Settings of a new queue pair; required arguments are in [`QueuePairBuilder::new`].
///
/// No default waits forever: a request the peer never acknowledges fails after the retry
/// budget ([`DEFAULT_RETRY_COUNT`] retries of [`DEFAULT_ACK_TIMEOUT`]), and a send the peer
/// has no receive for fails after [`DEFAULT_RNR_RETRY`] RNR retries.
#[derive(Debug)]
pub struct QueuePairBuilder {
    pd: Arc<ProtectionDomain>,
    port: u8,
    gid_index: Option<u32>,
    send_depth: u32,
    recv_depth: u32,
    channel: bool,
    retry: Retry,
    rnr_forever: bool,
}

impl QueuePairBuilder {
    /// A builder for an RC queue pair in `pd`: port 1, 128 sends and 128 receives
    /// outstanding, the port's RoCEv2 IPv4 GID, and finite retries (the `DEFAULT_*`
    /// constants of this module).
    pub fn new(pd: &Arc<ProtectionDomain>) -> QueuePairBuilder {
        QueuePairBuilder {
            pd: pd.clone(),
            port: 1,
            gid_index: None,
            send_depth: 128,
            recv_depth: 128,
            channel: false,
            retry: Retry::default(),
            rnr_forever: false,
        }
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

    /// Gives the completion queue a completion channel, so that [`Pending::wait_blocking`]
    /// sleeps in the kernel instead of spinning (default: no channel).
    pub fn completion_channel(mut self, yes: bool) -> Self {
        self.channel = yes;
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
    /// [`DEFAULT_RETRY_COUNT`]). Note that soft-RoCE (rxe) reads 7 as "forever".
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
    /// count × the minimum RNR timer; `None` with [`rnr_retry_forever`].
    ///
    /// [`rnr_retry_forever`]: QueuePairBuilder::rnr_retry_forever
    pub fn rnr_budget(&self) -> Option<Duration> {
        if self.retry.rnr_retry >= RNR_RETRY_FOREVER {
            return None;
        }
        let us = RNR_TIMER_US[usize::from(self.retry.min_rnr_timer & 31)];
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
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
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
        })
    }
}

impl QueuePairBuilder {
    /// Creates the completion queue and the queue pair, through `rdma_create_qp` when `cm`
    /// is given (the connection manager then drives its state).
    pub(crate) fn create(&self, cm: Option<crate::cm::CmParts>) -> Result<RawQp> {
        let ctx = self.pd.context().clone();
        self.check_settings()?;
        let cqe = self.cq_entries()?;
        let channel = if self.channel {
            Some(CompChannel::new(&ctx)?)
        } else {
            None
        };
        let ch_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        // SAFETY: open context; the channel (if any) is live and outlives the CQ (RawQp
        // destroys the CQ first).
        let cq = unsafe { ffi::ibv_create_cq(ctx.as_ptr(), cqe, std::ptr::null_mut(), ch_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| {
            Error::last_os(Op::CreateCq, format!("{} ({cqe} entries)", ctx.name()))
        })?;
        // SAFETY: ibv_qp_init_attr is a plain C struct; all-zero is valid.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        init.send_cq = cq.as_ptr();
        init.recv_cq = cq.as_ptr();
        init.cap.max_send_wr = self.send_depth;
        init.cap.max_recv_wr = self.recv_depth;
        init.cap.max_send_sge = 1;
        init.cap.max_recv_sge = 1;
        init.qp_type = ffi::ibv_qp_type::IBV_QPT_RC;
        let target = || {
            format!(
                "{} (send {} / recv {})",
                ctx.name(),
                self.send_depth,
                self.recv_depth
            )
        };
        let qp = match &cm {
            // SAFETY: live PD, `init` valid for the call.
            None => unsafe { ffi::ibv_create_qp(self.pd.as_ptr(), &mut init) },
            Some(cm) => {
                // SAFETY: live cm id whose device is the PD's (checked by librdmacm).
                let rc = unsafe { ffi::rdma_create_qp(cm.id(), self.pd.as_ptr(), &mut init) };
                if rc == 0 {
                    // SAFETY: on success librdmacm stored the new QP in the live id.
                    unsafe { (*cm.id()).qp }
                } else {
                    std::ptr::null_mut()
                }
            }
        };
        let Some(qp) = NonNull::new(qp) else {
            let e = Error::last_os(Op::CreateQp, target());
            // SAFETY: `cq` was created above and has no QP attached.
            unsafe { ffi::ibv_destroy_cq(cq.as_ptr()) };
            return Err(e);
        };
        Ok(RawQp {
            qp,
            cq,
            pd: self.pd.clone(),
            cm,
            channel,
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

    pub(crate) fn depths(&self) -> (u32, u32) {
        (self.send_depth, self.recv_depth)
    }

    pub(crate) fn retry(&self) -> Retry {
        self.retry
    }

    /// Refuses zero depths and invalid retry settings before anything is created.
    fn check_settings(&self) -> Result<()> {
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

    /// The completion queue's size (one entry per request that may be outstanding), after
    /// checking both depths against the device's `max_qp_wr` and their sum against its
    /// `max_cqe`.
    fn cq_entries(&self) -> Result<i32> {
        let ctx = self.pd.context();
        let dev = ctx.query_device()?;
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

/// The queue pair and completion queue handles, the CQ's completion channel and, for rdma_cm
/// connections, the cm id; destroyed in that order on drop, children before parents as
/// libibverbs requires: `Drop` destroys the QP and then the CQ, and the fields then drop in
/// declaration order (completion channel, cm id and its event channel, and last the
/// protection domain, which may be the last reference to the context).
pub(crate) struct RawQp {
    qp: NonNull<ffi::ibv_qp>,
    cq: NonNull<ffi::ibv_cq>,
    /// Dropped after the CQ (Drop below) and before `pd` (field order).
    channel: Option<CompChannel>,
    /// Dropped after the QP (Drop below) and before `pd` (field order).
    cm: Option<crate::cm::CmParts>,
    /// Dropped last: every object above lives in this PD's context.
    pd: Arc<ProtectionDomain>,
}

// SAFETY: verbs on a QP and CQ may be called from any thread; the owning types decide sharing.
unsafe impl Send for RawQp {}

/// A completion channel (`ibv_create_comp_channel`); destroyed on drop, after its CQ, and
/// before its context, which it holds until then.
pub(crate) struct CompChannel {
    ch: NonNull<ffi::ibv_comp_channel>,
    /// Released after the channel is destroyed (`ibv_destroy_comp_channel` locks the
    /// context's mutex, so the context must still be open).
    ctx: Arc<Context>,
}

// SAFETY: a completion channel may be used from any thread.
unsafe impl Send for CompChannel {}

impl CompChannel {
    fn new(ctx: &Arc<Context>) -> Result<CompChannel> {
        // SAFETY: open context (the Arc keeps it so).
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| {
            Error::last_os(Op::CreateCq, format!("{} (completion channel)", ctx.name()))
        })?;
        Ok(CompChannel {
            ch,
            ctx: ctx.clone(),
        })
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: its CQ was destroyed first (RawQp's Drop runs before its fields drop), every
        // event taken from it was acknowledged, and the context is open (`self.ctx`, released
        // only after this).
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if rc != 0 {
            eprintln!(
                "rdma-dmabuf: ibv_destroy_comp_channel on {} failed: {rc}",
                self.ctx.name()
            );
        }
    }
}

impl RawQp {
    fn qpn(&self) -> u32 {
        // SAFETY: the QP is live; qp_num is a plain field.
        unsafe { self.qp.as_ref() }.qp_num
    }

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: u32, to: &str) -> Result<()> {
        // SAFETY: live QP; `attr` valid for the call; `mask` names the fields set.
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

    /// The cm parts of a queue pair created by `rdma_create_qp`.
    pub(crate) fn cm_parts(&self) -> &crate::cm::CmParts {
        self.cm.as_ref().expect("created with rdma_create_qp")
    }

    fn to_error_state(&self) {
        // SAFETY: ibv_qp_attr is plain; zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        let _ = self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0, "ERR");
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        match &self.cm {
            // SAFETY: the QP was created by rdma_create_qp on this id; destroyed once. After it
            // returns the NIC no longer touches any buffer posted on it.
            Some(cm) => unsafe { ffi::rdma_destroy_qp(cm.id()) },
            None => {
                // SAFETY: destroyed once, before the CQ it uses; same guarantee as above.
                let rc = unsafe { ffi::ibv_destroy_qp(self.qp.as_ptr()) };
                if rc != 0 {
                    eprintln!(
                        "rdma-dmabuf: ibv_destroy_qp on {} failed: {rc}",
                        self.pd.context().name()
                    );
                }
            }
        }
        // SAFETY: the only QP using this CQ was destroyed just above; the context is open
        // (`self.pd` holds it until the fields drop, after this).
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            eprintln!(
                "rdma-dmabuf: ibv_destroy_cq on {} failed: {rc}",
                self.pd.context().name()
            );
        }
        // The fields drop next, in order: the completion channel, the cm id and its event
        // channel, then the protection domain (and with it, perhaps, the context).
    }
}

/// A queue pair in INIT: tell the peer [`PreparedQp::endpoint`], then
/// [`PreparedQp::connect`] with theirs.
pub struct PreparedQp {
    raw: RawQp,
    port: u8,
    gid_index: u32,
    local: Endpoint,
    send_depth: u32,
    recv_depth: u32,
    retry: Retry,
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
    /// [`Error::Verbs`] from `ibv_modify_qp` (e.g. a GID index without a RoCEv2 GID).
    pub fn connect(self, remote: &Endpoint) -> Result<QueuePair> {
        use ffi::ibv_qp_attr_mask as M;
        // SAFETY: ibv_qp_attr is plain; zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
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
        attr.ah_attr.grh.hop_limit = 64;
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
        Ok(QueuePair {
            slots: RefCell::new(Slots::new(self.send_depth, self.recv_depth)),
            raw: self.raw,
            local: self.local,
            remote: *remote,
        })
    }
}

/// A connected RC queue pair with its own completion queue.
///
/// It is `Send` but not `Sync`: one thread posts and polls at a time, and no lock is taken on
/// the hot path. [`Pending`] handles borrow it, so it outlives every one of them.
pub struct QueuePair {
    raw: RawQp,
    slots: RefCell<Slots>,
    local: Endpoint,
    remote: Endpoint,
}

impl fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

/// Part of a region to post: `[offset, offset + len)` of `region`.
#[derive(Debug)]
pub struct Local<B: Backing> {
    region: MemoryRegion<B>,
    offset: u64,
    len: u64,
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

/// A finished request: the region back, and what the completion said.
#[derive(Debug)]
pub struct Done<B: Backing> {
    /// The region, back with the CPU.
    pub region: MemoryRegion<B>,
    /// The completion.
    pub wc: WorkCompletion,
}

/// A request that was refused or failed, with its region back.
#[derive(Debug)]
pub struct WorkError<B: Backing> {
    /// What went wrong.
    pub error: Error,
    /// The region, back with the CPU.
    pub region: MemoryRegion<B>,
}

impl<B: Backing> fmt::Display for WorkError<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<B: Backing> std::error::Error for WorkError<B> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// How a posted request ended.
pub type Outcome<B> = std::result::Result<Done<B>, WorkError<B>>;

impl QueuePair {
    /// This side's endpoint.
    pub fn endpoint(&self) -> Endpoint {
        self.local
    }

    /// The peer's endpoint.
    pub fn remote_endpoint(&self) -> Endpoint {
        self.remote
    }

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
                self.post_raw(
                    kind,
                    r.addr() + local.offset,
                    local.len as u32,
                    r.lkey(),
                    remote,
                    imm,
                )
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
    /// The caller guarantees that `addr..addr + len` (in the region with `lkey`) stays
    /// registered and owned until the request's completion: the owned layer by moving the
    /// region into the `Pending`, the scoped layer by borrowing it for a scope that drains.
    fn post_raw(
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
            unsafe { ffi::ibv_post_recv(self.raw.qp.as_ptr(), &mut wr, &mut bad) }
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
            // SAFETY: as for the receive above; remote addresses are checked by the NIC.
            unsafe { ffi::ibv_post_send(self.raw.qp.as_ptr(), &mut wr, &mut bad) }
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

    /// Posts a request whose buffer the caller keeps alive until its completion (the scoped
    /// layer's contract); returns its slot.
    pub(crate) fn post_borrowed<B: Backing>(
        &self,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        offset: u64,
        len: u64,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<(u32, u32)> {
        self.check(kind, region, offset, len, remote)?;
        self.post_raw(
            kind,
            region.addr() + offset,
            len as u32,
            region.lkey(),
            remote,
            imm,
        )
    }

    /// Moves the queue pair to the error state: everything in flight completes, flushed.
    /// rdma_cm connections are disconnected (which tells the peer) and moved to ERR as well,
    /// in case the disconnect fails (a connection that is not established).
    pub(crate) fn flush(&self) {
        if let Some(cm) = &self.raw.cm {
            cm.disconnect();
        }
        self.raw.to_error_state();
    }

    /// The completion of slot `index` (generation `gen`), if it has arrived.
    pub(crate) fn take_completion(&self, index: u32, gen: u32) -> Option<RawCompletion> {
        self.slots.borrow_mut().take(index, gen)
    }

    /// A completion as a result: the work completion, or a typed error.
    pub(crate) fn completion_result(
        &self,
        index: u32,
        gen: u32,
        kind: WorkKind,
        c: RawCompletion,
    ) -> Result<WorkCompletion> {
        if c.status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            return Err(completion_error(index, gen, kind, c));
        }
        Ok(WorkCompletion {
            wr_id: wr_id(index, gen),
            kind,
            byte_len: c.byte_len,
            imm: c.imm,
        })
    }

    /// Polls the completion queue once, recording what arrived. Returns how many
    /// completions were consumed. No allocation, no lock.
    ///
    /// # Errors
    /// [`Error::Verbs`] if `ibv_poll_cq` fails.
    pub fn poll(&self) -> Result<usize> {
        const BATCH: usize = 16;
        let mut wcs: [MaybeUninit<ffi::ibv_wc>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        // SAFETY: live CQ; `wcs` has room for BATCH entries.
        let n = unsafe {
            ffi::ibv_poll_cq(self.raw.cq.as_ptr(), BATCH as i32, wcs.as_mut_ptr().cast())
        };
        if n < 0 {
            return Err(Error::from_errno(
                Op::PollCq,
                self.raw.pd.context().name(),
                -n,
            ));
        }
        for wc in &wcs[..n as usize] {
            // SAFETY: ibv_poll_cq initialised the first `n` entries.
            let wc = unsafe { wc.assume_init_ref() };
            let with_imm = wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            let c = RawCompletion {
                status: wc.status,
                byte_len: wc.byte_len,
                // SAFETY: with IBV_WC_WITH_IMM set the union holds the immediate.
                imm: with_imm
                    .then(|| u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })),
                vendor_err: wc.vendor_err,
            };
            let released = self.slots.borrow_mut().complete(wc.wr_id, c);
            // An abandoned buffer whose request just completed: safe to free now.
            drop(released);
        }
        Ok(n as usize)
    }

    /// Sleeps until the completion queue has something, or `timeout` passes: arms the
    /// notification, re-polls (a completion may have come before arming), then waits on the
    /// channel's fd and acknowledges the event. Without a channel it yields once.
    fn sleep_for_completion(&self, timeout: Duration) -> Result<()> {
        let Some(ch) = &self.raw.channel else {
            std::thread::yield_now();
            return Ok(());
        };
        // SAFETY: live CQ with a channel.
        let rc = unsafe { ffi::ibv_req_notify_cq(self.raw.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::from_errno(Op::PollCq, "ibv_req_notify_cq", rc));
        }
        if self.poll()? > 0 {
            return Ok(());
        }
        // SAFETY: the channel is live; `fd` is a plain field.
        let fd = unsafe { ch.ch.as_ref() }.fd;
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, poll_ms(timeout)) };
        if n > 0 {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the fd is readable, so an event is queued and this does not block.
            if unsafe { ffi::ibv_get_cq_event(ch.ch.as_ptr(), &mut cq, &mut ctx) } == 0 {
                // SAFETY: acknowledges the one event just taken, on its CQ.
                unsafe { ffi::ibv_ack_cq_events(cq, 1) };
            }
        }
        Ok(())
    }

    /// Requests posted and not yet completed, including those whose [`Pending`] was dropped.
    pub fn outstanding(&self) -> usize {
        self.slots.borrow().outstanding()
    }
}

impl QueuePair {
    /// A queue pair the connection manager connected.
    pub(crate) fn from_cm(raw: RawQp, send_depth: u32, recv_depth: u32) -> QueuePair {
        let local = Endpoint {
            qpn: raw.qpn(),
            psn: 0,
            lid: 0,
            gid: Gid::default(),
            mtu: crate::device::Mtu::Mtu1024,
        };
        QueuePair {
            slots: RefCell::new(Slots::new(send_depth, recv_depth)),
            raw,
            local,
            remote: local,
        }
    }

    /// For an rdma_cm connection: waits until the peer disconnects (the
    /// `RDMA_CM_EVENT_DISCONNECTED` event), for at most `timeout`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a queue pair connected by endpoint exchange;
    /// [`Error::Verbs`] with `ETIMEDOUT` or for an unexpected event.
    pub fn wait_disconnected(&self, timeout: Duration) -> Result<()> {
        match &self.raw.cm {
            Some(cm) => cm.wait_disconnected(timeout),
            None => Err(Error::invalid(Op::Cm, "not an rdma_cm connection")),
        }
    }
}

/// The instant `timeout` from now; `None` (no deadline) when it lies past what [`Instant`]
/// can hold, as `Duration::MAX` does.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// The time left until `deadline` (`Duration::MAX` without one).
pub(crate) fn time_left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    })
}

/// `timeout` as `poll(2)`'s milliseconds: rounded up (so a wait of less than a millisecond
/// sleeps rather than spins) and clamped to `i32::MAX` (about 24.8 days; callers loop).
pub(crate) fn poll_ms(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
}

/// A completion with an error status as a typed error naming the request.
fn completion_error(index: u32, gen: u32, kind: WorkKind, c: RawCompletion) -> Error {
    // SAFETY: ibv_wc_status_str takes any value.
    let text = unsafe { ffi::ibv_wc_status_str(c.status) };
    // SAFETY: it returns a static NUL-terminated string.
    let text = unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    Error::Completion {
        wr_id: wr_id(index, gen),
        kind,
        status: c.status,
        status_text: text,
        vendor_err: c.vendor_err,
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Flush everything in flight, wait (bounded) for the flush completions, destroy.
        match &self.raw.cm {
            // rdma_disconnect moves the QP to the error state and tells the peer.
            Some(cm) => cm.disconnect(),
            None => self.raw.to_error_state(),
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.outstanding() > 0 && Instant::now() < deadline {
            if self.poll().is_err() {
                break;
            }
        }
        // `raw` is dropped before `slots` (field order): the QP is destroyed first, after
        // which the NIC can reach no buffer, and only then are abandoned buffers freed.
    }
}

/// A posted request; [`Pending::wait`] returns its region with the completion.
///
/// Dropping it before completion is safe: the region stays with the queue pair until the NIC
/// is done with it (its completion, or the flush when the queue pair is destroyed).
#[must_use = "dropping a Pending leaves its region with the queue until the request completes"]
pub struct Pending<'q, B: Backing> {
    qp: &'q QueuePair,
    index: u32,
    gen: u32,
    kind: WorkKind,
    local: Option<Local<B>>,
}

impl<B: Backing> fmt::Debug for Pending<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("wr_id", &wr_id(self.index, self.gen))
            .field("kind", &self.kind)
            .finish()
    }
}

impl<'q, B: Backing> Pending<'q, B> {
    /// The request's `wr_id`.
    pub fn wr_id(&self) -> u64 {
        wr_id(self.index, self.gen)
    }

    /// Polls once; the outcome if the request has completed, else the handle back.
    ///
    /// # Errors
    /// `Err(self)` while the request is still in flight.
    pub fn try_complete(mut self) -> std::result::Result<Outcome<B>, Self> {
        let taken = self.qp.slots.borrow_mut().take(self.index, self.gen);
        let c = match taken {
            Some(c) => c,
            None => {
                if self.qp.poll().is_err() {
                    // A broken CQ: the request may still be in flight, so the handle (and
                    // with it the region) stays pending.
                    return Err(self);
                }
                match self.qp.slots.borrow_mut().take(self.index, self.gen) {
                    Some(c) => c,
                    None => return Err(self),
                }
            }
        };
        let local = self.local.take().expect("present until completion");
        Ok(
            match self
                .qp
                .completion_result(self.index, self.gen, self.kind, c)
            {
                Ok(wc) => Ok(Done {
                    region: local.region,
                    wc,
                }),
                Err(error) => Err(WorkError {
                    error,
                    region: local.region,
                }),
            },
        )
    }

    /// Busy-polls until the request completes.
    pub fn wait(self) -> Outcome<B> {
        let mut p = self;
        let mut spins = 0u32;
        loop {
            match p.try_complete() {
                Ok(outcome) => return outcome,
                Err(again) => p = again,
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Waits for the completion sleeping in the kernel on the completion channel (see
    /// [`QueuePairBuilder::completion_channel`]), for at most `timeout` (`Duration::MAX`, or
    /// any timeout past what [`Instant`] can hold, waits for as long as it takes); without a
    /// channel it polls, yielding between polls.
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout` or the notification
    /// cannot be armed.
    pub fn wait_blocking(self, timeout: Duration) -> std::result::Result<Outcome<B>, Self> {
        let deadline = deadline_after(timeout);
        let mut p = self;
        loop {
            match p.try_complete() {
                Ok(outcome) => return Ok(outcome),
                Err(again) => p = again,
            }
            let left = time_left(deadline);
            if left.is_zero() || p.qp.sleep_for_completion(left).is_err() {
                return Err(p);
            }
        }
    }

    /// As [`Pending::wait`], for at most `timeout` (`Duration::MAX` waits for as long as it
    /// takes, as `wait` does).
    ///
    /// # Errors
    /// `Err(self)` if the request is still in flight after `timeout`.
    pub fn wait_timeout(self, timeout: Duration) -> std::result::Result<Outcome<B>, Self> {
        let deadline = deadline_after(timeout);
        let mut p = self;
        loop {
            match p.try_complete() {
                Ok(outcome) => return Ok(outcome),
                Err(again) if time_left(deadline).is_zero() => return Err(again),
                Err(again) => p = again,
            }
            std::thread::yield_now();
        }
    }
}

impl<B: Backing> Drop for Pending<'_, B> {
    fn drop(&mut self) {
        if let Some(local) = self.local.take() {
            let back = self
                .qp
                .slots
                .borrow_mut()
                .abandon(self.index, self.gen, Box::new(local));
            // Completed already: the NIC is done with it, free it now (outside the borrow).
            drop(back);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_and_clamp() {
        assert_eq!(poll_ms(Duration::ZERO), 0);
        assert_eq!(poll_ms(Duration::from_nanos(1)), 1);
        assert_eq!(poll_ms(Duration::from_micros(1500)), 2);
        assert_eq!(
            poll_ms(Duration::from_millis(i32::MAX as u64 + 1)),
            i32::MAX
        );
        assert_eq!(poll_ms(Duration::MAX), i32::MAX);
    }

    #[test]
    fn deadlines_saturate() {
        assert_eq!(deadline_after(Duration::MAX), None);
        assert_eq!(time_left(None), Duration::MAX);
        let d = deadline_after(Duration::from_secs(60));
        assert!(time_left(d) <= Duration::from_secs(60) && !time_left(d).is_zero());
        assert!(time_left(deadline_after(Duration::ZERO)).is_zero());
    }

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
