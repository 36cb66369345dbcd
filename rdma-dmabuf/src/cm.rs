//! Connections through the RDMA connection manager (librdmacm), the classic workflow: an
//! event channel; the active side resolves the address and route, creates its queue pair and
//! connects; the passive side binds, listens, takes a connect request, creates its queue pair
//! and accepts; both see ESTABLISHED; either disconnects.
//!
//! librdmacm opens the devices itself: protection domains and regions for a connection must
//! come from the context it picked, [`CmConnector::context`] or [`CmListener::context`].

use crate::cm_id::{create_id, Channel, CmId, Event};
use crate::deadline::poll_ms;
use crate::device::Context;
use crate::error::{Error, Op, Result};
use crate::qp::raw::RawQp;
use crate::qp::{QueuePair, QueuePairBuilder, Retry};
use nix::sys::socket::{SockaddrLike, SockaddrStorage};
use rdma_sys as ffi;
use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// The most private data [`CmConnector::connect`] and [`CmListener::accept`] carry: an RC
/// connect request has 56 bytes over RoCE, two of which frame the data.
pub const MAX_PRIVATE_DATA: usize = 54;

/// Private data arrives zero-padded to the transport's size (56 bytes on a request, 196 on a
/// reply), so its length is lost: it is framed as marker, length, bytes.
const FRAME_MARKER: u8 = 0xd7;

fn frame(private: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(private.len() + 2);
    v.push(FRAME_MARKER);
    v.push(private.len() as u8);
    v.extend_from_slice(private);
    v
}

/// The peer's bytes: unframed if it used this crate's framing, else as received (padded).
fn unframe(raw: Vec<u8>) -> Vec<u8> {
    match raw.as_slice() {
        [FRAME_MARKER, len, rest @ ..] if usize::from(*len) <= rest.len() => {
            rest[..usize::from(*len)].to_vec()
        }
        _ => raw,
    }
}

/// `RDMA_OPTION_ID` (`rdma_set_option` level) and `RDMA_OPTION_ID_ACK_TIMEOUT` (a `u8`), from
/// `<rdma/rdma_cma.h>`.
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;

