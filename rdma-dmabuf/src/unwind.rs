//! Panic containment where the NIC owns memory.
//!
//! The rule (docs/safety.md, "Unwinding"): no code we do not control (a task's waker, a
//! scope's closure) and nothing that may panic runs between "the NIC may use this memory" and
//! "that is recorded". Where such code must run in the middle of a batch of steps (waking the
//! tasks of the completions one poll consumed, draining a scope), each call is caught, the
//! batch finishes, and only then is the first panic raised again ([`Deferred`]). Where a step
//! cannot be finished at all, the process aborts ([`AbortOnUnwind`]), as `std::thread::scope`
//! would rather than let a borrow end while a thread still uses it.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// A panic's payload.
type Payload = Box<dyn Any + Send>;

/// The first panic of a batch of calls into code we do not control, kept until the batch is
/// done ([`Deferred::resume`]).
#[derive(Default)]
pub(crate) struct Deferred(Option<Payload>);

impl Deferred {
    /// Runs `f`; if it panics, keeps the panic (the first one) instead of unwinding.
    ///
    /// `AssertUnwindSafe` is right here because every caller runs `f` at a point where its
    /// own state is consistent (recorded before calling out), which is what unwind safety
    /// asks for.
    #[inline]
    pub(crate) fn run(&mut self, f: impl FnOnce()) {
        if let Err(p) = catch_unwind(AssertUnwindSafe(f)) {
            self.keep(p);
        }
    }

    fn keep(&mut self, p: Payload) {
        if self.0.is_none() {
            self.0 = Some(p);
        } else {
            // A payload's `Drop` is user code too: a second panic is leaked, not dropped.
            std::mem::forget(p);
        }
    }

    /// Whether a panic was kept.
    #[cfg(test)]
    pub(crate) fn caught(&self) -> bool {
        self.0.is_some()
    }

    /// Whether no panic was kept (so far).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Raises the kept panic again, now that the batch is done. When the thread is already
    /// unwinding (the batch ran in a drop guard), a second panic would abort the process, so
    /// the payload is leaked instead and the first panic goes on.
    #[inline]
    pub(crate) fn resume(self) {
        if let Some(p) = self.0 {
            if std::thread::panicking() {
                std::mem::forget(p);
            } else {
                resume_unwind(p);
            }
        }
    }
}

impl Deferred {
    /// Drops the kept panic without raising it, for callers whose own caller must not
    /// unwind (a runtime's I/O driver). The panic hook has already reported it; the payload
    /// is leaked, since its `Drop` is user code too.
    pub(crate) fn contain(self) {
        if let Some(p) = self.0 {
            std::mem::forget(p);
        }
    }
}

/// Aborts the process if dropped while unwinding: held across a step that must not be left
/// half done, and [`defused`](AbortOnUnwind::defuse) once it is done.
pub(crate) struct AbortOnUnwind(pub(crate) &'static str);

impl AbortOnUnwind {
    /// The step is done.
    pub(crate) fn defuse(self) {
        std::mem::forget(self);
    }
}

impl Drop for AbortOnUnwind {
    // Also on an early return: every use defuses it on the one way out.
    fn drop(&mut self) {
        crate::diag::warn(format_args!(
            "a panic interrupted {}, which must not be left half done; aborting",
            self.0
        ));
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_finishes_before_its_first_panic_is_raised() {
        let mut d = Deferred::default();
        let mut ran = Vec::new();
        for i in 0..4 {
            d.run(|| {
                ran.push(i);
                if i % 2 == 1 {
                    panic!("call {i}");
                }
            });
        }
        assert_eq!(ran, [0, 1, 2, 3], "every call ran");
        assert!(d.caught());
        let p = catch_unwind(AssertUnwindSafe(|| d.resume())).unwrap_err();
        assert_eq!(
            p.downcast_ref::<String>().map(String::as_str),
            Some("call 1")
        );
    }

    #[test]
    fn nothing_caught_resumes_nothing() {
        let mut d = Deferred::default();
        d.run(|| {});
        assert!(!d.caught());
        d.resume();
    }
}
