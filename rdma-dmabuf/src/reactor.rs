//! Driving the crate from any reactor: every kernel object that signals readiness is exposed
//! as a borrowed file descriptor ([`AsFd`]) with non-blocking steps, so tokio (the `tokio`
//! feature), async-io or a hand-written `epoll` loop can wait on it without a thread per
//! queue.
//!
//! | object | fd | readable when | step |
//! | --- | --- | --- | --- |
//! | a queue pair's completion channel | [`QueuePair::completion_fd`](crate::QueuePair::completion_fd) | an armed CQ got a completion | [`QueuePair::arm_completions`](crate::QueuePair::arm_completions), then wait, then [`QueuePair::take_completion_events`](crate::QueuePair::take_completion_events) |
//! | a shared receive queue's completion channel | [`SharedReceiveQueue::completion_fd`](crate::SharedReceiveQueue::completion_fd) | an armed CQ got a receive completion | [`SharedReceiveQueue::arm_completions`](crate::SharedReceiveQueue::arm_completions), then wait, then [`SharedReceiveQueue::take_completion_events`](crate::SharedReceiveQueue::take_completion_events) |
//! | an rdma_cm connection's event channel | [`QueuePair::cm_event_fd`](crate::QueuePair::cm_event_fd) | the peer disconnected, or the device is being removed | [`QueuePair::take_cm_events`](crate::QueuePair::take_cm_events) |
//! | a device's asynchronous events | [`AsyncEvents`] (`ibv_context.async_fd`) | an event is queued | [`AsyncEvents::try_next`] |
//! | a dma-buf's implicit fences | [`export_fences`](crate::fence::export_fences) gives a sync_file | the fences signalled | none (readable is the answer) |
//!
//! Every fd here is non-blocking (`O_NONBLOCK` is set when the object is made) and borrowed
//! from the object that owns it: it is closed when that object is destroyed, so a reactor
//! registration must end first (the borrow's lifetime says so).
//!
//! Waiting for a request: [`Pending::register_waker`](crate::Pending::register_waker)
//! records a [`Waker`](std::task::Waker) in the request's slot, and whoever polls the queue
//! pair (any task, any step above) wakes it when its completion is recorded. The wakers'
//! table is allocated once, at the queue pair's first await, so neither posting nor
//! completing allocates or locks.
//!
//! A runtime's future for a request calls
//! [`Pending::poll_with`](crate::Pending::poll_with) with a closure that waits for the
//! queue pair's fds on its reactor (the `tokio` feature's is the model); the steps below are
//! for hand-written loops. The closure is given a `Context` whose waker is the queue pair's
//! *fan-out* waker, not the polling task's: register that one with the reactor. It wakes
//! every task awaiting a request of the queue pair, so a reactor that keeps one waker per fd
//! never strands a task behind another that stopped polling its own request.
//!
//! The lost-wakeup race is closed the usual way: arm (`ibv_req_notify_cq`), poll the CQ once
//! more, and only then wait for the fd: a completion that arrived before arming is found by
//! the poll; one after it makes the fd readable. [`QueuePair::arm_completions`](crate::QueuePair::arm_completions) does both.

use crate::device::Context;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use crate::cm_id::ConnectionEnd;

/// What a reactor did when [`Pending::poll_with`](crate::Pending::poll_with) asked it to
/// wait for a queue pair's fds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStep {
    /// An fd was ready and its events were taken (and, for the completion channel, the CQ
    /// polled): look again.
    Again,
    /// The waker given to the step (the queue's fan-out waker, which wakes every task
    /// awaiting one of its requests) is registered with the reactor for the queue's fds.
    Parked,
    /// No reactor can wait here (none running, or the queue pair has no completion
    /// channel): the task reschedules itself and polls again (a busy loop, but never a lost
    /// wakeup).
    Spin,
}

/// What an asynchronous event is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventElement {
    /// A queue pair, by number.
    Qp(u32),
    /// A completion queue.
    Cq,
    /// A shared receive queue.
    Srq,
    /// A work queue.
    Wq,
    /// A port, by number.
    Port(u8),
    /// The device as a whole.
    Device,
}

/// The kinds of `ibv_async_event` (`enum ibv_event_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: a CQ overran; its queue pairs are flushed.
    CqError,
    /// `IBV_EVENT_QP_FATAL`: the queue pair is in the error state; it is flushed.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: invalid request on the queue pair; it is flushed.
    QpRequestError,
    /// `IBV_EVENT_QP_ACCESS_ERR`: local access violation; the queue pair is flushed.
    QpAccessError,
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a queue pair in RTR.
    CommEstablished,
    /// `IBV_EVENT_SQ_DRAINED`: the send queue drained (SQD state).
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`: the connection migrated to its alternate path.
    PathMigrated,
    /// `IBV_EVENT_PATH_MIG_ERR`: path migration failed.
    PathMigrationError,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable; every queue pair on it is flushed.
    DeviceFatal,
    /// `IBV_EVENT_PORT_ACTIVE`: the port came up.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: the port went down.
    PortError,
    /// `IBV_EVENT_LID_CHANGE`.
    LidChange,
    /// `IBV_EVENT_PKEY_CHANGE`.
    PkeyChange,
    /// `IBV_EVENT_SM_CHANGE`.
    SmChange,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqError,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`.
    QpLastWqeReached,
    /// `IBV_EVENT_CLIENT_REREGISTER`.
    ClientReregister,
    /// `IBV_EVENT_GID_CHANGE`: the port's GID table changed.
    GidChange,
    /// `IBV_EVENT_WQ_FATAL`.
    WqFatal,
    /// A code this crate does not know (a newer kernel).
    Other(u32),
}

