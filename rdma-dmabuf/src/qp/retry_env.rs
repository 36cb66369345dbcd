//! Transport retry defaults taken from the environment, for fabrics whose round trips are far
//! slower than a NIC's: emulated machines (the testbed VMs under a busy host) or long links.
//!
//! The variables change only the defaults that [`QueuePairBuilder::new`] starts from; a value
//! a program sets with [`QueuePairBuilder::ack_timeout`] or
//! [`QueuePairBuilder::retry_count`] wins. Both stay finite and bounded: the environment
//! accepts an ACK timeout exponent of 1 to [`MAX_ENV_ACK_TIMEOUT`] and a retry count of 0 to
//! [`MAX_ENV_RETRY_COUNT`], so a dead peer fails a request within 8 minutes at most (the
//! specification's bound, [`QueuePairBuilder::retry_budget`]; soft-RoCE takes a quarter of
//! it). A value that is not UTF-8, not a number or outside its range is refused with
//! [`Error::Setting`](crate::Error::Setting) when the queue pair is built: a typo must not
//! fall back to the short defaults in silence. A retry count of 7, which soft-RoCE reads as
//! "forever", and longer timeouts take an explicit builder call. NCCL's
//! `NCCL_IB_TIMEOUT` and `NCCL_IB_RETRY_CNT` are the same knobs.
//!
//! [`QueuePairBuilder::new`]: super::QueuePairBuilder::new
//! [`QueuePairBuilder::ack_timeout`]: super::QueuePairBuilder::ack_timeout
//! [`QueuePairBuilder::retry_count`]: super::QueuePairBuilder::retry_count
//! [`QueuePairBuilder::retry_budget`]: super::QueuePairBuilder::retry_budget

use super::retry::Retry;
use crate::error::Error;
use std::ffi::OsString;

/// Environment variable holding the default ACK timeout exponent (`ibv_qp_attr.timeout`,
/// 1 to [`MAX_ENV_ACK_TIMEOUT`]) of new queue pairs, in place of
/// [`DEFAULT_ACK_TIMEOUT`](super::DEFAULT_ACK_TIMEOUT).
pub const ACK_TIMEOUT_ENV: &str = "RDMA_DMABUF_ACK_TIMEOUT";

/// Environment variable holding the default transport retry count (`ibv_qp_attr.retry_cnt`,
/// 0 to [`MAX_ENV_RETRY_COUNT`]) of new queue pairs, in place of
/// [`DEFAULT_RETRY_COUNT`](super::DEFAULT_RETRY_COUNT).
pub const RETRY_COUNT_ENV: &str = "RDMA_DMABUF_RETRY_COUNT";

/// The largest ACK timeout exponent [`ACK_TIMEOUT_ENV`] accepts: 4 × 4.096 µs × 2^22 ≈ 68.7 s
/// per try at most, so with [`MAX_ENV_RETRY_COUNT`] a request fails within 481 s.
pub const MAX_ENV_ACK_TIMEOUT: u8 = 22;

/// The largest retry count [`RETRY_COUNT_ENV`] accepts: 7 means "retry forever" on
/// soft-RoCE, so it takes [`QueuePairBuilder::retry_count`](super::QueuePairBuilder::retry_count).
pub const MAX_ENV_RETRY_COUNT: u8 = 6;

const ACK_ACCEPTED: &str = "an ACK timeout exponent from 1 to 22 (4.096 us x 2^t per try; 0 \
    would wait forever, and longer timeouts take QueuePairBuilder::ack_timeout)";
const RETRY_ACCEPTED: &str = "a retry count from 0 to 6 (7 is read as forever by soft-RoCE: \
    ask for it with QueuePairBuilder::retry_count)";

/// The ACK timeout exponent and transport retry count a new queue pair starts from
/// ([`DEFAULT_ACK_TIMEOUT`](super::DEFAULT_ACK_TIMEOUT) and
/// [`DEFAULT_RETRY_COUNT`](super::DEFAULT_RETRY_COUNT), with [`ACK_TIMEOUT_ENV`] and
/// [`RETRY_COUNT_ENV`] applied), for a layer above that must state its own bounds before it
/// builds a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TransportRetry {
    /// The ACK timeout exponent (4.096 µs × 2^t per try).
    pub ack_timeout: u8,
    /// How many times an unacknowledged request is sent again.
    pub retry_count: u8,
}

impl TransportRetry {
    /// The defaults of [`QueuePairBuilder::new`](super::QueuePairBuilder::new), the
    /// environment's values applied.
    ///
    /// # Errors
    /// [`Error::Setting`] for a variable that is set but unusable, as `build` would refuse.
    pub fn from_environment() -> crate::error::Result<TransportRetry> {
        let (r, bad) = apply(Retry::default());
        match bad {
            Some(b) => Err(b.to_error()),
            None => Ok(TransportRetry {
                ack_timeout: r.ack_timeout,
                retry_count: r.retry_count,
            }),
        }
    }

    /// The longest a request can stay unacknowledged with these values before it fails:
    /// [`QueuePairBuilder::retry_budget`](super::QueuePairBuilder::retry_budget)'s bound.
    pub fn budget(&self) -> std::time::Duration {
        Retry {
            ack_timeout: self.ack_timeout,
            retry_count: self.retry_count,
            ..Retry::default()
        }
        .transport_budget()
    }
}

