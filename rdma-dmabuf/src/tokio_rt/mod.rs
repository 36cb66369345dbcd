//! tokio integration (the `tokio` feature): awaitable posts, fenced posts, rdma_cm
//! connections and device events, over the runtime-agnostic steps of [`crate::reactor`].
//!
//! * [`Pending`] and [`PartsPending`](crate::PartsPending) are futures:
//!   `qp.post_write(region, remote, None)?.await` resolves to the same
//!   [`Outcome`](crate::Outcome) as `wait()`, the region back. Posting is unchanged. So are
//!   [`InlinePending`](crate::InlinePending) (to its completion) and
//!   [`SrqPending`](crate::SrqPending) (a receive on a shared receive queue, woken through
//!   the shared queue's own completion channel).
//! * Several peers: a [`MultiChannel`](crate::MultiChannel)'s own operations are blocking
//!   (they borrow their regions in a scope); async code posts owned requests on its queue
//!   pairs ([`MultiChannel::peer`](crate::MultiChannel::peer)) and awaits them together
//!   (`tokio::join!`, one task per peer). A [`ScopedPending`](crate::ScopedPending) is a
//!   future too, for a runtime driven inside the scope's closure (`block_on` there): a scope
//!   is synchronous on purpose, since a future can be forgotten (`mem::forget`) and the
//!   borrows it held would then end while the NIC still used them; only a synchronous end
//!   can wait for the NIC before the borrow ends.
//! * [`QueuePair::post_fenced_async`](crate::QueuePair::post_fenced_async) awaits the
//!   dma-buf's implicit fences (its sync_file's fd on the reactor) before it posts.
//! * [`CmConnector::resolve_async`](crate::CmConnector::resolve_async),
//!   [`CmConnector::connect_async`](crate::CmConnector::connect_async) and
//!   [`CmListener::accept_async`](crate::CmListener::accept_async).
//! * [`AsyncEventStream`]: a device's asynchronous events as a [`Stream`](futures_core::Stream),
//!   each acknowledged; a fatal one flushes the queue pairs it concerns, so every task
//!   awaiting a request on them wakes with an error (and its region).
//!
//! # One task per queue pair, on a `LocalSet`
//!
//! A [`QueuePair`] is `Send` but not `Sync` (one thread posts and polls at a time, so the hot
//! path takes no lock), and a `Pending` borrows it. A future that holds a `Pending` across an
//! `.await` is therefore not `Send`, and `tokio::spawn` refuses it at compile time (a
//! compile-fail test proves it). The pattern that follows: each queue pair is owned by one
//! task, spawned with [`tokio::task::spawn_local`] on a [`tokio::task::LocalSet`] (on a
//! current-thread runtime, or one `LocalSet` per worker thread to use several cores); that
//! task posts, awaits, and talks to the rest of the program over channels. Everything that is
//! `Send` (connecting, the device event stream, the regions themselves) can run anywhere.
//!
//! Completions reach the reactor through the queue pair's completion channel: build queue
//! pairs with [`QueuePairBuilder::completion_channel`](crate::QueuePairBuilder::completion_channel)
//! (without one, an awaited request polls each time its task is scheduled and reschedules
//! itself: correct, but a busy loop). A queue pair registers its fds with the reactor of the
//! runtime that awaits it; awaited on another runtime later (a runtime per call, a queue pair
//! moved between threads), it registers them there instead (one `epoll_ctl` each way), so
//! an idle or dropped first runtime strands nothing.
//!
//! # What still blocks
//!
//! Registration (`MemoryRegion::register*`), queue pair bring-up and `spin`-style calls are
//! blocking system calls. Registering a dma-buf with the patched soft-RoCE opens a CPU-access
//! window, which waits for the buffer's pending fences (an unsignalled vgem fence: up to
//! vgem's 10 s timeout). Register before handing buffers to the runtime, or in
//! `tokio::task::spawn_blocking`; [`QueuePair::post_fenced_async`] is the awaited way to
//! respect fences at post time.
//!
//! # Cancel safety
//!
//! Dropping an awaited handle (a `select!` branch that lost, a `timeout` that fired) is
//! dropping the `Pending`: the region stays in the request's slot until its completion is
//! polled, or until the queue pair is destroyed (moved to the error state, the flush
//! drained, `ibv_destroy_qp`), and only then is it freed. It is never handed back or freed
//! while the NIC may still touch it. What a dropped `post_fenced_async` had not posted yet
//! is dropped with it (the NIC never had it).

use crate::deadline::reactor_error;
use crate::error::{Error, Op, Result};
use crate::fence::FencedOp;
use crate::mr::MemoryRegion;
use crate::part::Local;
use crate::qp::{Pending, QueuePair, WorkError};
use crate::reactor::{AsyncEvent, AsyncEvents};
use crate::sys::event::DeviceEvents;
use drm_export::DmaBuf;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::unix::AsyncFd;

