//! The connection manager's own objects, below the connections of [`crate::cm`]: an event
//! channel (non-blocking, waited on with a deadline) and a cm id with its channel. Queue pairs
//! created through rdma_cm own their [`CmId`] (see `qp::raw`), so this module knows nothing
//! of queue pairs and both `qp` and `cm` build on it.

use crate::deadline::{deadline_after, set_nonblocking, time_left, wait_readable};
use crate::device::Context;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::ffi::CStr;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An event channel; its fd is non-blocking and waits use `poll` with a timeout.
pub(crate) struct Channel(NonNull<ffi::rdma_event_channel>);

// SAFETY: librdmacm event channels may be used from any thread.
unsafe impl Send for Channel {}
// SAFETY: shared use only reads events: each `rdma_get_cm_event` is one write(2) of a
// GET_EVENT command to the channel's ucma file, which the kernel serialises, and the event it
// returns belongs to the caller alone until acknowledged; the channel struct itself is not
// written after creation.
unsafe impl Sync for Channel {}

/// A connection-manager event, already acknowledged.
pub(crate) struct Event {
    /// The id the event is about (for a connect request: the new id, ours to own).
    pub id: *mut ffi::rdma_cm_id,
    /// The event's type.
    pub kind: ffi::rdma_cm_event_type::Type,
    /// The private data of a connect request or an establishment, copied.
    pub private: Vec<u8>,
}

pub(crate) fn event_name(kind: ffi::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str takes any value and returns a static string.
    let s = unsafe { ffi::rdma_event_str(kind) };
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

impl Channel {
    pub(crate) fn new() -> Result<Channel> {
        // SAFETY: no arguments; the result is checked.
        let ch = unsafe { ffi::rdma_create_event_channel() };
        let ch = NonNull::new(ch).ok_or_else(|| {
            Error::last_os(Op::Cm, "rdma_create_event_channel (is rdma_ucm loaded?)")
        })?;
        let ch = Channel(ch);
        set_nonblocking(ch.fd())
            .map_err(|e| Error::from_errno(Op::Cm, "event channel O_NONBLOCK", e as i32))?;
        Ok(ch)
    }

    /// The channel's fd (non-blocking), borrowed from the channel: readable when an event
    /// is queued.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel is live; `fd` is a plain field.
        let raw = unsafe { self.0.as_ref() }.fd;
        // SAFETY: librdmacm opened this fd for the channel and closes it only in
        // rdma_destroy_event_channel, which runs in our Drop, after every borrow of `self`.
        unsafe { BorrowedFd::borrow_raw(raw) }
    }

    /// The raw channel, for librdmacm calls that take it.
    pub(crate) fn as_ptr(&self) -> *mut ffi::rdma_event_channel {
        self.0.as_ptr()
    }

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
        use crate::deadline::{reactor_error, register};
        let wait = async {
            // SAFETY: the registration is a local of this block, which the channel
            // (borrowed for the whole call) outlives.
            let fd = unsafe { register(self.fd()) }.map_err(|e| reactor_error(Op::Cm, step, &e))?;
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

    /// The next event and its status, if one is queued (never blocks).
    pub(crate) fn try_next(&self, step: &str) -> Result<Option<(Event, i32)>> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer; the fd is non-blocking.
        if unsafe { ffi::rdma_get_cm_event(self.0.as_ptr(), &mut ev) } != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                e => Err(Error::from_errno(Op::Cm, step, e.unwrap_or(libc::EIO))),
            };
        }
        // SAFETY: on success `ev` is a live event until acknowledged below.
        let e = unsafe { &*ev };
        let private = if e.event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
            || e.event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED
        {
            // SAFETY: for these events the union holds connection parameters.
            let conn = unsafe { e.param.conn };
            if conn.private_data.is_null() {
                Vec::new()
            } else {
                // SAFETY: librdmacm guarantees `private_data_len` readable bytes until
                // the event is acknowledged; they are copied before that.
                unsafe {
                    std::slice::from_raw_parts(
                        conn.private_data.cast::<u8>(),
                        conn.private_data_len as usize,
                    )
                }
                .to_vec()
            }
        } else {
            Vec::new()
        };
        let out = (
            Event {
                id: e.id,
                kind: e.event,
                private,
            },
            e.status,
        );
        // SAFETY: acknowledged once; nothing of it is used afterwards.
        unsafe { ffi::rdma_ack_cm_event(ev) };
        Ok(Some(out))
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

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel was destroyed first (owners drop ids before it).
        unsafe { ffi::rdma_destroy_event_channel(self.0.as_ptr()) };
    }
}

/// A cm id with its own event channel: the active side's id, or a connection accepted from a
/// listener; a queue pair created on it owns it. The id is destroyed (Drop) before its event
/// channel (the field, dropped after).
pub(crate) struct CmId {
    id: NonNull<ffi::rdma_cm_id>,
    channel: Channel,
    /// What an event drained by [`CmId::take_events`] said about the connection, so that
    /// a later [`CmId::wait_disconnected`] does not wait for an event already taken.
    ended: std::cell::Cell<Option<ConnectionEnd>>,
}