/// Gives the id's queue pair the builder's ACK timeout (by default the CM derives it from the
/// path's packet lifetime); must precede `rdma_connect` / `rdma_accept`.
fn set_ack_timeout(parts: &CmId, retry: Retry) -> Result<()> {
    let mut timeout: u8 = retry.ack_timeout;
    // SAFETY: live id; `timeout` is a valid `u8` option value of the size passed.
    let rc = unsafe {
        ffi::rdma_set_option(
            parts.id(),
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

/// Connection parameters carrying `framed` (from [`frame`]), which must outlive their use,
/// and the builder's retry counts.
fn conn_param(framed: &[u8], retry: Retry) -> Result<ffi::rdma_conn_param> {
    let data = framed.len().saturating_sub(2);
    if data > MAX_PRIVATE_DATA {
        return Err(Error::invalid(
            Op::Cm,
            format!("{data} bytes of private data; at most {MAX_PRIVATE_DATA}"),
        ));
    }
    let private = framed;
    Ok(ffi::rdma_conn_param {
        private_data: if private.is_empty() {
            std::ptr::null()
        } else {
            private.as_ptr().cast()
        },
        private_data_len: private.len() as u8,
        responder_resources: 16,
        initiator_depth: 16,
        flow_control: 1,
        retry_count: retry.retry_count,
        rnr_retry_count: retry.rnr_retry,
        srq: 0,
        qp_num: 0,
    })
}

/// How a connection starts once its queue pair exists.
#[derive(Clone, Copy)]
enum Start {
    /// The active side: `rdma_connect`.
    Connect,
    /// The passive side: `rdma_accept` of the request the id came from.
    Accept,
}

/// Creates the queue pair on `id` (which it then owns), gives it the builder's ACK timeout,
/// and connects or accepts with the private data `framed` (from [`frame`]); `what` names the
/// step in errors. Returns the queue pair's objects and depths; the caller waits for
/// `RDMA_CM_EVENT_ESTABLISHED` on the id's channel. On an error the queue pair and the id
/// are destroyed as they drop.
fn begin(
    qp: &QueuePairBuilder,
    id: CmId,
    framed: &[u8],
    start: Start,
    what: &str,
) -> Result<(RawQp, u32, u32)> {
    let mut param = conn_param(framed, qp.retry())?;
    // Tell the peer's CM that this side receives through a shared receive queue.
    param.srq = u8::from(qp.uses_srq());
    let (send, recv) = qp.depths();
    let raw = qp.create(Some(id))?;
    let id = raw.cm().expect("created on a cm id");
    set_ack_timeout(id, qp.retry())?;
    let rc = match start {
        // SAFETY: live id with its QP; `param` (and the private data it points to, which the
        // caller keeps) is valid across the call.
        Start::Connect => unsafe { ffi::rdma_connect(id.id(), &mut param) },
        // SAFETY: as above.
        Start::Accept => unsafe { ffi::rdma_accept(id.id(), &mut param) },
    };
    if rc != 0 {
        return Err(Error::last_os(Op::Cm, what));
    }
    Ok((raw, send, recv))
}

/// [`begin`], then waits (at most `timeout`) for `RDMA_CM_EVENT_ESTABLISHED`.
fn establish(
    qp: QueuePairBuilder,
    id: CmId,
    framed: &[u8],
    start: Start,
    what: &str,
    timeout: Duration,
) -> Result<(QueuePair, Event)> {
    let (raw, send, recv) = begin(&qp, id, framed, start, what)?;
    let ev = raw.cm().expect("created on a cm id").channel().expect(
        ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
        timeout,
        what,
    )?;
    Ok((QueuePair::from_cm(raw, send, recv)?, ev))
}

/// `rdma_resolve_addr` towards `peer` (the caller waits for `ADDR_RESOLVED`).
fn start_resolve_addr(parts: &CmId, peer: SocketAddr, ms: i32) -> Result<()> {
    let dst = SockaddrStorage::from(peer);
    // SAFETY: live id; `dst` is a valid sockaddr of its family for the call (librdmacm
    // only reads it, so the `*mut` its C signature asks for is never written through).
    if unsafe {
        ffi::rdma_resolve_addr(
            parts.id(),
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

/// `rdma_resolve_route` (the caller waits for `ROUTE_RESOLVED`).
fn start_resolve_route(parts: &CmId, peer: SocketAddr, ms: i32) -> Result<()> {
    // SAFETY: live id with a resolved address.
    if unsafe { ffi::rdma_resolve_route(parts.id(), ms) } != 0 {
        return Err(Error::last_os(Op::Cm, format!("rdma_resolve_route {peer}")));
    }
    Ok(())
}

/// `rdma_get_devices` + `rdma_free_devices`: lets librdmacm close its own contexts of devices
/// that have gone away (`rdma link delete`, a hot unplug) and that nothing uses any more.
///
/// librdmacm opens the devices it routes through (and, at a check of its device list, every
/// device) and closes a device's context only when a check of the device list finds the
/// device missing and no reference to it is left: no cm id on it, no device list that lists
/// it. A [`Context`] that [`CmConnector::context`] or [`CmListener::context`] returned holds
/// such a list until it drops, so librdmacm never closes a context under a live protection
/// domain, region, queue pair or event stream made from it; the context of a device found
/// gone while referenced is closed when the last reference goes. A device that went while
/// nothing referenced it, or before any check noticed, stays open until the next check; this
/// runs one. The kernel finishes a device's removal only when every user of it has let go
/// (on rxe, `rdma link delete` waits for that), so a program that outlives a removed device
/// calls this once it has dropped what it made on the device. (librdmacm's check, v44 to
/// v55, gives up while no RDMA device is left at all: its context of the last device stays
/// open until another device appears or the process exits.)
///
/// Safe at any time: the check closes only contexts that nothing references, and everything
/// this crate makes on a librdmacm context references it.
pub fn release_removed_devices() {
    // SAFETY: no out-parameter is needed; the list is freed just below.
    let list = unsafe { ffi::rdma_get_devices(std::ptr::null_mut()) };
    if !list.is_null() {
        // SAFETY: the list came from rdma_get_devices and is freed once; librdmacm closes
        // only the contexts of removed devices that no cm id or device list references, and
        // every Context of ours on a librdmacm context holds such a list.
        unsafe { ffi::rdma_free_devices(list) };
    }
}

/// The active side: address and route resolved, ready to connect.
pub struct CmConnector {
    parts: CmId,
    peer: SocketAddr,
}

impl std::fmt::Debug for CmConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConnector")
            .field("peer", &self.peer)
            .finish()
    }
}

impl CmConnector {
    /// `rdma_resolve_addr` then `rdma_resolve_route` towards `peer`, each within `timeout`.
    ///
    /// # Errors
    /// [`Error::Verbs`] naming the step (`EADDRNOTAVAIL`/`ENODEV`: no RDMA device for that
    /// route; `ETIMEDOUT`).
    pub fn resolve(peer: SocketAddr, timeout: Duration) -> Result<CmConnector> {
        let parts = CmId::new()?;
        // librdmacm takes an `int` of milliseconds: clamped, and at least 1.
        let ms = poll_ms(timeout).max(1);
        start_resolve_addr(&parts, peer, ms)?;
        parts.channel().expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
            &format!("resolve address {peer}"),
        )?;
        start_resolve_route(&parts, peer, ms)?;
        parts.channel().expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
            timeout,
            &format!("resolve route {peer}"),
        )?;
        Ok(CmConnector { parts, peer })
    }

    /// The peer this connector resolved.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The device librdmacm chose for this route: create the protection domain here.
    ///
    /// The context is librdmacm's; the returned value holds a reference on it in librdmacm
    /// (see [`Context`]), so it stays open while anything made from it lives, even if the
    /// device is removed.
    ///
    /// # Errors
    /// `ENODEV` if the id has no device (cannot happen after `resolve`) or librdmacm found
    /// the device removed.
    pub fn context(&self) -> Result<Arc<Context>> {
        self.parts.context()
    }

    /// Creates the queue pair (`rdma_create_qp` with the builder's PD and depths) and
    /// `rdma_connect`s, sending `private` (at most [`MAX_PRIVATE_DATA`] bytes). Returns the
    /// connected queue pair and the private data of the peer's accept (exactly as sent when
    /// the peer uses this crate; zero-padded to the transport's size otherwise).
    ///
    /// # Errors
    /// `ECONNREFUSED` when rejected (nobody listening), `ETIMEDOUT`, or the verbs errors.
    pub fn connect(
        self,
        qp: QueuePairBuilder,
        private: &[u8],
        timeout: Duration,
    ) -> Result<(QueuePair, Vec<u8>)> {
        let framed = frame(private);
        let peer = self.peer;
        let (qp, ev) = establish(
            qp,
            self.parts,
            &framed,
            Start::Connect,
            &format!("connect to {peer}"),
            timeout,
        )?;
        Ok((qp, unframe(ev.private)))
    }
}

/// The passive side: bound to a local address and listening.
pub struct CmListener {
    id: NonNull<ffi::rdma_cm_id>,
    channel: Channel,
    addr: SocketAddr,
}

// SAFETY: cm ids may be used from any thread; `accept` takes `&self` and librdmacm serialises.
unsafe impl Send for CmListener {}

impl std::fmt::Debug for CmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmListener")
            .field("addr", &self.addr)
            .finish()
    }
}

