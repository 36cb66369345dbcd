//! A scope's end: every request posted in it waited for (or, past the drain deadline or when
//! the closure unwound, flushed and then waited for) before its borrows end.

use super::{Scope, FLUSH_LIMIT};
use crate::deadline::deadline_after;
use crate::unwind::{AbortOnUnwind, Deferred};
use std::time::Instant;

/// Waits for (or flushes) a scope's requests when it ends, returned or unwound.
pub(super) struct Drain<'a, 'scope, 'env> {
    pub(super) scope: &'a Scope<'scope, 'env>,
    /// Whether the scope's closure returned. Not `std::thread::panicking()`: a scope run by a
    /// `Drop` while the thread unwinds from an unrelated panic has a closure that returned,
    /// and its requests are drained, not flushed: only the scope's own unwind flushes.
    pub(super) returned: bool,
}

impl Drop for Drain<'_, '_, '_> {
    fn drop(&mut self) {
        // Nothing may end the drain early (docs/safety.md, "Unwinding"): a panic raised by a
        // poll (a task's waker, woken by it) is kept until every request has completed and
        // raised then; anything else that unwinds out of here aborts the process, since the
        // borrows would end while the NIC may still use them.
        let must_finish = AbortOnUnwind("a scope's drain");
        let mut panics = Deferred::default();
        self.drain(&mut panics);
        must_finish.defuse();
        panics.resume();
    }
}

impl Drain<'_, '_, '_> {
    fn drain(&self, panics: &mut Deferred) {
        let scope = self.scope;
        // The closure unwound, or told to: flush the queue pairs so that requests that would
        // never complete (a receive whose message will not come) finish now, with a flush
        // error.
        let mut flushed = !self.returned || scope.flush_at_end.get();
        if flushed {
            scope.flush_unfinished();
        } else if scope.posted.borrow().iter().all(|e| e.done.get()) {
            // Every request's completion taken already (each handle spun): nothing to wait
            // for, and no deadline to read the clock for.
            return;
        }
        let mut deadline = deadline_after(if flushed {
            FLUSH_LIMIT
        } else {
            scope.drain_deadline
        });
        let n = scope.posted.borrow().len();
        for i in 0..n {
            loop {
                let mut step = Ok(false);
                let mut panicked = true;
                panics.run(|| {
                    step = scope.complete(i, deadline);
                    panicked = false;
                });
                match step {
                    // A waker panicked in a poll, after the poll recorded its completions:
                    // go on (the deadline below still bounds the wait).
                    Ok(false) if panicked && deadline.is_none_or(|d| Instant::now() < d) => {}
                    Ok(true) => break,
                    Ok(false) if !flushed => {
                        // Only queue pairs with requests still in flight are flushed: first
                        // record what completed meanwhile behind handles nobody spun (a
                        // waker's panic cuts this short, and more is flushed: the safe side).
                        panics.run(|| scope.record_completed());
                        scope.flush_unfinished();
                        flushed = true;
                        deadline = deadline_after(FLUSH_LIMIT);
                        crate::diag::warn(format_args!(
                            "requests of a scope were still in flight {:?} after it ended; \
                             moved their queue pairs to the error state",
                            scope.drain_deadline
                        ));
                    }
                    Ok(false) => {
                        // Flushed, and still no completion: the NIC may still use borrowed
                        // memory and nothing can tell when it stops.
                        crate::diag::warn(format_args!(
                            "flushed requests of a scope did not complete within \
                             {FLUSH_LIMIT:?}; aborting"
                        ));
                        std::process::abort();
                    }
                    Err(_) => {
                        crate::diag::warn(format_args!(
                            "cannot poll a completion queue with requests of a scope in \
                             flight; aborting"
                        ));
                        std::process::abort();
                    }
                }
            }
        }
    }
}
