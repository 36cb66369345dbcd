//! The tasks awaiting a queue's requests: one waker per request slot, and the one waker a
//! reactor is given for the queue's fds, which wakes them all.
//!
//! A reactor keeps one waker per fd and direction (tokio's `poll_read_ready` does), but many
//! tasks may await requests of one queue. If the reactor held one of their wakers, that task
//! would have to poll the queue for everyone; a task that stopped polling its request (kept
//! it idle after a `select!`, finished it with a blocking `spin`, or forgot it) would strand
//! the others, their completions unpolled in the CQ. So the reactor is given the queue's
//! *fan-out* waker instead: when the fd turns readable it wakes every task registered in a
//! slot; the first to run takes the events and polls the CQ, which records the completions,
//! and the rest find theirs (or park again). Spurious wakeups are possible; lost ones are not.
//!
//! The wakers live in [`AtomicWaker`]s, so the fan-out (which a reactor may call from any
//! thread) needs no lock; the table is allocated once, at the queue's first await.
//! Registering a waker clones it only when it would wake another task (a reference count);
//! recording a completion takes its waker out and wakes it. Neither allocates nor locks.

use crate::unwind::{AbortOnUnwind, Deferred};
use futures_util::task::AtomicWaker;
use std::cell::OnceCell;
use std::sync::Arc;
use std::task::{Wake, Waker};

/// One waker per request slot.
struct Table {
    slots: Box<[AtomicWaker]>,
}

impl Wake for Table {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // A task's waker that panics does not keep the tasks after it asleep. Its panic is
        // not raised here: the caller is a runtime's I/O driver, and a panic there stops the
        // runtime for every task (tokio's current-thread runtime loses its driver, a worker
        // of the multi-thread one dies). The panic hook has reported it; the task whose waker
        // it is stays as its waker left it.
        let mut panics = Deferred::default();
        for w in self.slots.iter() {
            panics.run(|| w.wake());
        }
        panics.contain();
    }
}

/// The tasks awaiting a queue's requests (see the module).
pub(crate) struct Waiters {
    /// How many request slots the queue has.
    len: usize,
    /// The table, and the fan-out waker over it; made at the first registration.
    table: OnceCell<(Arc<Table>, Waker)>,
}

impl Waiters {
    /// No waiter yet, for a queue of `len` request slots.
    pub(crate) fn new(len: usize) -> Waiters {
        Waiters {
            len,
            table: OnceCell::new(),
        }
    }

    fn table(&self) -> &(Arc<Table>, Waker) {
        self.table.get_or_init(|| {
            let table = Arc::new(Table {
                slots: (0..self.len).map(|_| AtomicWaker::new()).collect(),
            });
            let fan_out = Waker::from(table.clone());
            (table, fan_out)
        })
    }

    /// Records `waker` as the task awaiting the request in slot `index`.
    ///
    /// `AtomicWaker::register` runs the waker's `clone` (and the `Drop` of the waker it
    /// replaces) while it holds the slot in its registering state; a panic there would leave
    /// the slot registering for good, and every later task awaiting a request in it would
    /// never be woken. So the waker is cloned here first (a `clone` that panics then unwinds
    /// to the caller, a future's poll whose handle is intact, with the slot untouched), and a
    /// panic from inside `register` itself (a `clone` that panics only on a second call, or
    /// the replaced waker's `Drop`) aborts the process. A clone is a reference count for
    /// every waker made from `Arc<impl Wake>`; nothing is allocated.
    pub(crate) fn register(&self, index: u32, waker: &Waker) {
        if let Some(w) = self.table().0.slots.get(index as usize) {
            let probe = waker.clone();
            let must_finish = AbortOnUnwind("registering a task's waker in its request's slot");
            w.register(&probe);
            must_finish.defuse();
            drop(probe);
        }
    }

    /// The request in slot `index` completed: wakes its task, if one awaits it. A panic of
    /// the task's waker is kept in `panics`, for the caller to raise once its batch is done.
    #[inline]
    pub(crate) fn wake(&self, index: u32, panics: &mut Deferred) {
        if let Some((table, _)) = self.table.get() {
            if let Some(w) = table.slots.get(index as usize) {
                panics.run(|| w.wake());
            }
        }
    }

    /// Nobody awaits slot `index` any more (its request ended, or its handle was dropped):
    /// its waker is dropped, so that the slot keeps no task alive. The waker's `Drop` is code
    /// we do not control and may panic: callers call this last, once their state is recorded.
    #[inline]
    pub(crate) fn forget(&self, index: u32) {
        if let Some((table, _)) = self.table.get() {
            if let Some(w) = table.slots.get(index as usize) {
                drop(w.take());
            }
        }
    }

    /// The waker to give a reactor for the queue's fds: it wakes every registered task.
    pub(crate) fn fan_out(&self) -> &Waker {
        &self.table().1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        let w = Waker::from(c.clone());
        (c, w)
    }

    #[test]
    fn the_fan_out_wakes_every_registered_task_once() {
        let waiters = Waiters::new(4);
        let (a, wa) = counter();
        let (b, wb) = counter();
        waiters.register(0, &wa);
        waiters.register(3, &wb);
        waiters.fan_out().wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        // Woken wakers are taken: a second fan-out wakes nobody until they register again.
        waiters.fan_out().wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        waiters.register(0, &wa);
        waiters.wake(0, &mut Deferred::default());
        assert_eq!(a.0.load(Ordering::SeqCst), 2);
    }

    struct Panics;
    impl Wake for Panics {
        fn wake(self: Arc<Self>) {
            panic!("a waker that panics");
        }
    }

    #[test]
    fn a_panicking_waker_does_not_keep_the_others_asleep() {
        let waiters = Waiters::new(3);
        let (a, wa) = counter();
        let (b, wb) = counter();
        waiters.register(0, &wa);
        waiters.register(1, &Waker::from(Arc::new(Panics)));
        waiters.register(2, &wb);
        // The fan-out (a runtime's I/O driver calls it) contains the panic.
        waiters.fan_out().wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        // A slot's own wake keeps the panic for the caller.
        waiters.register(1, &Waker::from(Arc::new(Panics)));
        let mut panics = Deferred::default();
        waiters.wake(1, &mut panics);
        assert!(panics.caught());
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| panics.resume())).is_err()
        );
    }

    #[test]
    fn a_forgotten_slot_wakes_nobody_and_out_of_range_is_ignored() {
        let waiters = Waiters::new(2);
        let (a, wa) = counter();
        waiters.register(1, &wa);
        waiters.forget(1);
        waiters.wake(1, &mut Deferred::default());
        waiters.fan_out().wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
        waiters.register(7, &wa);
        waiters.wake(7, &mut Deferred::default());
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
    }
}