impl CmListener {
    /// `rdma_bind_addr` to `addr` (an address of an RDMA netdev, so that the device is known)
    /// and `rdma_listen`.
    ///
    /// # Errors
    /// `EADDRINUSE`, `EADDRNOTAVAIL` with a hint, or [`Error::Verbs`].
    pub fn bind(addr: SocketAddr) -> Result<CmListener> {
        let channel = Channel::new()?;
        let id = create_id(&channel)?;
        let listener = CmListener { id, channel, addr };
        let sa = SockaddrStorage::from(addr);
        // SAFETY: live id; `sa` is a valid sockaddr of its family for the call (only read,
        // though the C signature asks for `*mut`).
        if unsafe { ffi::rdma_bind_addr(id.as_ptr(), sa.as_ptr().cast_mut().cast()) } != 0 {
            return Err(Error::last_os(Op::Cm, format!("rdma_bind_addr {addr}")));
        }
        // SAFETY: live, bound id.
        if unsafe { ffi::rdma_listen(id.as_ptr(), 16) } != 0 {
            return Err(Error::last_os(Op::Cm, format!("rdma_listen {addr}")));
        }
        Ok(listener)
    }

    /// The device the listener is bound to: create the protection domain here.
    ///
    /// The context is librdmacm's; the returned value holds a reference on it in librdmacm
    /// (see [`Context`]), so it stays open while anything made from it lives, even after the
    /// listener is dropped and the device removed.
    ///
    /// # Errors
    /// `ENODEV` with a hint if bound to a wildcard address; `ENODEV` if librdmacm found the
    /// device removed.
    pub fn context(&self) -> Result<Arc<Context>> {
        // SAFETY: live id; `verbs` is set when bound to a device's address.
        let verbs = unsafe { self.id.as_ref() }.verbs;
        let ctx = NonNull::new(verbs).ok_or_else(|| {
            Error::from_errno(Op::Cm, format!("listener on {} has no device (bind to the RDMA netdev's address, not a wildcard)", self.addr), libc::ENODEV)
        })?;
        // SAFETY: `verbs` is librdmacm's context of the id's device, open while the id (alive:
        // borrowed by `self`) holds its reference; `borrowed` takes a reference of its own.
        unsafe { Context::borrowed(ctx) }
    }

