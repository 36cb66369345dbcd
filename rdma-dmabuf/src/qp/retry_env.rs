//! Transport retry defaults taken from the environment, for fabrics whose round trips are far
//! slower than a NIC's: emulated machines (the testbed VMs under a busy host) or long links.
//!
//! The variables change only the defaults that [`QueuePairBuilder::new`] starts from; a value
//! a program sets with [`QueuePairBuilder::ack_timeout`] or
//! [`QueuePairBuilder::retry_count`] wins. Both stay finite: the ACK timeout's checks (1 to
//! 31, never 0) and the retry count's (0 to 7) apply to them as to any other value, so a dead
//! peer still fails a request within [`QueuePairBuilder::retry_budget`]. NCCL's
//! `NCCL_IB_TIMEOUT` and `NCCL_IB_RETRY_CNT` are the same knobs.
//!
//! [`QueuePairBuilder::new`]: super::QueuePairBuilder::new
//! [`QueuePairBuilder::ack_timeout`]: super::QueuePairBuilder::ack_timeout
//! [`QueuePairBuilder::retry_count`]: super::QueuePairBuilder::retry_count
//! [`QueuePairBuilder::retry_budget`]: super::QueuePairBuilder::retry_budget

use super::retry::Retry;

/// Environment variable holding the default ACK timeout exponent (`ibv_qp_attr.timeout`,
/// 1 to 31) of new queue pairs, in place of
/// [`DEFAULT_ACK_TIMEOUT`](super::DEFAULT_ACK_TIMEOUT).
pub const ACK_TIMEOUT_ENV: &str = "RDMA_DMABUF_ACK_TIMEOUT";

/// Environment variable holding the default transport retry count (`ibv_qp_attr.retry_cnt`,
/// 0 to 7) of new queue pairs, in place of
/// [`DEFAULT_RETRY_COUNT`](super::DEFAULT_RETRY_COUNT).
pub const RETRY_COUNT_ENV: &str = "RDMA_DMABUF_RETRY_COUNT";

/// `defaults` with the environment's values applied, and a description of the first variable
/// that is set but not a number (the builder refuses to build with it: a typo must not
/// silently fall back to the short defaults).
pub(crate) fn apply(defaults: Retry) -> (Retry, Option<String>) {
    apply_from(defaults, |name| std::env::var(name).ok())
}

/// [`apply`] with the environment given as a lookup.
fn apply_from(mut retry: Retry, var: impl Fn(&str) -> Option<String>) -> (Retry, Option<String>) {
    let mut bad = None;
    for (name, slot) in [
        (ACK_TIMEOUT_ENV, &mut retry.ack_timeout),
        (RETRY_COUNT_ENV, &mut retry.retry_count),
    ] {
        let Some(text) = var(name) else { continue };
        match text.trim().parse::<u8>() {
            Ok(v) => *slot = v,
            Err(_) => {
                bad.get_or_insert(format!("{name}={text:?} is not a number from 0 to 255"));
            }
        }
    }
    (retry, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_replaces_the_defaults_and_a_typo_is_reported() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let (r, bad) = apply_from(Retry::default(), env(&[]));
        assert_eq!((r, bad), (Retry::default(), None));
        let (r, bad) = apply_from(
            Retry::default(),
            env(&[(ACK_TIMEOUT_ENV, "19"), (RETRY_COUNT_ENV, " 5 ")]),
        );
        assert_eq!((r.ack_timeout, r.retry_count, bad), (19, 5, None));
        assert_eq!(r.rnr_retry, Retry::default().rnr_retry);
        let (r, bad) = apply_from(Retry::default(), env(&[(ACK_TIMEOUT_ENV, "slow")]));
        assert_eq!(r.ack_timeout, Retry::default().ack_timeout);
        assert!(bad.unwrap().contains("RDMA_DMABUF_ACK_TIMEOUT=\"slow\""));
        // Out-of-range numbers are kept: the builder's own checks refuse them at build.
        let (r, bad) = apply_from(Retry::default(), env(&[(ACK_TIMEOUT_ENV, "0")]));
        assert_eq!((r.ack_timeout, bad), (0, None));
    }
}
