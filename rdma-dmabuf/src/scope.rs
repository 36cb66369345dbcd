//! The scoped, borrow-based layer: posts borrow their regions instead of owning them, and
//! every request posted in a scope has completed before [`scope`] returns, also when the
//! closure panics or returns early. The borrow checker keeps the CPU off a region for the
//! scope's duration (shared borrows for what the NIC reads, exclusive ones for what it writes),
//! like `std::thread::scope` does for threads.
//!
//! One scope may post on several queue pairs, so one region can be sent to many peers at once
//! (a multicast), which the owned layer cannot express. The scope records each post in a
//! vector, so unlike the owned layer it may allocate.

use crate::error::Result;
use crate::mr::{Backing, MemoryRegion};
use crate::qp::QueuePair;
use crate::remote::RemoteRegion;
use crate::wr::{WorkCompletion, WorkKind};
use std::cell::{Cell, RefCell};
use std::marker::PhantomData;

/// Runs `f` with a [`Scope`]; returns once everything posted in it has completed. A receive
/// posted in the scope waits for its message: post only what the peer will answer. If `f`
/// panics, the queue pairs used are moved to the error state first, so that every request
/// finishes (flushed) and the panic goes on.
///
/// If a completion queue cannot be polled while requests of the scope are in flight, the
/// process aborts: returning would let the NIC touch memory whose borrow has ended.
pub fn scope<'env, T>(f: impl for<'scope> FnOnce(&'scope Scope<'scope, 'env>) -> T) -> T {
    let s = Scope {
        posted: RefCell::new(Vec::new()),
        _scope: PhantomData,
        _env: PhantomData,
    };
    let guard = Drain(&s);
    let out = f(&s);
    drop(guard);
    out
}

struct Entry<'scope> {
    qp: &'scope QueuePair,
    index: u32,
    gen: u32,
    kind: WorkKind,
    taken: Cell<Option<crate::slots::RawCompletion>>,
    done: Cell<bool>,
}

/// Posts whose regions are borrowed for `'scope`.
pub struct Scope<'scope, 'env: 'scope> {
    posted: RefCell<Vec<Entry<'scope>>>,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl std::fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scope")
            .field("posted", &self.posted.borrow().len())
            .finish()
    }
}

/// A request posted in a scope; [`ScopedPending::wait`] returns its completion.
#[derive(Debug)]
pub struct ScopedPending<'scope, 'env> {
    scope: &'scope Scope<'scope, 'env>,
    entry: usize,
}

struct Drain<'a, 'scope, 'env>(&'a Scope<'scope, 'env>);

impl Drop for Drain<'_, '_, '_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Unwinding: flush the queue pairs so that requests that would never complete (a
            // receive whose message will not come) finish now, with a flush error.
            for e in self.0.posted.borrow().iter() {
                e.qp.flush();
            }
        }
        let n = self.0.posted.borrow().len();
        for i in 0..n {
            if self.0.complete(i).is_err() {
                // The NIC may still use borrowed memory and nothing can tell when it stops.
                eprintln!("rdma-dmabuf: cannot poll a completion queue with requests of a scope in flight; aborting");
                std::process::abort();
            }
        }
    }
}

impl<'scope, 'env> Scope<'scope, 'env> {
    /// Sends `region[offset..offset + len]`.
    ///
    /// # Errors
    /// As [`QueuePair::post_send`].
    pub fn send<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        region: &'scope MemoryRegion<B>,
        offset: u64,
        len: u64,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post(qp, WorkKind::Send, region, offset, len, None, imm)
    }

    /// Receives into `region[offset..offset + len]` (exclusively borrowed: the NIC writes it).
    ///
    /// # Errors
    /// As [`QueuePair::post_recv`].
    pub fn recv<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        region: &'scope mut MemoryRegion<B>,
        offset: u64,
        len: u64,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post(qp, WorkKind::Recv, region, offset, len, None, None)
    }

    /// RDMA-writes `region[offset..offset + len]` to the start of `remote`.
    ///
    /// # Errors
    /// As [`QueuePair::post_write`].
    pub fn write<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        region: &'scope MemoryRegion<B>,
        offset: u64,
        len: u64,
        remote: RemoteRegion,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post(qp, WorkKind::Write, region, offset, len, Some(remote), imm)
    }

    /// RDMA-reads the start of `remote` into `region[offset..offset + len]` (exclusively
    /// borrowed).
    ///
    /// # Errors
    /// As [`QueuePair::post_read`].
    pub fn read<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        region: &'scope mut MemoryRegion<B>,
        offset: u64,
        len: u64,
        remote: RemoteRegion,
    ) -> Result<ScopedPending<'scope, 'env>> {
        self.post(qp, WorkKind::Read, region, offset, len, Some(remote), None)
    }

    #[allow(clippy::too_many_arguments)]
    fn post<B: Backing>(
        &'scope self,
        qp: &'scope QueuePair,
        kind: WorkKind,
        region: &MemoryRegion<B>,
        offset: u64,
        len: u64,
        remote: Option<RemoteRegion>,
        imm: Option<u32>,
    ) -> Result<ScopedPending<'scope, 'env>> {
        // The region is borrowed for 'scope and the scope drains before returning, so it
        // outlives the request.
        let (index, gen) = qp.post_borrowed(kind, region, offset, len, remote, imm)?;
        let mut posted = self.posted.borrow_mut();
        posted.push(Entry {
            qp,
            index,
            gen,
            kind,
            taken: Cell::new(None),
            done: Cell::new(false),
        });
        Ok(ScopedPending {
            scope: self,
            entry: posted.len() - 1,
        })
    }

    /// Polls until entry `i` has completed; records its completion.
    fn complete(&self, i: usize) -> Result<()> {
        let (qp, index, gen) = {
            let posted = self.posted.borrow();
            let e = &posted[i];
            if e.done.get() {
                return Ok(());
            }
            (e.qp, e.index, e.gen)
        };
        loop {
            if let Some(c) = qp.take_completion(index, gen) {
                let posted = self.posted.borrow();
                posted[i].taken.set(Some(c));
                posted[i].done.set(true);
                return Ok(());
            }
            qp.poll()?;
            std::hint::spin_loop();
        }
    }
}

impl<'scope, 'env> ScopedPending<'scope, 'env> {
    /// Waits for the request's completion.
    ///
    /// # Errors
    /// [`Error::Completion`](crate::Error::Completion) when it completed with an error status;
    /// [`Error::Verbs`](crate::Error::Verbs) when the
    /// queue cannot be polled.
    pub fn wait(self) -> Result<WorkCompletion> {
        self.scope.complete(self.entry)?;
        let posted = self.scope.posted.borrow();
        let e = &posted[self.entry];
        let c = e.taken.take().expect("recorded by complete");
        e.qp.completion_result(e.index, e.gen, e.kind, c)
    }
}