    /// Waits for a connect request, moves it to its own event channel, creates its queue pair
    /// and accepts with `private` as the reply. Returns the established queue pair and the
    /// private data the peer sent with its request.
    ///
    /// # Errors
    /// `ETIMEDOUT` if no request comes in time; the verbs errors (a request for another
    /// device than the builder's PD: `EINVAL`).
    pub fn accept(
        &self,
        qp: QueuePairBuilder,
        private: &[u8],
        timeout: Duration,
    ) -> Result<(QueuePair, Vec<u8>)> {
        let framed = frame(private);
        conn_param(&framed, qp.retry())?;
        let req = self.channel.expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
            timeout,
            &format!("wait for a connect request on {}", self.addr),
        )?;
        let parts = adopt_request(&req)?;
        let what = format!("accept on {}", self.addr);
        let (qp, _) = establish(qp, parts, &framed, Start::Accept, &what, timeout)?;
        Ok((qp, unframe(req.private)))
    }
}

/// The new id of a connect request, moved to its own event channel and owned from here (the
/// request is rejected and its id destroyed if that fails).
fn adopt_request(req: &Event) -> Result<CmId> {
    let child = NonNull::new(req.id)
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
    if unsafe { ffi::rdma_migrate_id(child.as_ptr(), channel.as_ptr()) } != 0 {
        let e = Error::last_os(Op::Cm, "rdma_migrate_id");
        // SAFETY: the child id is ours and has no QP.
        unsafe { ffi::rdma_destroy_id(child.as_ptr()) };
        return Err(e);
    }
    // SAFETY: `child` is the request's new id, ours alone (nothing else destroys it), and
    // now reports to `channel` (migrated just above).
    Ok(unsafe { CmId::from_raw(child, channel) })
}

