//! The connection manager's objects (librdmacm): event channels, their events, and cm ids
//! (the active side's, a listener's, and the new id of a connect request), with every call on
//! them; and librdmacm's device list.

use super::device::Context;
use super::fd::set_nonblocking;
use crate::error::{Error, Op, Result};
use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use rdma_sys as ffi;
use std::cell::Cell;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// The name librdmacm gives an event type (`rdma_event_str`).
pub(crate) fn event_name(kind: ffi::rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str takes any value and returns a static string.
    let s = unsafe { ffi::rdma_event_str(kind) };
    // SAFETY: a static NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

/// `rdma_get_devices` + `rdma_free_devices`: runs librdmacm's check of its device list, which
/// closes its contexts of removed devices that nothing references (see
/// `crate::cm::release_removed_devices`).
pub(crate) fn release_removed_devices() {
    // SAFETY: no out-parameter is needed; the list is freed just below.
    let list = unsafe { ffi::rdma_get_devices(std::ptr::null_mut()) };
    if !list.is_null() {
        // SAFETY: the list came from rdma_get_devices and is freed once; librdmacm closes
        // only the contexts of removed devices that no cm id or device list references, and
        // every Context of ours on a librdmacm context holds such a list.
        unsafe { ffi::rdma_free_devices(list) };
    }
}

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
    /// The id the event is about: for a connect request, the new id, ours to own until
    /// [`CmId::adopt_request`] takes it.
    id: *mut ffi::rdma_cm_id,
    /// The event's type.
    pub kind: ffi::rdma_cm_event_type::Type,
    /// The private data of a connect request or an establishment, copied.
    pub private: Vec<u8>,
}

impl Event {
    /// The private data, taken out (the event is consumed; a connect request's id not
    /// adopted is still rejected and destroyed by its drop).
    pub(crate) fn into_private(mut self) -> Vec<u8> {
        std::mem::take(&mut self.private)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // A connect request whose id was not adopted (refused by its status, or not the
        // event expected): the new id is ours; rejected, so that the peer hears at once, and
        // destroyed, so that it does not leak. Other events' ids belong to their connection.
        if self.kind == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            if let Some(child) = NonNull::new(self.id) {
                // SAFETY: the request's new id, never adopted (adopt_request nulls `id`):
                // ours alone, with no QP; rejected and destroyed once.
                unsafe { ffi::rdma_reject(child.as_ptr(), std::ptr::null(), 0) };
                // SAFETY: as above.
                unsafe { ffi::rdma_destroy_id(child.as_ptr()) };
            }
        }
    }
}

impl Channel {
    /// `rdma_create_event_channel`, its fd set non-blocking.
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
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel was destroyed first (owners drop ids before it).
        unsafe { ffi::rdma_destroy_event_channel(self.0.as_ptr()) };
    }
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

/// The connection parameters of `rdma_connect` / `rdma_accept`, with the private data they
/// carry (borrowed for the call).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnParam<'a> {
    pub private: &'a [u8],
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
}

impl ConnParam<'_> {
    /// The C struct, pointing into `self.private` (which must outlive its use).
    fn raw(&self) -> ffi::rdma_conn_param {
        let private = self.private;
        ffi::rdma_conn_param {
            private_data: if private.is_empty() {
                std::ptr::null()
            } else {
                private.as_ptr().cast()
            },
            // At most the slice's length (a longer slice is cut, never over-read).
            private_data_len: u8::try_from(private.len()).unwrap_or(u8::MAX),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: self.srq,
            qp_num: 0,
        }
    }
}

/// `RDMA_OPTION_ID` (`rdma_set_option` level) and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `u8`), from
/// `<rdma/rdma_cma.h>`.
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;

/// A cm id with its own event channel: the active side's id, a listener's, or a connection
/// accepted from a listener; a queue pair created on it owns it. The id is destroyed (Drop)
/// before its event channel (the field, dropped after).
pub(crate) struct CmId {
    id: NonNull<ffi::rdma_cm_id>,
    channel: Channel,
    /// What an event drained by `CmId::take_events` said about the connection, so that
    /// a later `CmId::wait_disconnected` does not wait for an event already taken.
    ended: Cell<Option<ConnectionEnd>>,
    /// Whether it is a connect request's id not accepted yet: dropped so, it is rejected
    /// first, so that the peer hears at once instead of waiting out its timeout.
    unanswered: Cell<bool>,
}

// SAFETY: cm ids may be used from any thread; the owner serialises use.
unsafe impl Send for CmId {}