/// How an rdma_cm connection ended, as its events said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionEnd {
    /// `RDMA_CM_EVENT_DISCONNECTED`: the peer (or we) disconnected.
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the RDMA device is going away (e.g. `rdma link
    /// delete`); the queue pair must be destroyed for the removal to finish.
    DeviceRemoval,
}

// SAFETY: cm ids may be used from any thread; the owner serialises use.
unsafe impl Send for CmId {}

impl CmId {
    /// A new id on a new event channel, for the active side.
    pub(crate) fn new() -> Result<CmId> {
        let channel = Channel::new()?;
        let id = create_id(&channel)?;
        Ok(CmId {
            id,
            channel,
            ended: std::cell::Cell::new(None),
        })
    }

    /// Takes ownership of `id`, which must already report to `channel`.
    ///
    /// # Safety
    /// `id` is a live cm id that nothing else will destroy, whose events go to `channel`
    /// (created there, or moved there with `rdma_migrate_id`).
    pub(crate) unsafe fn from_raw(id: NonNull<ffi::rdma_cm_id>, channel: Channel) -> CmId {
        CmId {
            id,
            channel,
            ended: std::cell::Cell::new(None),
        }
    }

    /// Takes the events queued for the established connection without blocking; returns
    /// how the connection ended, if an event (now or earlier) said so.
    pub(crate) fn take_events(&self) -> Result<Option<ConnectionEnd>> {
        use ffi::rdma_cm_event_type as E;
        while let Some((ev, _)) = self.channel.try_next("connection events")? {
            let end = match ev.kind {
                E::RDMA_CM_EVENT_DISCONNECTED => Some(ConnectionEnd::Disconnected),
                E::RDMA_CM_EVENT_DEVICE_REMOVAL => Some(ConnectionEnd::DeviceRemoval),
                _ => None,
            };
            if let Some(end) = end {
                if self.ended.get() != Some(ConnectionEnd::DeviceRemoval) {
                    self.ended.set(Some(end));
                }
            }
        }
        Ok(self.ended.get())
    }

    /// The id's event channel.
    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The raw id, for librdmacm calls.
    pub(crate) fn id(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }

    /// `rdma_disconnect`: tells the peer and moves the id's queue pair to the error state.
    pub(crate) fn disconnect(&self) {
        // SAFETY: live id; also moves its QP to the error state.
        unsafe { ffi::rdma_disconnect(self.id()) };
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
            self.channel.wait_until(deadline, timeout, step)?;
        }
    }

    /// As [`CmId::wait_disconnected`], awaiting the event channel on tokio's reactor.
    #[cfg(feature = "tokio")]
    pub(crate) async fn wait_disconnected_async(&self, timeout: Duration) -> Result<ConnectionEnd> {
        self.channel
            .until_async(timeout, "wait for disconnect", || self.take_events())
            .await
    }

    /// The device librdmacm bound the id to, holding a reference on it in librdmacm (see
    /// [`Context::borrowed`]).
    pub(crate) fn context(&self) -> Result<Arc<Context>> {
        // SAFETY: live id; `verbs` is set once the address is bound or resolved.
        let verbs = unsafe { self.id.as_ref() }.verbs;
        let ctx = NonNull::new(verbs).ok_or_else(|| {
            Error::from_errno(
                Op::Cm,
                "the id has no device yet (bind to or resolve an RDMA address)",
                libc::ENODEV,
            )
        })?;
        // SAFETY: `verbs` is librdmacm's context of the id's device, open while the id (alive:
        // borrowed by `self`) holds its reference; `borrowed` takes a reference of its own.
        unsafe { Context::borrowed(ctx) }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP on it was destroyed first (RawQp drops the QP, then this); all its
        // events were acknowledged; destroyed once, before its channel (field order).
        unsafe { ffi::rdma_destroy_id(self.id()) };
    }
}

/// `rdma_create_id` on `channel`, for reliable connections (`RDMA_PS_TCP`).
pub(crate) fn create_id(channel: &Channel) -> Result<NonNull<ffi::rdma_cm_id>> {
    let mut id = std::ptr::null_mut();
    // SAFETY: live channel, valid out-pointer, no user context.
    let rc = unsafe {
        ffi::rdma_create_id(
            channel.as_ptr(),
            &mut id,
            std::ptr::null_mut(),
            ffi::rdma_port_space::RDMA_PS_TCP,
        )
    };
    if rc != 0 {
        return Err(Error::last_os(Op::Cm, "rdma_create_id"));
    }
    NonNull::new(id).ok_or_else(|| Error::from_errno(Op::Cm, "rdma_create_id", libc::EIO))
}