impl AsyncEventKind {
    fn from_raw(v: u32) -> AsyncEventKind {
        use AsyncEventKind as K;
        match v {
            0 => K::CqError,
            1 => K::QpFatal,
            2 => K::QpRequestError,
            3 => K::QpAccessError,
            4 => K::CommEstablished,
            5 => K::SqDrained,
            6 => K::PathMigrated,
            7 => K::PathMigrationError,
            8 => K::DeviceFatal,
            9 => K::PortActive,
            10 => K::PortError,
            11 => K::LidChange,
            12 => K::PkeyChange,
            13 => K::SmChange,
            14 => K::SrqError,
            15 => K::SrqLimitReached,
            16 => K::QpLastWqeReached,
            17 => K::ClientReregister,
            18 => K::GidChange,
            19 => K::WqFatal,
            other => K::Other(other),
        }
    }

    /// Whether the event ends the queue pairs it concerns (they are flushed, and every
    /// request on them completes with an error).
    pub fn is_fatal(self) -> bool {
        matches!(
            self,
            AsyncEventKind::CqError
                | AsyncEventKind::QpFatal
                | AsyncEventKind::QpRequestError
                | AsyncEventKind::QpAccessError
                | AsyncEventKind::DeviceFatal
        )
    }
}

/// One asynchronous event of a device, copied and already acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// What it happened to.
    pub element: EventElement,
    /// How many of this crate's queue pairs were flushed because of it (fatal events).
    pub flushed: usize,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} on {:?}", self.kind, self.element)
    }
}

/// A device's asynchronous events (`ibv_get_async_event` on the context's `async_fd`),
/// read without blocking and acknowledged (`ibv_ack_async_event`) before they are returned.
///
/// A fatal event flushes the queue pairs of this crate that it concerns (moves them to the
/// error state), so every request pending on them completes with an error and its region
/// comes back: a task awaiting one is woken through the queue pair's completion channel.
///
/// The events of a context go to whoever reads them first: read them in one place per
/// context. The fd is set non-blocking for the whole context.
pub struct AsyncEvents {
    ctx: Arc<Context>,
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl AsyncEvents {
    /// The events of `ctx`; sets its `async_fd` non-blocking.
    ///
    /// # Errors
    /// [`Error::Verbs`] if the fd's flags cannot be changed.
    pub fn new(ctx: &Arc<Context>) -> Result<AsyncEvents> {
        let events = AsyncEvents { ctx: ctx.clone() };
        crate::deadline::set_nonblocking(events.as_fd()).map_err(|e| {
            Error::from_errno(
                Op::QueryDevice,
                format!("{} (O_NONBLOCK on the async event fd)", ctx.name()),
                e as i32,
            )
        })?;
        Ok(events)
    }

    /// The device.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The next event, if one is queued (never blocks). A fatal one has flushed the queue
    /// pairs it concerns before it is returned.
    ///
    /// # Errors
    /// [`Error::Verbs`] if reading the fd fails otherwise than with `EAGAIN`.
    pub fn try_next(&self) -> Result<Option<AsyncEvent>> {
        let mut ev = MaybeUninit::<ffi::ibv_async_event>::uninit();
        // SAFETY: open context; `ev` is valid for writes of the struct. The fd is
        // non-blocking, so this fails with EAGAIN when nothing is queued.
        if unsafe { ffi::ibv_get_async_event(self.ctx.as_ptr(), ev.as_mut_ptr()) } != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                e => Err(Error::from_errno(
                    Op::QueryDevice,
                    format!("{} ibv_get_async_event", self.ctx.name()),
                    e.unwrap_or(libc::EIO),
                )),
            };
        }
        let p = ev.as_mut_ptr();
        let code_ptr = p
            .wrapping_byte_add(std::mem::offset_of!(ffi::ibv_async_event, event_type))
            .cast::<u32>();
        // SAFETY: filled by ibv_get_async_event. The type is read as a plain integer (a
        // newer kernel may send a value the Rust enum lacks, which must not be read as it).
        let code = unsafe { code_ptr.read() };
        let kind = AsyncEventKind::from_raw(code);
        // The element union is 8 bytes, filled by ibv_get_async_event; which member is meant
        // follows from the type, and each is read below as the plain value it is.
        let element_ptr = p
            .wrapping_byte_add(std::mem::offset_of!(ffi::ibv_async_event, element))
            .cast::<usize>();
        let element = match code {
            1..=7 | 16 => {
                // SAFETY: for QP events the union holds the `ibv_qp *`, which stays valid
                // until the event is acknowledged (ibv_destroy_qp waits for that).
                let qp = unsafe { element_ptr.cast::<*mut ffi::ibv_qp>().read() };
                // SAFETY: as above; `qp_num` is a plain field.
                EventElement::Qp(unsafe { (*qp).qp_num })
            }
            0 => EventElement::Cq,
            14 | 15 => EventElement::Srq,
            19 => EventElement::Wq,
            9..=13 | 17 | 18 => {
                // SAFETY: for port events the union holds the port number (an int).
                let port = unsafe { element_ptr.cast::<libc::c_int>().read() };
                EventElement::Port(u8::try_from(port).unwrap_or(u8::MAX))
            }
            _ => EventElement::Device,
        };
        let ctx = self.ctx.as_ptr() as usize;
        let flushed = match (kind, element) {
            (k, EventElement::Qp(qpn)) if k.is_fatal() => {
                flush_live(|q| q.ctx == ctx && q.qpn == qpn)
            }
            (AsyncEventKind::CqError, _) => {
                // SAFETY: for CQ events the union holds the `ibv_cq *`, valid until the
                // ack (ibv_destroy_cq waits for it); only its address is compared.
                let cq = unsafe { element_ptr.cast::<*mut ffi::ibv_cq>().read() } as usize;
                flush_live(|q| q.cq == cq)
            }
            (AsyncEventKind::DeviceFatal, _) => flush_live(|q| q.ctx == ctx),
            _ => 0,
        };
        // SAFETY: the event was returned by ibv_get_async_event and is acknowledged once,
        // after everything read from it.
        unsafe { ffi::ibv_ack_async_event(p) };
        Ok(Some(AsyncEvent {
            kind,
            element,
            flushed,
        }))
    }
}

