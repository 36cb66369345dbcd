//! Awaiting a [`Transfer`] on tokio (the `tokio` feature): [`Transfer::finished`].
//!
//! The future is woken by the worker that finishes the batch (the waker is kept in the
//! batch's shared state), never polled on a timer; tokio's timer only bounds the wait.

use crate::error::{Error, Result};
use crate::progress::{Progress, Transfer};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Resolves when the worker finishes the batch; see [`Transfer::finished`].
struct Finished<'t> {
    progress: &'t Progress,
}

impl Future for Finished<'_> {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match self.progress.poll_finished(cx.waker()) {
            Some(r) => Poll::Ready(r),
            None => Poll::Pending,
        }
    }
}

impl Transfer {
    /// Awaits the batch for at most `timeout`: the async form of [`Transfer::wait`], with
    /// the same result. The task sleeps until the worker finishes the batch and wakes it.
    /// Needs a tokio runtime with its timer enabled (`enable_time`) for the bound.
    ///
    /// There is deliberately no unbounded `impl Future for Transfer`: a batch to a peer
    /// that stops answering ends within [`Settings::peer_failure_bound`](crate::Settings)
    /// of its chunks, but a caller's bound is the one that counts.
    ///
    /// # Errors
    /// [`Error::Timeout`] if it has not finished; [`Error::EntryFailed`] with the first
    /// failed entry; the notification's error if it was not delivered.
    pub async fn finished(&self, timeout: Duration) -> Result<()> {
        let f = Finished {
            progress: &self.progress,
        };
        tokio::time::timeout(timeout, f)
            .await
            .unwrap_or(Err(Error::Timeout(timeout)))
    }
}
