//! The connection manager's own objects, below the connections of [`crate::cm`]: an event
//! channel (non-blocking, waited on with a deadline) and a cm id with its channel. Queue pairs
//! created through rdma_cm own their [`CmId`] (see `qp::raw`), so this module knows nothing
//! of queue pairs and both `qp` and `cm` build on it.
//!
//! The objects and their librdmacm calls are the raw layer's (`sys::cm`); this module keeps
//! the waits on them (deadlines, the reactor) and what their events mean.

use crate::deadline::{deadline_after, time_left, wait_readable};
use crate::device::Context;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::sys::cm::ConnectionEnd;
pub(crate) use crate::sys::cm::{event_name, Channel, CmId, Event};

impl Channel {
    /// Waits for the next event; fails unless it is `expect` with status 0.
    pub(crate) fn expect(
        &self,
        expect: ffi::rdma_cm_event_type::Type,
        timeout: Duration,
        step: &str,
    ) -> Result<Event> {
        let ev = self.next(timeout, step)?;
        check_event(ev, expect, step)
    }

    /// Waits on tokio's reactor (at most `timeout`) for the next event; fails unless it is
    /// `expect` with status 0. The fd is registered for the wait only.
    #[cfg(feature = "tokio")]
    pub(crate) async fn expect_async(
        &self,
        expect: ffi::rdma_cm_event_type::Type,
        timeout: Duration,
        step: &str,
    ) -> Result<Event> {
        self.until_async(timeout, step, || match self.try_next(step)? {
            Some(ev) => check_event(ev, expect, step).map(Some),
            None => Ok(None),
        })
        .await
    }

    /// Calls `ready` until it gives a value, waiting on tokio's reactor (at most `timeout`)
    /// for the channel to become readable between two calls; `ETIMEDOUT` naming `step`
    /// after `timeout`. The fd is registered for the wait only.
    #[cfg(feature = "tokio")]
    pub(crate) async fn until_async<T>(
        &self,
        timeout: Duration,
        step: &str,
        mut ready: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        use crate::deadline::reactor_error;
        let wait = async {
            // Registered for this block only: the registration borrows the channel's fd.
            let fd =
                crate::sys::fd::register(self.fd()).map_err(|e| reactor_error(Op::Cm, step, &e))?;
            loop {
                if let Some(v) = ready()? {
                    return Ok(v);
                }
                let mut readable = fd
                    .readable()
                    .await
                    .map_err(|e| reactor_error(Op::Cm, step, &e))?;
                match ready()? {
                    Some(v) => return Ok(v),
                    None => readable.clear_ready(),
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(r) => r,
            Err(_) => Err(Error::from_errno(
                Op::Cm,
                format!("{step}: no event within {timeout:?}"),
                libc::ETIMEDOUT,
            )),
        }
    }

    /// The next event and its status.
    fn next(&self, timeout: Duration, step: &str) -> Result<(Event, i32)> {
        // `Duration::MAX` (or any timeout past what `Instant` holds) means no deadline.
        let deadline = deadline_after(timeout);
        loop {
            if let Some(out) = self.try_next(step)? {
                return Ok(out);
            }
            self.wait_until(deadline, timeout, step)?;
        }
    }

    /// Waits until the channel's fd is readable or `deadline` (of a wait of `timeout`)
    /// passes: `ETIMEDOUT` naming `step` if it has passed already.
    fn wait_until(&self, deadline: Option<Instant>, timeout: Duration, step: &str) -> Result<()> {
        let left = time_left(deadline);
        if left.is_zero() {
            return Err(Error::from_errno(
                Op::Cm,
                format!("{step}: no event within {timeout:?}"),
                libc::ETIMEDOUT,
            ));
        }
        wait_readable(self.fd(), left)
            .map(drop)
            .map_err(|e| Error::from_errno(Op::Cm, format!("{step}: poll"), e as i32))
    }
}

/// `ev` if it is `expect` with status 0, else the error naming `step`.
pub(crate) fn check_event(
    ev: (Event, i32),
    expect: ffi::rdma_cm_event_type::Type,
    step: &str,
) -> Result<Event> {
    if ev.0.kind != expect || ev.1 != 0 {
        // A rejection's status is the peer's reason code, not an errno.
        // An unreachable peer (no answer to the request: its process is gone) is
        // EHOSTUNREACH whatever status librdmacm gave (ETIMEDOUT on rxe), so callers can
        // tell it from a step that timed out.
        let errno = match ev.1 {
            _ if ev.0.kind == ffi::rdma_cm_event_type::RDMA_CM_EVENT_UNREACHABLE => {
                libc::EHOSTUNREACH
            }
            s if s < 0 && ev.0.kind != ffi::rdma_cm_event_type::RDMA_CM_EVENT_REJECTED => -s,
            _ => libc::ECONNREFUSED,
        };
        return Err(Error::from_errno(
            Op::Cm,
            format!(
                "{step}: got {} (status {}), expected {}",
                event_name(ev.0.kind),
                ev.1,
                event_name(expect)
            ),
            errno,
        ));
    }
    Ok(ev.0)
}

impl CmId {
    /// Takes the events queued for the established connection without blocking; returns
    /// how the connection ended, if an event (now or earlier) said so.
    pub(crate) fn take_events(&self) -> Result<Option<ConnectionEnd>> {
        use ffi::rdma_cm_event_type as E;
        while let Some((ev, _)) = self.channel().try_next("connection events")? {
            let end = match ev.kind {
                E::RDMA_CM_EVENT_DISCONNECTED => Some(ConnectionEnd::Disconnected),
                E::RDMA_CM_EVENT_DEVICE_REMOVAL => Some(ConnectionEnd::DeviceRemoval),
                _ => None,
            };
            if let Some(end) = end {
                if self.end() != Some(ConnectionEnd::DeviceRemoval) {
                    self.record_end(end);
                }
            }
        }
        Ok(self.end())
    }

    /// Waits, for at most `timeout`, until the connection ends (`RDMA_CM_EVENT_DISCONNECTED`
    /// or `RDMA_CM_EVENT_DEVICE_REMOVAL`). Every event is taken as [`CmId::take_events`]
    /// takes it, so the end is recorded for whoever looks next (the queue pair's waiters, a
    /// later `take_events`), never consumed here alone: awaited requests on the queue pair
    /// must be woken by the same end.
    pub(crate) fn wait_disconnected(&self, timeout: Duration) -> Result<ConnectionEnd> {
        let step = "wait for disconnect";
        let deadline = deadline_after(timeout);
        loop {
            if let Some(end) = self.take_events()? {
                return Ok(end);
            }
            self.channel().wait_until(deadline, timeout, step)?;
        }
    }

    /// As [`CmId::wait_disconnected`], awaiting the event channel on tokio's reactor.
    #[cfg(feature = "tokio")]
    pub(crate) async fn wait_disconnected_async(&self, timeout: Duration) -> Result<ConnectionEnd> {
        self.channel()
            .until_async(timeout, "wait for disconnect", || self.take_events())
            .await
    }

    /// The device librdmacm bound the id to, holding a reference on it in librdmacm (see
    /// [`Context::borrowed`](crate::sys::device::Context::borrowed)).
    pub(crate) fn device(&self) -> Result<Arc<Context>> {
        self.context().unwrap_or_else(|| {
            Err(Error::from_errno(
                Op::Cm,
                "the id has no device yet (bind to or resolve an RDMA address)",
                libc::ENODEV,
            ))
        })
    }
}