impl AsFd for AsyncEvents {
    /// The context's `async_fd`, borrowed from the context (which this value holds open).
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the context is open; `async_fd` is a plain field.
        let raw = unsafe { (*self.ctx.as_ptr()).async_fd };
        // SAFETY: libibverbs opened the fd with the context and closes it only when the
        // context is closed, which `self.ctx` prevents for as long as `self` lives.
        unsafe { BorrowedFd::borrow_raw(raw) }
    }
}

/// A queue pair that a fatal event may flush: what identifies it, and its raw handle.
struct LiveQp {
    id: u64,
    ctx: usize,
    qpn: u32,
    cq: usize,
    qp: usize,
    /// Set when a fatal event moved it to the error state (read by its queue pair, which
    /// then refuses posts: rxe never flushes a receive posted in the error state).
    flushed: Arc<AtomicBool>,
}

/// The queue pairs of this process that asynchronous events may concern. Touched when a
/// queue pair is connected or destroyed and on fatal events, never on the hot path.
static LIVE: Mutex<Vec<LiveQp>> = Mutex::new(Vec::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn live() -> std::sync::MutexGuard<'static, Vec<LiveQp>> {
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Moves every live queue pair that `which` picks to the error state; returns how many.
fn flush_live(which: impl Fn(&LiveQp) -> bool) -> usize {
    let list = live();
    let mut n = 0;
    for q in list.iter().filter(|q| which(q)) {
        q.flushed.store(true, Ordering::Release);
        // SAFETY: ibv_qp_attr is a plain C struct; all-zero is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: the QP is live: entries are removed (under this lock, which is held) before
        // their QP is destroyed; libibverbs lets a QP be modified from any thread.
        let rc = unsafe {
            ffi::ibv_modify_qp(
                q.qp as *mut ffi::ibv_qp,
                &mut attr,
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as i32,
            )
        };
        if rc == 0 {
            n += 1;
        }
    }
    n
}

/// A queue pair's entry among those fatal events may flush; removed on drop, which must
/// come before the queue pair is destroyed.
pub(crate) struct Registered {
    id: u64,
    flushed: Arc<AtomicBool>,
}

impl Registered {
    /// Enters a queue pair.
    ///
    /// # Safety
    /// `qp` is a live QP of context `ctx` using CQ `cq`, and the returned value is dropped
    /// before the QP is destroyed.
    pub(crate) unsafe fn new(
        ctx: *mut ffi::ibv_context,
        qp: *mut ffi::ibv_qp,
        cq: *mut ffi::ibv_cq,
        qpn: u32,
    ) -> Registered {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let flushed = Arc::new(AtomicBool::new(false));
        live().push(LiveQp {
            id,
            ctx: ctx as usize,
            qpn,
            cq: cq as usize,
            qp: qp as usize,
            flushed: flushed.clone(),
        });
        Registered { id, flushed }
    }

    /// Whether a fatal event moved the queue pair to the error state (one atomic load).
    #[inline]
    pub(crate) fn flushed(&self) -> bool {
        self.flushed.load(Ordering::Acquire)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        live().retain(|q| q.id != self.id);
    }
}
