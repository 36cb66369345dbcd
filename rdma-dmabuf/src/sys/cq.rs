//! Completion queues and their completion channels: creation, destruction in the order
//! libibverbs requires, polling in batches without allocating, and sleeping in the kernel
//! until a completion arrives.

use super::device::Context;
use super::fd::set_nonblocking;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::cell::Cell;
use std::mem::MaybeUninit;
use std::num::NonZeroU32;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::Arc;

/// A completion as the poller recorded it, in four 32-bit words, so that each move of it on
/// the completion path is one 16-byte load and store: what the verbs define only for a
/// success (the length) and only for an error (the vendor's code) share a word, and the
/// status shares one with the immediate data's flag (and a bit always set, so that an
/// `Option` of it needs no word of its own).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawCompletion {
    /// `PRESENT | WITH_IMM (if any) | status` (`ibv_wc_status`, whose values are small; one
    /// past 16 bits reads as `0xffff`, an error).
    tag: NonZeroU32,
    /// `byte_len` for a success, `vendor_err` for an error.
    len_or_vendor: u32,
    imm: u32,
    /// The local queue pair the request ran on.
    qp_num: u32,
}

/// In [`RawCompletion::tag`]: always set.
const PRESENT: u32 = 1 << 31;
/// In [`RawCompletion::tag`]: the completion carries immediate data.
const WITH_IMM: u32 = 1 << 16;
/// In [`RawCompletion::tag`]: the status.
const STATUS: u32 = 0xffff;

/// A [`RawCompletion::tag`] of `bits` (never zero: `PRESENT` is set).
#[inline(always)]
fn tag(bits: u32) -> NonZeroU32 {
    NonZeroU32::new(PRESENT | bits).unwrap_or(NonZeroU32::MAX)
}

impl RawCompletion {
    /// The completion's status (`ibv_wc_status`).
    #[inline(always)]
    pub(crate) fn status(&self) -> u32 {
        self.tag.get() & STATUS
    }

    /// Whether it is `IBV_WC_SUCCESS`.
    #[inline(always)]
    pub(crate) fn is_success(&self) -> bool {
        self.status() == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// The bytes transferred (a success's; 0 for an error, where the verbs leave it
    /// undefined).
    #[inline(always)]
    pub(crate) fn byte_len(&self) -> u32 {
        if self.is_success() {
            self.len_or_vendor
        } else {
            0
        }
    }

    /// The immediate data, if the completion carries one.
    #[inline(always)]
    pub(crate) fn imm(&self) -> Option<u32> {
        (self.tag.get() & WITH_IMM != 0).then_some(self.imm)
    }

    /// The vendor's error code (an error's; 0 for a success).
    #[inline(always)]
    pub(crate) fn vendor_err(&self) -> u32 {
        if self.is_success() {
            0
        } else {
            self.len_or_vendor
        }
    }

    /// The local queue pair the request ran on.
    #[inline(always)]
    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// A completion of `status` and `byte_len` (or vendor error), for the tables' tests.
    #[cfg(test)]
    pub(crate) fn for_test(status: u16, len_or_vendor: u32) -> RawCompletion {
        RawCompletion {
            tag: tag(u32::from(status)),
            len_or_vendor,
            imm: 0,
            qp_num: 1,
        }
    }
}

/// `ibv_poll_cq` failed with this errno; see [`CompletionQueue::poll_error`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct PollFailed(i32);

/// The completions one poll took from a completion queue, as the provider wrote them
/// ([`CompletionQueue::poll_into`]); read as [`RawCompletion`]s. On the stack, uninitialised
/// past what the poll wrote.
pub(crate) struct Polled {
    wcs: [MaybeUninit<ffi::ibv_wc>; BATCH],
    /// How many of `wcs` the last poll wrote.
    n: usize,
}

impl Polled {
    /// Room for one poll, nothing in it.
    #[inline(always)]
    pub(crate) fn new() -> Polled {
        Polled {
            wcs: [const { MaybeUninit::uninit() }; BATCH],
            n: 0,
        }
    }

    /// The poll's completions, in the order the provider wrote them.
    #[inline(always)]
    fn written(&self) -> &[ffi::ibv_wc] {
        // SAFETY: the poll that set `n` wrote the first `n` entries (`n <= BATCH`);
        // `MaybeUninit<T>` has `T`'s layout. (A provider may leave a field the verbs do not
        // define for a completion unwritten: mlx5 a send's `byte_len`; rxe writes every one.
        // See docs/safety.md, "What the provider writes".)
        unsafe { std::slice::from_raw_parts(self.wcs.as_ptr().cast(), self.n) }
    }

    /// Hands each completion (its `wr_id` and what it said) to `each`, in order.
    #[inline(always)]
    pub(crate) fn each(&self, mut each: impl FnMut(u64, RawCompletion)) {
        for wc in self.written() {
            each(wc.wr_id, RawCompletion::of(wc));
        }
    }

    /// The completion of `wr_id` if the poll took that one alone and it succeeded: the
    /// common case of a poll for one's own request, which then has nothing else to record.
    #[inline(always)]
    pub(crate) fn only_success(&self, wr_id: u64) -> Option<RawCompletion> {
        match self.written() {
            [wc] if wc.wr_id == wr_id && wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS => {
                Some(RawCompletion::of(wc))
            }
            _ => None,
        }
    }
}

impl RawCompletion {
    /// What the provider's work completion says.
    #[inline(always)]
    fn of(wc: &ffi::ibv_wc) -> RawCompletion {
        let with_imm = wc.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
        let imm = if with_imm {
            // SAFETY: with IBV_WC_WITH_IMM set, the union holds the immediate data.
            u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
        } else {
            0
        };
        let success = wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS;
        let status = wc.status.min(STATUS);
        let imm_flag = if with_imm { WITH_IMM } else { 0 };
        RawCompletion {
            tag: tag(imm_flag | status),
            len_or_vendor: if success { wc.byte_len } else { wc.vendor_err },
            imm,
            qp_num: wc.qp_num,
        }
    }
}

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
    /// Dropped last: the CQ and the channel live in this context.
    ctx: Arc<Context>,
}

// SAFETY: libibverbs lets a CQ be polled and destroyed from any thread; the owning queue pair
// is `!Sync`, so one thread uses it at a time.
unsafe impl Send for CompletionQueue {}

/// Completions taken from the CQ per `ibv_poll_cq` call.
const BATCH: usize = 16;

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
        let mut polled = Polled::new();
        let n = self.poll_into(&mut polled)?;
        polled.each(each);
        Ok(n)
    }

    /// Polls once into `polled` (up to [`BATCH`] completions, as the provider wrote them);
    /// returns how many it holds. No allocation, no lock.
    #[inline(always)]
    pub(crate) fn poll_into(&self, polled: &mut Polled) -> std::result::Result<usize, PollFailed> {
        // SAFETY: live CQ; `polled.wcs` has room for BATCH entries, the count passed.
        let n = unsafe {
            ffi::ibv_poll_cq(
                self.cq.as_ptr(),
                BATCH as i32,
                polled.wcs.as_mut_ptr().cast(),
            )
        };
        if n < 0 {
            polled.n = 0;
            return Err(PollFailed(-n));
        }
        // At most BATCH (the provider writes no more than it is given room for).
        polled.n = (n as usize).min(BATCH);
        Ok(polled.n)
    }

    /// A failed [`CompletionQueue::poll`] as an error naming the device.
    #[cold]
    pub(crate) fn poll_error(&self, failed: PollFailed) -> Error {
        Error::from_errno(Op::PollCq, self.ctx.name(), failed.0)
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
