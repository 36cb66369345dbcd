//! Wakers that panic where a test asks them to: in `wake`, in `clone` or in `drop`, for the
//! panic-injection tests (docs/safety.md, "Unwinding").
//!
//! A waker made from `Arc<impl Wake>` can panic in `wake` and (through its value's `Drop`)
//! in `drop`, from safe code; a `clone` that panics needs a hand-made `RawWaker`, which
//! runtimes do make. This one is hand-made so that all three can be tested alike.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{RawWaker, RawWakerVTable, Waker};

/// Where the waker panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// In `wake` and `wake_by_ref`.
    Wake,
    /// In `clone`.
    Clone,
    /// In `drop`.
    Drop,
}

/// What the waker's copies share: where to panic, whether armed, and what happened.
#[derive(Debug)]
pub struct Evil {
    site: Site,
    armed: AtomicBool,
    /// Panics raised so far.
    pub panics: AtomicUsize,
    /// Wakes asked for so far (panicking or not).
    pub wakes: AtomicUsize,
}

impl Evil {
    /// From now on, panics at its site.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// From now on, behaves.
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }

    /// A guard that disarms the waker when dropped: declared after everything that may
    /// hold a copy, it is dropped first, so that a failing test unwinds without a second
    /// (aborting) panic from a copy's `drop`.
    pub fn disarm_on_drop(self: &Arc<Self>) -> Disarm {
        Disarm(self.clone())
    }

    /// Panics raised so far.
    pub fn panicked(&self) -> usize {
        self.panics.load(Ordering::SeqCst)
    }

    fn strike(&self, at: Site) {
        if self.site == at && self.armed.load(Ordering::SeqCst) {
            self.panics.fetch_add(1, Ordering::SeqCst);
            panic!("injected: a waker that panics in {at:?}");
        }
    }
}

/// Disarms its waker when dropped (see [`Evil::disarm_on_drop`]).
#[derive(Debug)]
pub struct Disarm(Arc<Evil>);

impl Drop for Disarm {
    fn drop(&mut self) {
        self.0.disarm();
    }
}

/// A waker (unarmed) that panics at `site` once armed, and what its copies share.
pub fn evil(site: Site) -> (Arc<Evil>, Waker) {
    let e = Arc::new(Evil {
        site,
        armed: AtomicBool::new(false),
        panics: AtomicUsize::new(0),
        wakes: AtomicUsize::new(0),
    });
    let raw = RawWaker::new(Arc::into_raw(e.clone()).cast(), &VTABLE);
    // SAFETY: the vtable's functions keep RawWaker's contract: `data` is an
    // `Arc<Evil>::into_raw` pointer holding one strong count per copy of the waker; clone
    // adds one, wake and drop give theirs back, wake_by_ref leaves it.
    (e, unsafe { Waker::from_raw(raw) })
}

static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, wake, wake_by_ref, drop_waker);

/// # Safety
/// `data` is a live copy's pointer (see [`evil`]).
unsafe fn clone(data: *const ()) -> RawWaker {
    // SAFETY: a live copy holds a strong count, so the Evil is alive.
    let e = unsafe { &*data.cast::<Evil>() };
    e.strike(Site::Clone);
    // SAFETY: as above; the new copy gets a count of its own.
    unsafe { Arc::increment_strong_count(data.cast::<Evil>()) };
    RawWaker::new(data, &VTABLE)
}

/// # Safety
/// `data` is a live copy's pointer, given up by this call.
unsafe fn wake(data: *const ()) {
    // SAFETY: this copy's strong count, taken back here (and dropped on every path).
    let e = unsafe { Arc::from_raw(data.cast::<Evil>()) };
    e.wakes.fetch_add(1, Ordering::SeqCst);
    e.strike(Site::Wake);
}

/// # Safety
/// `data` is a live copy's pointer.
unsafe fn wake_by_ref(data: *const ()) {
    // SAFETY: a live copy holds a strong count, so the Evil is alive.
    let e = unsafe { &*data.cast::<Evil>() };
    e.wakes.fetch_add(1, Ordering::SeqCst);
    e.strike(Site::Wake);
}

/// # Safety
/// `data` is a live copy's pointer, given up by this call.
unsafe fn drop_waker(data: *const ()) {
    // SAFETY: this copy's strong count, taken back here (and dropped on every path).
    let e = unsafe { Arc::from_raw(data.cast::<Evil>()) };
    e.strike(Site::Drop);
}
