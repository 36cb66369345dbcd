//! A queue pair's transport retries: the finite defaults, the receiver-not-ready timer, and
//! the checks and time budget of a setting.

use crate::error::{Error, Op, Result};
use std::time::Duration;

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
/// "forever": see [`QueuePairBuilder::rnr_retry_forever`](super::QueuePairBuilder::rnr_retry_forever).)
pub const DEFAULT_RNR_RETRY: u8 = 6;
/// The default minimum RNR timer code (the IB table's code 28, 163.84 ms) that this queue
/// pair asks a peer to wait after finding no receive posted: with the default RNR retry
/// count, a peer's send waits up to 6 × 163.84 ms ≈ 0.98 s for a receive.
pub const DEFAULT_MIN_RNR_TIMER: u8 = 28;

/// The default hop limit of the packets' global route header (RoCEv2: the IP TTL).
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// The RNR timer codes of the InfiniBand specification (table 45), in microseconds; code 0
/// is the longest.
pub(super) const RNR_TIMER_US: [u32; 32] = [
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

/// The value of [`QueuePairBuilder::rnr_retry_forever`](super::QueuePairBuilder::rnr_retry_forever): `rnr_retry = 7`.
pub(super) const RNR_RETRY_FOREVER: u8 = 7;

impl Retry {
    /// Refuses values the verbs would misread (a 3-bit count past 7, an infinite ACK timeout).
    pub(super) fn check(&self, forever: bool) -> Result<()> {
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
    pub(super) fn transport_budget(&self) -> Duration {
        let per_try_ns = 4096u64 << self.ack_timeout;
        Duration::from_nanos(per_try_ns.saturating_mul(4 * (u64::from(self.retry_count) + 1)))
    }
}