#[cfg(feature = "tokio")]
mod with_tokio {
    use super::*;

    impl CmConnector {
        /// As [`CmConnector::resolve`], awaiting each step's event on the reactor instead of
        /// blocking the thread (the `tokio` feature).
        ///
        /// # Errors
        /// As [`CmConnector::resolve`].
        pub async fn resolve_async(peer: SocketAddr, timeout: Duration) -> Result<CmConnector> {
            let parts = CmId::new()?;
            let ms = poll_ms(timeout).max(1);
            start_resolve_addr(&parts, peer, ms)?;
            parts
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
                    timeout,
                    &format!("resolve address {peer}"),
                )
                .await?;
            start_resolve_route(&parts, peer, ms)?;
            parts
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED,
                    timeout,
                    &format!("resolve route {peer}"),
                )
                .await?;
            Ok(CmConnector { parts, peer })
        }

        /// As [`CmConnector::connect`], awaiting the establishment on the reactor (the
        /// `tokio` feature). Dropping the future before it resolves destroys the queue
        /// pair and the id (the peer sees the connection fail).
        ///
        /// # Errors
        /// As [`CmConnector::connect`].
        pub async fn connect_async(
            self,
            qp: QueuePairBuilder,
            private: &[u8],
            timeout: Duration,
        ) -> Result<(QueuePair, Vec<u8>)> {
            let framed = frame(private);
            let what = format!("connect to {}", self.peer);
            let (raw, send, recv) = begin(&qp, self.parts, &framed, Start::Connect, &what)?;
            let ev = raw
                .cm()
                .expect("created on a cm id")
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
                    timeout,
                    &what,
                )
                .await?;
            Ok((QueuePair::from_cm(raw, send, recv)?, unframe(ev.private)))
        }
    }

    impl CmListener {
        /// As [`CmListener::accept`], awaiting the connect request and the establishment on
        /// the reactor (the `tokio` feature). Dropping the future while it waits for a
        /// request takes none; dropping it later rejects that one connection.
        ///
        /// # Errors
        /// As [`CmListener::accept`].
        pub async fn accept_async(
            &self,
            qp: QueuePairBuilder,
            private: &[u8],
            timeout: Duration,
        ) -> Result<(QueuePair, Vec<u8>)> {
            let framed = frame(private);
            conn_param(&framed, qp.retry())?;
            let req = self
                .channel
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
                    timeout,
                    &format!("wait for a connect request on {}", self.addr),
                )
                .await?;
            let parts = adopt_request(&req)?;
            let what = format!("accept on {}", self.addr);
            let (raw, send, recv) = begin(&qp, parts, &framed, Start::Accept, &what)?;
            raw.cm()
                .expect("created on a cm id")
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED,
                    timeout,
                    &what,
                )
                .await?;
            Ok((QueuePair::from_cm(raw, send, recv)?, unframe(req.private)))
        }
    }
}

impl Drop for CmListener {
    fn drop(&mut self) {
        // SAFETY: the listening id is destroyed once, before its channel (field order).
        unsafe { ffi::rdma_destroy_id(self.id.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_survives_padding() {
        let mut wire = frame(b"abc");
        wire.resize(196, 0); // as the CM delivers it
        assert_eq!(unframe(wire), b"abc");
        assert_eq!(unframe(frame(&[])), b"");
        // A peer without the framing: bytes as received.
        assert_eq!(unframe(vec![1, 2, 3, 0, 0]), [1, 2, 3, 0, 0]);
    }

    #[test]
    fn too_much_private_data_is_refused() {
        let r = Retry::default();
        assert!(conn_param(&frame(&[0; MAX_PRIVATE_DATA]), r).is_ok());
        let Err(e) = conn_param(&frame(&[0; MAX_PRIVATE_DATA + 1]), r) else {
            panic!("accepted 55 bytes")
        };
        assert!(e.to_string().contains("at most 54"), "{e}");
    }
}
