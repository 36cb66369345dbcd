//! Connections through the RDMA connection manager (librdmacm), the classic workflow: an
//! event channel; the active side resolves the address and route, creates its queue pair and
//! connects; the passive side binds, listens, takes a connect request, creates its queue pair
//! and accepts; both see ESTABLISHED; either disconnects.
//!
//! librdmacm opens the devices itself: protection domains and regions for a connection must
//! come from the context it picked, [`CmConnector::context`] or [`CmListener::context`].

use crate::cm_id::{CmId, Event};
use crate::deadline::poll_ms;
use crate::device::Context;
use crate::error::{Error, Op, Result};
use crate::qp::raw::RawQp;
use crate::qp::{QueuePair, QueuePairBuilder, Retry};
use crate::sys::cm::ConnParam;
use rdma_sys as ffi;
use std::net::SocketAddr;
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

/// Connection parameters carrying `framed` (from [`frame`]), and the builder's retry counts.
fn conn_param(framed: &[u8], retry: Retry) -> Result<ConnParam<'_>> {
    let data = framed.len().saturating_sub(2);
    if data > MAX_PRIVATE_DATA {
        return Err(Error::invalid(
            Op::Cm,
            format!("{data} bytes of private data; at most {MAX_PRIVATE_DATA}"),
        ));
    }
    Ok(ConnParam {
        private: framed,
        responder_resources: 16,
        initiator_depth: 16,
        flow_control: 1,
        retry_count: retry.retry_count,
        rnr_retry_count: retry.rnr_retry,
        srq: 0,
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
    // The builder's ACK timeout (by default the CM derives it from the path's packet
    // lifetime); must precede `rdma_connect` / `rdma_accept`.
    id.set_ack_timeout(qp.retry().ack_timeout)?;
    match start {
        Start::Connect => id.connect(&param, what)?,
        Start::Accept => id.accept(&param, what)?,
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
    crate::sys::cm::release_removed_devices();
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
        parts.resolve_addr(peer, ms)?;
        parts.channel().expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
            timeout,
            &format!("resolve address {peer}"),
        )?;
        parts.resolve_route(peer, ms)?;
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
        self.parts.device()
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
        Ok((qp, unframe(ev.into_private())))
    }
}

/// The passive side: bound to a local address and listening.
pub struct CmListener {
    /// The listening id and its event channel (`Send`: cm ids may be used from any thread;
    /// `accept` takes `&self` and librdmacm serialises).
    id: CmId,
    addr: SocketAddr,
}

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
        let id = CmId::new()?;
        id.bind_addr(addr)?;
        id.listen(16, addr)?;
        Ok(CmListener { id, addr })
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
        // `verbs` is set when bound to a device's address.
        self.id.context().unwrap_or_else(|| {
            Err(Error::from_errno(Op::Cm, format!("listener on {} has no device (bind to the RDMA netdev's address, not a wildcard)", self.addr), libc::ENODEV))
        })
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
        let mut req = self.id.channel().expect(
            ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
            timeout,
            &format!("wait for a connect request on {}", self.addr),
        )?;
        let parts = CmId::adopt_request(&mut req)?;
        let what = format!("accept on {}", self.addr);
        let (qp, _) = establish(qp, parts, &framed, Start::Accept, &what, timeout)?;
        Ok((qp, unframe(req.into_private())))
    }
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
            parts.resolve_addr(peer, ms)?;
            parts
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED,
                    timeout,
                    &format!("resolve address {peer}"),
                )
                .await?;
            parts.resolve_route(peer, ms)?;
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
            Ok((
                QueuePair::from_cm(raw, send, recv)?,
                unframe(ev.into_private()),
            ))
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
            let mut req = self
                .id
                .channel()
                .expect_async(
                    ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST,
                    timeout,
                    &format!("wait for a connect request on {}", self.addr),
                )
                .await?;
            let parts = CmId::adopt_request(&mut req)?;
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
            Ok((
                QueuePair::from_cm(raw, send, recv)?,
                unframe(req.into_private()),
            ))
        }
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