impl QueuePair {
    /// As [`QueuePair::post_fenced`], awaiting the dma-buf's implicit fences on the reactor
    /// (their sync_file's fd turns readable when they signal) instead of blocking the thread,
    /// for at most `timeout`; then posts, and returns the request's handle (await it for the
    /// completion).
    ///
    /// Dropping the future before it posts drops the region with it: nothing was posted, so
    /// the NIC never had it.
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: [`Error::FenceTimeout`] (nothing was posted),
    /// [`Error::Fence`], or the post's own errors.
    // The error hands the region back by value, as every post does; boxing it would allocate.
    #[allow(clippy::result_large_err)]
    pub async fn post_fenced_async(
        &self,
        op: FencedOp,
        local: impl Into<Local<DmaBuf>>,
        timeout: Duration,
    ) -> std::result::Result<Pending<'_, DmaBuf>, WorkError<DmaBuf>> {
        let local = local.into();
        if let Err(error) = fences_signalled(local.region(), op, timeout).await {
            return Err(WorkError {
                error,
                region: local.into_region(),
            });
        }
        // The fences have signalled: post now, without exporting and polling them again.
        op.post(self, local)
    }
}

/// Waits on the reactor, at most `timeout`, for the fences a request of `op` on `region`
/// must respect.
async fn fences_signalled(
    region: &MemoryRegion<DmaBuf>,
    op: FencedOp,
    timeout: Duration,
) -> Result<()> {
    let sync = crate::fence::export_fences(region, op)?;
    let fence_err =
        |e: std::io::Error| reactor_error(Op::PostSend, "wait for the dma-buf's fences", &e);
    // The registration borrows `sync`'s fd: it is dropped (explicitly, below, and on every
    // early return) before `sync` closes the fd.
    let fd = crate::sys::fd::register(sync.as_fd()).map_err(fence_err)?;
    let wait = async {
        loop {
            let mut ready = fd.readable().await.map_err(fence_err)?;
            match sync.is_signalled() {
                Ok(true) => return Ok(()),
                Ok(false) => ready.clear_ready(),
                Err(e) => return Err(Error::Fence(Box::new(e))),
            }
        }
    };
    let out = match tokio::time::timeout(timeout, wait).await {
        Ok(r) => r,
        Err(_) => Err(Error::FenceTimeout {
            kind: op.kind(),
            timeout,
        }),
    };
    drop(fd);
    drop(sync);
    out
}

/// A device's asynchronous events as a [`Stream`](futures_core::Stream) on tokio's reactor
/// (see [`AsyncEvents`]): each acknowledged, fatal ones applied (their queue pairs flushed)
/// before they are yielded. `Send`: it may run in any task.
#[derive(Debug)]
pub struct AsyncEventStream {
    /// The registration of the events' fd, holding its own reference to the context (and so
    /// the fd) open.
    fd: AsyncFd<DeviceEvents>,
    events: AsyncEvents,
}

impl AsyncEvents {
    /// These events on the current runtime's reactor.
    ///
    /// # Errors
    /// [`Error::Verbs`] if the reactor refuses the fd, or outside a runtime.
    pub fn into_stream(self) -> Result<AsyncEventStream> {
        let what = format!("{} async events", self.context().name());
        tokio::runtime::Handle::try_current()
            .map_err(|_| Error::invalid(Op::QueryDevice, format!("{what}: no tokio runtime")))?;
        let fd = crate::sys::fd::register_owned(self.raw().clone())
            .map_err(|e| reactor_error(Op::QueryDevice, &what, &e))?;
        Ok(AsyncEventStream { fd, events: self })
    }
}

impl AsyncEventStream {
    /// The next event, once one arrives. Cancel safe: an event is read only when it is
    /// returned.
    ///
    /// # Errors
    /// As [`AsyncEvents::try_next`].
    pub async fn next(&mut self) -> Result<AsyncEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Polls for the next event.
    ///
    /// # Errors
    /// As [`AsyncEvents::try_next`].
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<AsyncEvent>> {
        loop {
            if let Some(ev) = self.events.try_next()? {
                return Poll::Ready(Ok(ev));
            }
            let mut ready = match self.fd.poll_read_ready(cx) {
                Poll::Ready(Ok(r)) => r,
                Poll::Ready(Err(e)) => {
                    return Poll::Ready(Err(reactor_error(Op::QueryDevice, "async events", &e)))
                }
                Poll::Pending => return Poll::Pending,
            };
            match self.events.try_next()? {
                Some(ev) => return Poll::Ready(Ok(ev)),
                None => ready.clear_ready(),
            }
        }
    }

    /// The events' source.
    pub fn events(&self) -> &AsyncEvents {
        &self.events
    }
}

impl futures_core::Stream for AsyncEventStream {
    type Item = Result<AsyncEvent>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx).map(Some)
    }
}