/// A variable that is set but unusable: kept by the builder (which is `Clone`) and turned
/// into [`Error::Setting`] when it builds.
#[derive(Clone, Debug)]
pub(crate) struct Refusal {
    variable: &'static str,
    value: String,
    why: &'static str,
    accepted: &'static str,
}

impl Refusal {
    /// The error the builder returns.
    pub(crate) fn to_error(&self) -> Error {
        Error::Setting {
            variable: self.variable,
            value: self.value.clone(),
            why: self.why,
            accepted: self.accepted,
        }
    }
}

/// `defaults` with the environment's values applied, and the first variable that is set but
/// unusable (the builder refuses to build with it).
pub(crate) fn apply(defaults: Retry) -> (Retry, Option<Refusal>) {
    apply_from(defaults, |name| std::env::var_os(name))
}

/// [`apply`] with the environment given as a lookup.
fn apply_from(
    mut retry: Retry,
    var: impl Fn(&str) -> Option<OsString>,
) -> (Retry, Option<Refusal>) {
    let mut bad = None;
    for (name, slot, range, accepted) in [
        (
            ACK_TIMEOUT_ENV,
            &mut retry.ack_timeout,
            1..=MAX_ENV_ACK_TIMEOUT,
            ACK_ACCEPTED,
        ),
        (
            RETRY_COUNT_ENV,
            &mut retry.retry_count,
            0..=MAX_ENV_RETRY_COUNT,
            RETRY_ACCEPTED,
        ),
    ] {
        let Some(raw) = var(name) else { continue };
        let refuse = |why: &'static str| Refusal {
            variable: name,
            value: raw.as_encoded_bytes().escape_ascii().to_string(),
            why,
            accepted,
        };
        let parsed = match raw.to_str() {
            None => Err(refuse("not UTF-8")),
            Some(text) => match text.trim().parse::<u8>() {
                Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => {
                    Err(refuse("out of range"))
                }
                Err(_) => Err(refuse("not a number")),
                Ok(v) if !range.contains(&v) => Err(refuse("out of range")),
                Ok(v) => Ok(v),
            },
        };
        match parsed {
            Ok(v) => *slot = v,
            Err(e) => {
                bad.get_or_insert(e);
            }
        }
    }
    (retry, bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::ffi::OsStrExt;

    fn env(pairs: &'static [(&'static str, &'static [u8])]) -> impl Fn(&str) -> Option<OsString> {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::ffi::OsStr::from_bytes(v).to_owned())
        }
    }

    #[test]
    fn the_environment_replaces_the_defaults() {
        let (r, bad) = apply_from(Retry::default(), env(&[]));
        assert_eq!(r, Retry::default());
        assert!(bad.is_none());
        let (r, bad) = apply_from(
            Retry::default(),
            env(&[(ACK_TIMEOUT_ENV, b"19"), (RETRY_COUNT_ENV, b" 5 ")]),
        );
        assert_eq!((r.ack_timeout, r.retry_count), (19, 5));
        assert!(bad.is_none());
        assert_eq!(r.rnr_retry, Retry::default().rnr_retry);
        let (r, _) = apply_from(
            Retry::default(),
            env(&[(ACK_TIMEOUT_ENV, b"22"), (RETRY_COUNT_ENV, b"6")]),
        );
        assert!(r.transport_budget() <= std::time::Duration::from_secs(482));
    }

    #[test]
    fn unreadable_unparsable_and_unbounded_values_are_typed_errors() {
        type Vars = &'static [(&'static str, &'static [u8])];
        let cases: [(Vars, &str, &str); 8] = [
            (
                &[(ACK_TIMEOUT_ENV, b"99999999999")],
                ACK_TIMEOUT_ENV,
                "out of range",
            ),
            (
                &[(ACK_TIMEOUT_ENV, b"\xff\xfe")],
                ACK_TIMEOUT_ENV,
                "not UTF-8",
            ),
            (&[(RETRY_COUNT_ENV, b"6\xff")], RETRY_COUNT_ENV, "not UTF-8"),
            (
                &[(ACK_TIMEOUT_ENV, b"slow")],
                ACK_TIMEOUT_ENV,
                "not a number",
            ),
            (&[(ACK_TIMEOUT_ENV, b"0")], ACK_TIMEOUT_ENV, "out of range"),
            (&[(ACK_TIMEOUT_ENV, b"31")], ACK_TIMEOUT_ENV, "out of range"),
            (&[(RETRY_COUNT_ENV, b"7")], RETRY_COUNT_ENV, "out of range"),
            (&[(RETRY_COUNT_ENV, b"")], RETRY_COUNT_ENV, "not a number"),
        ];
        for (vars, name, why) in cases {
            let (r, bad) = apply_from(Retry::default(), env(vars));
            let bad = bad.map(|b| b.to_error());
            let Some(Error::Setting {
                variable,
                why: got,
                accepted,
                ..
            }) = &bad
            else {
                panic!("{vars:?} accepted: {bad:?}");
            };
            assert_eq!((*variable, *got), (name, why), "{vars:?}");
            assert!(accepted.contains("from"), "{accepted}");
            assert_eq!(r, Retry::default(), "{vars:?} changed a default");
        }
        let (_, bad) = apply_from(Retry::default(), env(&[(ACK_TIMEOUT_ENV, b"\xff\xfe")]));
        let text = bad.unwrap().to_error().to_string();
        assert!(
            text.contains(r#"RDMA_DMABUF_ACK_TIMEOUT="\xff\xfe": not UTF-8"#),
            "{text}"
        );
    }
}
