//! Completion queues and their completion channels: creation, destruction in the order
//! libibverbs requires, polling in batches without allocating, and sleeping in the kernel
//! until a completion arrives.

use super::device::Context;
use super::fd::set_nonblocking;
use super::wc::{PollArea, PollFailed, Polled, RawCompletion};
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::cell::Cell;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// A completion channel (`ibv_create_comp_channel`); destroyed on drop, after its CQ, and
/// before its context, which it holds until then.
struct CompChannel {
    ch: NonNull<ffi::ibv_comp_channel>,
    /// Released after the channel is destroyed (`ibv_destroy_comp_channel` locks the
    /// context's mutex, so the context must still be open).
    ctx: Arc<Context>,
}

// SAFETY: libibverbs lets a completion channel be used and destroyed from any thread; the
// owning queue pair decides sharing.
unsafe impl Send for CompChannel {}

impl CompChannel {
    fn new(ctx: &Arc<Context>) -> Result<CompChannel> {
        // SAFETY: `ctx` is an open context (the Arc keeps it so for the call and after).
        let ch = unsafe { ffi::ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| {
            Error::last_os(Op::CreateCq, format!("{} (completion channel)", ctx.name()))
        })?;
        let ch = CompChannel {
            ch,
            ctx: ctx.clone(),
        };
        // Non-blocking, so that taking an event never blocks a reactor's thread (the
        // blocking waits poll(2) first).
        set_nonblocking(ch.fd()).map_err(|e| {
            Error::from_errno(
                Op::CreateCq,
                format!("{} (O_NONBLOCK on the completion channel)", ctx.name()),
                e as i32,
            )
        })?;
        Ok(ch)
    }

    /// The channel's fd, borrowed from the channel.
    fn fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the channel is live; `fd` is a plain field.
        let raw = unsafe { self.ch.as_ref() }.fd;
        // SAFETY: libibverbs opened this fd for the channel and closes it only in
        // ibv_destroy_comp_channel, which runs in our Drop, after every borrow of `self`.
        unsafe { BorrowedFd::borrow_raw(raw) }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: the CQ using it was destroyed first (`CompletionQueue::drop` runs before its
        // fields drop, and acknowledges every event taken first),
        // and the context is open (`self.ctx` is released only after this).
        let rc = unsafe { ffi::ibv_destroy_comp_channel(self.ch.as_ptr()) };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_destroy_comp_channel on {} failed: {rc}",
                self.ctx.name()
            ));
        }
    }
}

/// A completion queue, with its completion channel when asked for one. Destroyed on drop:
/// the CQ (after the queue pairs using it, which its owner destroys first), then the channel,
/// then the context reference.
pub(crate) struct CompletionQueue {
    cq: NonNull<ffi::ibv_cq>,
    /// Dropped after the CQ (Drop below).
    channel: Option<CompChannel>,
    /// Events taken from the channel and not yet acknowledged: acknowledged in batches
    /// (`ibv_ack_cq_events` takes the CQ's mutex), and all of them before the CQ is destroyed.
    unacked: Cell<u32>,
    /// Whether the notification is armed and its event not yet taken.
    armed: Cell<bool>,
    /// Where the polls write (zeroed when made: every field a poll reads is initialised).
    area: PollArea,
    /// Dropped last: the CQ and the channel live in this context.
    ctx: Arc<Context>,
}

// SAFETY: libibverbs lets a CQ be polled and destroyed from any thread. The CQ is `!Sync`
// (its `Cell`s, its poll area): its owner decides sharing, and each owner lets one thread at a
// time use it (a queue pair is `!Sync`; a shared receive queue's core, which is `Sync`, gives
// its CQ only to the holder of its one `!Sync` key, the handle: see `SrqCore::cq`), so no two
// polls ever write or read one poll area at once.
unsafe impl Send for CompletionQueue {}