impl CmId {
    /// A new id on a new event channel (`rdma_create_id` for reliable connections,
    /// `RDMA_PS_TCP`).
    pub(crate) fn new() -> Result<CmId> {
        let channel = Channel::new()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer, no user context.
        let rc = unsafe {
            ffi::rdma_create_id(
                channel.0.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                ffi::rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 {
            return Err(Error::last_os(Op::Cm, "rdma_create_id"));
        }
        let id = NonNull::new(id)
            .ok_or_else(|| Error::from_errno(Op::Cm, "rdma_create_id", libc::EIO))?;
        // SAFETY: `id` was just created on `channel`, and is ours alone.
        Ok(unsafe { CmId::from_raw(id, channel) })
    }

    /// Takes ownership of `id`, which must already report to `channel`.
    ///
    /// # Safety
    /// `id` is a live cm id that nothing else will destroy, whose events go to `channel`
    /// (created there, or moved there with `rdma_migrate_id`).
    unsafe fn from_raw(id: NonNull<ffi::rdma_cm_id>, channel: Channel) -> CmId {
        CmId {
            id,
            channel,
            ended: Cell::new(None),
            unanswered: Cell::new(false),
        }
    }

    /// The new id of the connect request `req`, moved to its own event channel and owned from
    /// here (the request is rejected and its id destroyed if that fails). Takes the id out of
    /// `req`: a second call finds none.
    ///
    /// # Errors
    /// `EIO` if `req` is not a connect request or its id was taken; the errors of
    /// `rdma_create_event_channel` and `rdma_migrate_id`.
    pub(crate) fn adopt_request(req: &mut Event) -> Result<CmId> {
        let id = std::mem::replace(&mut req.id, std::ptr::null_mut());
        let child = NonNull::new(id)
            .filter(|_| req.kind == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST)
            .ok_or_else(|| Error::from_errno(Op::Cm, "connect request without id", libc::EIO))?;
        let channel = match Channel::new() {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the child id is ours and has no QP; rejected (so the peer hears at
                // once) and destroyed once.
                unsafe {
                    ffi::rdma_reject(child.as_ptr(), std::ptr::null(), 0);
                }
                // SAFETY: as above.
                unsafe { ffi::rdma_destroy_id(child.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: `child` is the request's new id, owned from here; `channel` is live.
        if unsafe { ffi::rdma_migrate_id(child.as_ptr(), channel.0.as_ptr()) } != 0 {
            let e = Error::last_os(Op::Cm, "rdma_migrate_id");
            // SAFETY: the child id is ours and has no QP.
            unsafe { ffi::rdma_destroy_id(child.as_ptr()) };
            return Err(e);
        }
        // SAFETY: `child` is the request's new id, ours alone (nothing else destroys it, and
        // it was taken out of `req`), and now reports to `channel` (migrated just above).
        let id = unsafe { CmId::from_raw(child, channel) };
        id.unanswered.set(true);
        Ok(id)
    }

    /// The id's event channel.
    pub(crate) fn channel(&self) -> &Channel {
        &self.channel
    }

    /// The raw id, for librdmacm calls (`rdma_create_qp`).
    pub(crate) fn id(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }

    /// How the connection ended, as recorded by [`CmId::record_end`].
    pub(crate) fn end(&self) -> Option<ConnectionEnd> {
        self.ended.get()
    }

    /// Records how the connection ended.
    pub(crate) fn record_end(&self, end: ConnectionEnd) {
        self.ended.set(Some(end));
    }

    /// `rdma_bind_addr` to `addr`; `Op::Cm` error naming the call and `addr`.
    pub(crate) fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let sa = SockaddrStorage::from(addr);
        // SAFETY: live id; `sa` is a valid sockaddr of its family for the call (only read,
        // though the C signature asks for `*mut`).
        if unsafe { ffi::rdma_bind_addr(self.id(), sa.as_ptr().cast_mut().cast()) } != 0 {
            return Err(Error::last_os(Op::Cm, format!("rdma_bind_addr {addr}")));
        }
        Ok(())
    }

    /// `rdma_listen` with `backlog`; `addr` names the bound address in errors.
    pub(crate) fn listen(&self, backlog: i32, addr: SocketAddr) -> Result<()> {
        // SAFETY: live id (librdmacm refuses an unbound one).
        if unsafe { ffi::rdma_listen(self.id(), backlog) } != 0 {
            return Err(Error::last_os(Op::Cm, format!("rdma_listen {addr}")));
        }
        Ok(())
    }

    /// `rdma_resolve_addr` towards `peer` within `ms` milliseconds (the caller waits for
    /// `ADDR_RESOLVED`).
    pub(crate) fn resolve_addr(&self, peer: SocketAddr, ms: i32) -> Result<()> {
        let dst = SockaddrStorage::from(peer);
        // SAFETY: live id; `dst` is a valid sockaddr of its family for the call (librdmacm
        // only reads it, so the `*mut` its C signature asks for is never written through).
        if unsafe {
            ffi::rdma_resolve_addr(
                self.id(),
                std::ptr::null_mut(),
                dst.as_ptr().cast_mut().cast(),
                ms,
            )
        } != 0
        {
            return Err(Error::last_os(Op::Cm, format!("rdma_resolve_addr {peer}")));
        }
        Ok(())
    }

    /// `rdma_resolve_route` within `ms` milliseconds (the caller waits for
    /// `ROUTE_RESOLVED`); `peer` names it in errors.
    pub(crate) fn resolve_route(&self, peer: SocketAddr, ms: i32) -> Result<()> {
        // SAFETY: live id (librdmacm refuses one without a resolved address).
        if unsafe { ffi::rdma_resolve_route(self.id(), ms) } != 0 {
            return Err(Error::last_os(Op::Cm, format!("rdma_resolve_route {peer}")));
        }
        Ok(())
    }

    /// `rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT)`: the ACK timeout of the id's queue pair.
    pub(crate) fn set_ack_timeout(&self, timeout: u8) -> Result<()> {
        let mut timeout = timeout;
        // SAFETY: live id; `timeout` is a valid `u8` option value of the size passed.
        let rc = unsafe {
            ffi::rdma_set_option(
                self.id(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut timeout as *mut u8).cast(),
                std::mem::size_of::<u8>(),
            )
        };
        if rc != 0 {
            return Err(Error::last_os(
                Op::Cm,
                format!("rdma_set_option(ACK_TIMEOUT, {timeout})"),
            ));
        }
        Ok(())
    }

    /// `rdma_connect` with `param`; `what` names the step in errors.
    pub(crate) fn connect(&self, param: &ConnParam<'_>, what: &str) -> Result<()> {
        let mut raw = param.raw();
        // SAFETY: live id; `raw` (and the private data it points to, borrowed by `param`) is
        // valid across the call.
        if unsafe { ffi::rdma_connect(self.id(), &mut raw) } != 0 {
            return Err(Error::last_os(Op::Cm, what));
        }
        Ok(())
    }

    /// `rdma_accept` of the request the id came from, with `param`; `what` names the step in
    /// errors.
    pub(crate) fn accept(&self, param: &ConnParam<'_>, what: &str) -> Result<()> {
        let mut raw = param.raw();
        // SAFETY: as in `connect`.
        if unsafe { ffi::rdma_accept(self.id(), &mut raw) } != 0 {
            return Err(Error::last_os(Op::Cm, what));
        }
        self.unanswered.set(false);
        Ok(())
    }

    /// `rdma_disconnect`: tells the peer and moves the id's queue pair to the error state.
    pub(crate) fn disconnect(&self) {
        // SAFETY: live id; also moves its QP to the error state.
        unsafe { ffi::rdma_disconnect(self.id()) };
    }

    /// The device librdmacm bound the id to, holding a reference on it in librdmacm (see
    /// [`Context::borrowed`]); `None` while the id has none (not yet bound to or resolved to
    /// an RDMA address, or bound to a wildcard).
    pub(crate) fn context(&self) -> Option<Result<Arc<Context>>> {
        // SAFETY: live id; `verbs` is set once the address is bound or resolved.
        let verbs = unsafe { self.id.as_ref() }.verbs;
        let ctx = NonNull::new(verbs)?;
        // SAFETY: `verbs` is librdmacm's context of the id's device, open while the id (alive:
        // borrowed by `self`) holds its reference; `borrowed` takes a reference of its own.
        Some(unsafe { Context::borrowed(ctx) })
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if self.unanswered.get() {
            // SAFETY: live id of a connect request never accepted: rejected once, with no
            // private data.
            unsafe { ffi::rdma_reject(self.id(), std::ptr::null(), 0) };
        }
        // SAFETY: the QP on it was destroyed first (RawQp drops the QP, then this); all its
        // events were acknowledged; destroyed once, before its channel (field order).
        unsafe { ffi::rdma_destroy_id(self.id()) };
    }
}
