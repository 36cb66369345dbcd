//! A device's asynchronous events (`ibv_get_async_event` / `ibv_ack_async_event` on the
//! context's `async_fd`), and the queue pairs a fatal one may flush (`ibv_modify_qp` to the
//! error state).

use super::device::Context;
use rdma_sys as ffi;
use std::fmt;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The asynchronous events of a context: holds the context (and so its `async_fd`) open.
#[derive(Clone)]
pub(crate) struct DeviceEvents {
    ctx: Arc<Context>,
}

impl fmt::Debug for DeviceEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceEvents")
            .field("device", &self.ctx.name())
            .finish()
    }
}

/// What an asynchronous event is about, as its type says the element union holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RawElement {
    /// A queue pair, by number.
    Qp(u32),
    /// A completion queue, by address (for comparisons only).
    Cq(usize),
    /// A shared receive queue.
    Srq,
    /// A work queue.
    Wq,
    /// A port, by number.
    Port(libc::c_int),
    /// The device as a whole.
    Device,
}

/// An asynchronous event, read while it is not yet acknowledged.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawAsyncEvent {
    /// `event_type`, as a plain integer (a newer kernel may send a value `enum
    /// ibv_event_type` lacks).
    pub code: u32,
    /// What it is about.
    pub element: RawElement,
}

impl DeviceEvents {
    /// The events of `ctx`.
    pub(crate) fn new(ctx: &Arc<Context>) -> DeviceEvents {
        DeviceEvents { ctx: ctx.clone() }
    }

    /// The device.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The next event, if one is queued (never blocks once the fd is non-blocking): `f` is
    /// called with it before it is acknowledged (`ibv_destroy_qp` / `ibv_destroy_cq` of the
    /// object it names wait for that), and its value returned.
    ///
    /// # Errors
    /// The errno of `ibv_get_async_event`, other than `EAGAIN` and `EINTR` (`Ok(None)`).
    pub(crate) fn try_next<R>(
        &self,
        f: impl FnOnce(RawAsyncEvent) -> R,
    ) -> std::result::Result<Option<R>, i32> {
        let mut ev = MaybeUninit::<ffi::ibv_async_event>::uninit();
        // SAFETY: open context; `ev` is valid for writes of the struct. The fd is
        // non-blocking, so this fails with EAGAIN when nothing is queued.
        if unsafe { ffi::ibv_get_async_event(self.ctx.as_ptr(), ev.as_mut_ptr()) } != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                e => Err(e.unwrap_or(libc::EIO)),
            };
        }
        let p = ev.as_mut_ptr();
        let code_ptr = p
            .wrapping_byte_add(std::mem::offset_of!(ffi::ibv_async_event, event_type))
            .cast::<u32>();
        // SAFETY: filled by ibv_get_async_event. The type is read as a plain integer (a
        // newer kernel may send a value the Rust enum lacks, which must not be read as it).
        let code = unsafe { code_ptr.read() };
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
                RawElement::Qp(unsafe { (*qp).qp_num })
            }
            0 => {
                // SAFETY: for CQ events the union holds the `ibv_cq *`, valid until the
                // ack (ibv_destroy_cq waits for it); only its address is compared.
                RawElement::Cq(unsafe { element_ptr.cast::<*mut ffi::ibv_cq>().read() } as usize)
            }
            14 | 15 => RawElement::Srq,
            19 => RawElement::Wq,
            9..=13 | 17 | 18 => {
                // SAFETY: for port events the union holds the port number (an int).
                RawElement::Port(unsafe { element_ptr.cast::<libc::c_int>().read() })
            }
            _ => RawElement::Device,
        };
        let out = f(RawAsyncEvent { code, element });
        // SAFETY: the event was returned by ibv_get_async_event and is acknowledged once,
        // after everything read from it.
        unsafe { ffi::ibv_ack_async_event(p) };
        Ok(Some(out))
    }
}

impl AsFd for DeviceEvents {
    /// The context's `async_fd`, borrowed from the context (which this value holds open).
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the context is open; `async_fd` is a plain field.
        let raw = unsafe { (*self.ctx.as_ptr()).async_fd };
        // SAFETY: libibverbs opened the fd with the context and closes it only when the
        // context is closed, which `self.ctx` prevents for as long as `self` lives.
        unsafe { BorrowedFd::borrow_raw(raw) }
    }
}

impl AsRawFd for DeviceEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

// SAFETY: the context's `async_fd`, a field libibverbs sets when it opens the context and
// never changes, stays open (the same file) while the context is, which `self.ctx` keeps.
#[cfg(feature = "tokio")]
unsafe impl super::fd::StableFd for DeviceEvents {}

/// What identifies a queue pair that a fatal event may flush.
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpKey {
    /// Its context's address.
    pub ctx: usize,
    /// Its number.
    pub qpn: u32,
    /// Its CQ's address.
    pub cq: usize,
}

/// A queue pair that a fatal event may flush: what identifies it, and its raw handle.
struct LiveQp {
    id: u64,
    key: QpKey,
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
pub(crate) fn flush_live(which: impl Fn(&QpKey) -> bool) -> usize {
    let list = live();
    let mut n = 0;
    for q in list.iter().filter(|q| which(&q.key)) {
        q.flushed.store(true, Ordering::Release);
        let mut attr: ffi::ibv_qp_attr = super::zeroed();
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
            key: QpKey {
                ctx: ctx as usize,
                qpn,
                cq: cq as usize,
            },
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