impl CompletionQueue {
    /// A CQ of `entries` entries on `ctx`, with a completion channel if `channel`.
    pub(crate) fn new(ctx: &Arc<Context>, entries: i32, channel: bool) -> Result<Self> {
        let channel = if channel {
            Some(CompChannel::new(ctx)?)
        } else {
            None
        };
        let ch_ptr = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        // SAFETY: open context; the channel (if any) is live and outlives the CQ (the field
        // drops after Drop destroys the CQ).
        let cq =
            unsafe { ffi::ibv_create_cq(ctx.as_ptr(), entries, std::ptr::null_mut(), ch_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| {
            Error::last_os(Op::CreateCq, format!("{} ({entries} entries)", ctx.name()))
        })?;
        Ok(CompletionQueue {
            cq,
            channel,
            unacked: Cell::new(0),
            armed: Cell::new(false),
            area: PollArea::new(),
            ctx: ctx.clone(),
        })
    }

    /// The raw CQ, for `ibv_create_qp`.
    pub(in crate::sys) fn as_ptr(&self) -> *mut ffi::ibv_cq {
        self.cq.as_ptr()
    }

    /// Polls once, handing each completion (its `wr_id` and what it said) to `each`.
    /// Returns how many were consumed. No allocation, no lock. A failure is the bare errno
    /// (small, so that the hot path moves no [`Error`] around); [`CompletionQueue::poll_error`]
    /// words it.
    #[inline]
    pub(crate) fn poll(
        &self,
        each: impl FnMut(u64, RawCompletion),
    ) -> std::result::Result<usize, PollFailed> {
        self.poll_with(|polled| {
            let polled = polled?;
            polled.each(each);
            Ok(polled.len())
        })
    }

    /// Polls once (as many completions as the queue's poll area has room for) and hands
    /// what the provider wrote, or the poll's failure, to `read`, whose result it returns.
    /// No allocation, no lock.
    #[inline(always)]
    pub(crate) fn poll_with<R>(
        &self,
        read: impl FnOnce(std::result::Result<&Polled<'_>, PollFailed>) -> R,
    ) -> R {
        let cq = self.cq.as_ptr();
        self.area.poll(
            |room, wcs| {
                // SAFETY: live CQ; `wcs` has room for `room` entries, the count passed.
                unsafe { ffi::ibv_poll_cq(cq, room, wcs) }
            },
            read,
        )
    }

    /// A failed [`CompletionQueue::poll`] as an error naming the device.
    #[cold]
    pub(crate) fn poll_error(&self, failed: PollFailed) -> Error {
        Error::from_errno(Op::PollCq, self.ctx.name(), failed.errno())
    }

    /// The completion channel's fd (non-blocking), if the CQ has a channel: readable when
    /// an armed CQ got a completion. Borrowed from the CQ, which closes it on drop.
    pub(crate) fn channel_fd(&self) -> Option<BorrowedFd<'_>> {
        self.channel.as_ref().map(CompChannel::fd)
    }

    /// `ibv_req_notify_cq(cq, 0)`: the next completion makes the channel readable. The
    /// caller polls the CQ once more afterwards (what arrived before arming raises no event).
    pub(crate) fn arm(&self) -> Result<()> {
        if self.channel.is_none() {
            return Err(Error::invalid(
                Op::PollCq,
                "the queue pair has no completion channel (QueuePairBuilder::completion_channel)",
            ));
        }
        // SAFETY: live CQ created with a channel (checked above).
        let rc = unsafe { ffi::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if rc != 0 {
            return Err(Error::from_errno(Op::PollCq, "ibv_req_notify_cq", rc));
        }
        self.armed.set(true);
        Ok(())
    }

    /// Whether the notification is armed and has not fired into an event taken since.
    pub(crate) fn is_armed(&self) -> bool {
        self.armed.get()
    }

    /// Takes every event queued on the channel without blocking (`ibv_get_cq_event` until
    /// `EAGAIN`); returns how many. They are acknowledged in batches (see `unacked`).
    pub(crate) fn take_events(&self) -> Result<u32> {
        let Some(ch) = &self.channel else {
            return Ok(0);
        };
        let mut n = 0;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: live channel, valid out-pointers; the fd is non-blocking, so this
            // returns -1 (EAGAIN) at once when no event is queued.
            if unsafe { ffi::ibv_get_cq_event(ch.ch.as_ptr(), &mut cq, &mut ctx) } != 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) | Some(libc::EINTR) | None => break,
                    Some(e) => {
                        return Err(Error::from_errno(Op::PollCq, "ibv_get_cq_event", e));
                    }
                }
            }
            // The channel serves this CQ alone, so `cq` is ours.
            n += 1;
        }
        if n > 0 {
            self.armed.set(false);
        }
        let unacked = self.unacked.get() + n;
        if unacked >= ACK_BATCH {
            self.ack(unacked);
        } else {
            self.unacked.set(unacked);
        }
        Ok(n)
    }

    /// Acknowledges `n` events taken from the channel.
    fn ack(&self, n: u32) {
        if n > 0 {
            // SAFETY: live CQ; `n` events were taken for it and not acknowledged yet.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), n) };
        }
        self.unacked.set(0);
    }
}

/// Completion events acknowledged at once.
const ACK_BATCH: u32 = 64;

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // ibv_destroy_cq waits for every event taken to be acknowledged.
        self.ack(self.unacked.get());
        // SAFETY: the owner destroyed every QP using this CQ before dropping it (`RawQp`'s
        // Drop runs before its fields drop); the context is open (`self.ctx`, released after
        // this); every event taken was acknowledged (just above); destroyed once.
        let rc = unsafe { ffi::ibv_destroy_cq(self.cq.as_ptr()) };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_destroy_cq on {} failed: {rc}",
                self.ctx.name()
            ));
        }
        // The fields drop next: the channel, then the context reference.
    }
}

/// `ibv_wc_status_str`: the library's words for a completion status.
pub(crate) fn status_text(status: u32) -> String {
    // SAFETY: ibv_wc_status_str takes any value.
    let text = unsafe { ffi::ibv_wc_status_str(status) };
    // SAFETY: it returns a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}
