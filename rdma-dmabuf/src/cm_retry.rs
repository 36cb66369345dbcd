//! Connecting to a server that may not be listening yet: [`CmConnector::connect_retrying`].

use crate::cm::CmConnector;
use crate::deadline::{deadline_after, time_left};
use crate::error::{ErrorKind, Result};
use crate::qp::{QueuePair, QueuePairBuilder};
use std::time::Duration;

/// The first pause between two tries; each later pause doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// The longest pause between two tries.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// Whether a failed connect is worth another try: the server rejected it (nobody listening
/// on that port yet) or never answered (its process is starting or restarting).
fn worth_retrying(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Refused | ErrorKind::Unreachable)
}

impl CmConnector {
    /// As [`CmConnector::connect`], but a connection the server refuses or does not answer
    /// ([`ErrorKind::Refused`], [`ErrorKind::Unreachable`]: it is not listening yet) is tried
    /// again, after a pause that grows from 50 ms to 1 s, until `patience` has passed. Each
    /// try resolves a fresh id towards the same peer (rdma_cm takes one connect per id); the
    /// queue pair is built from `qp` every time, so its protection domain, made once from
    /// [`CmConnector::context`], and the regions registered in it serve every try.
    ///
    /// Every try is bounded by `timeout`, and the whole by `patience` plus one `timeout`.
    ///
    /// # Errors
    /// The last try's error once `patience` has passed, or at once an error of another kind
    /// (a timed-out step, a device error, a refused argument).
    pub fn connect_retrying(
        self,
        qp: QueuePairBuilder,
        private: &[u8],
        timeout: Duration,
        patience: Duration,
    ) -> Result<(QueuePair, Vec<u8>)> {
        let deadline = deadline_after(patience);
        let peer = self.peer();
        let mut connector = self;
        let mut pause = FIRST_PAUSE;
        loop {
            match connector.connect(qp.clone(), private, timeout) {
                Err(e) if worth_retrying(e.kind()) && time_left(deadline) > pause => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(MAX_PAUSE);
                    connector = CmConnector::resolve(peer, timeout)?;
                }
                done => return done,
            }
        }
    }

    /// As [`CmConnector::connect_retrying`], awaiting each try and pause on tokio (the
    /// `tokio` feature).
    ///
    /// # Errors
    /// As [`CmConnector::connect_retrying`].
    #[cfg(feature = "tokio")]
    pub async fn connect_retrying_async(
        self,
        qp: QueuePairBuilder,
        private: &[u8],
        timeout: Duration,
        patience: Duration,
    ) -> Result<(QueuePair, Vec<u8>)> {
        let deadline = deadline_after(patience);
        let peer = self.peer();
        let mut connector = self;
        let mut pause = FIRST_PAUSE;
        loop {
            match connector.connect_async(qp.clone(), private, timeout).await {
                Err(e) if worth_retrying(e.kind()) && time_left(deadline) > pause => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                    connector = CmConnector::resolve_async(peer, timeout).await?;
                }
                done => return done,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_refused_or_unanswered_connect_is_tried_again() {
        assert!(worth_retrying(ErrorKind::Refused));
        assert!(worth_retrying(ErrorKind::Unreachable));
        for k in [
            ErrorKind::TimedOut,
            ErrorKind::InvalidInput,
            ErrorKind::NoDevice,
            ErrorKind::Other,
        ] {
            assert!(!worth_retrying(k), "{k:?}");
        }
    }
}
