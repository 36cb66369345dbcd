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
use crate::sys::event::{flush_live, DeviceEvents, RawElement};
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

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
    raw: DeviceEvents,
}

impl fmt::Debug for AsyncEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("device", &self.context().name())
            .finish()
    }
}

impl AsyncEvents {
    /// The events of `ctx`; sets its `async_fd` non-blocking.
    ///
    /// # Errors
    /// [`Error::Verbs`] if the fd's flags cannot be changed.
    pub fn new(ctx: &Arc<Context>) -> Result<AsyncEvents> {
        let events = AsyncEvents {
            raw: DeviceEvents::new(ctx),
        };
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
        self.raw.context()
    }

    /// The raw events, for a reactor registration that holds them (and so the fd) open.
    #[cfg(feature = "tokio")]
    pub(crate) fn raw(&self) -> &DeviceEvents {
        &self.raw
    }

    /// The next event, if one is queued (never blocks). A fatal one has flushed the queue
    /// pairs it concerns before it is returned.
    ///
    /// # Errors
    /// [`Error::Verbs`] if reading the fd fails otherwise than with `EAGAIN`.
    pub fn try_next(&self) -> Result<Option<AsyncEvent>> {
        let ctx = self.context().id();
        // Read before the event is acknowledged: a fatal one flushes the queue pairs it
        // concerns first.
        let next = self.raw.try_next(|raw| {
            let kind = AsyncEventKind::from_raw(raw.code);
            let element = match raw.element {
                RawElement::Qp(qpn) => EventElement::Qp(qpn),
                RawElement::Cq(_) => EventElement::Cq,
                RawElement::Srq => EventElement::Srq,
                RawElement::Wq => EventElement::Wq,
                RawElement::Port(port) => EventElement::Port(u8::try_from(port).unwrap_or(u8::MAX)),
                RawElement::Device => EventElement::Device,
            };
            let flushed = match (kind, raw.element) {
                (k, RawElement::Qp(qpn)) if k.is_fatal() => {
                    flush_live(|q| q.ctx == ctx && q.qpn == qpn)
                }
                // A CQ event's element is the CQ (its address, only compared).
                (AsyncEventKind::CqError, RawElement::Cq(cq)) => flush_live(|q| q.cq == cq),
                (AsyncEventKind::DeviceFatal, _) => flush_live(|q| q.ctx == ctx),
                _ => 0,
            };
            AsyncEvent {
                kind,
                element,
                flushed,
            }
        });
        next.map_err(|e| {
            Error::from_errno(
                Op::QueryDevice,
                format!("{} ibv_get_async_event", self.context().name()),
                e,
            )
        })
    }
}

impl AsFd for AsyncEvents {
    /// The context's `async_fd`, borrowed from the context (which this value holds open).
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.raw.as_fd()
    }
}
