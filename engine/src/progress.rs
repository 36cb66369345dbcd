//! [`Transfer`]: the handle of a batch, with each entry's status, filled in by the worker.

use crate::error::{Error, Result};
use crate::metadata::lock;
use std::sync::{Arc, Condvar, Mutex};
use std::task::Waker;
use std::time::{Duration, Instant, SystemTime};

/// When a batch was submitted, planned and finished ([`Transfer::timing`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// The wall-clock time [`Agent::transfer`](crate::Agent::transfer) was called.
    pub started: SystemTime,
    /// How long `transfer` took to check and plan the batch and hand it to the worker.
    pub submitted: Duration,
    /// How long from the call until the worker was done with the batch (every completion in,
    /// the notification delivered or failed); `None` while it is not.
    pub finished: Option<Duration>,
}

/// Where an entry of a batch stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryStatus {
    /// Some of its bytes have not landed yet.
    Pending,
    /// Every byte landed (each chunk's completion reported success).
    Done,
    /// It failed; some of its bytes may have landed, others not.
    Failed(Error),
}

struct State {
    status: Vec<EntryStatus>,
    /// Chunks of each entry not yet completed.
    left: Vec<u32>,
    /// The worker is done with the batch (and its notification, if any).
    finished: bool,
    /// Why the notification was not delivered.
    notification: Option<Error>,
    /// Tasks awaiting the batch, woken by [`Progress::finish`].
    wakers: Vec<Waker>,
    /// Since `started`: when the batch was handed to the worker, when it finished.
    submitted: Duration,
    finished_after: Option<Duration>,
}

impl State {
    /// The batch's result once finished: the first failed entry, else the notification's
    /// error.
    fn outcome(&self) -> Result<()> {
        for (entry, st) in self.status.iter().enumerate() {
            if let EntryStatus::Failed(e) = st {
                return Err(Error::EntryFailed {
                    entry,
                    error: Box::new(e.clone()),
                });
            }
        }
        self.notification.clone().map_or(Ok(()), Err)
    }
}

/// What the worker and the handles share.
pub(crate) struct Progress {
    state: Mutex<State>,
    finished: Condvar,
    started: Instant,
    started_wall: SystemTime,
}

impl Progress {
    /// A batch's progress; `started` is when its [`Agent::transfer`](crate::Agent::transfer)
    /// was called.
    pub fn new(chunks_per_entry: &[u32], started: Instant) -> Arc<Progress> {
        Arc::new(Progress {
            started,
            started_wall: SystemTime::now()
                .checked_sub(started.elapsed())
                .unwrap_or_else(SystemTime::now),
            state: Mutex::new(State {
                status: vec![EntryStatus::Pending; chunks_per_entry.len()],
                left: chunks_per_entry.to_vec(),
                finished: false,
                notification: None,
                wakers: Vec::new(),
                submitted: Duration::ZERO,
                finished_after: None,
            }),
            finished: Condvar::new(),
        })
    }

    /// One chunk of `entry` landed. Allocates nothing.
    pub fn chunk_done(&self, entry: u32) {
        let mut s = lock(&self.state);
        let e = entry as usize;
        s.left[e] = s.left[e].saturating_sub(1);
        if s.left[e] == 0 && s.status[e] == EntryStatus::Pending {
            s.status[e] = EntryStatus::Done;
        }
    }

    /// `entry` failed (its first error is kept).
    pub fn fail(&self, entry: u32, error: &Error) {
        let mut s = lock(&self.state);
        let st = &mut s.status[entry as usize];
        if *st == EntryStatus::Pending {
            *st = EntryStatus::Failed(error.clone());
        }
    }

    /// Replaces the error of each failed entry that `pick` chooses (by entry index and
    /// error) with what it returns: a cause found after the failure (a remote segment that
    /// is gone rather than a refused key). Before [`Progress::finish`] only.
    pub fn correct(&self, mut pick: impl FnMut(u32, &Error) -> Option<Error>) {
        let mut s = lock(&self.state);
        for (entry, st) in s.status.iter_mut().enumerate() {
            if let EntryStatus::Failed(e) = st {
                if let Some(better) = pick(u32::try_from(entry).unwrap_or(u32::MAX), e) {
                    *e = better;
                }
            }
        }
    }

    /// How many entries are done, and how many are not (failed, or pending: those fail
    /// at [`Progress::finish`]).
    pub fn counts(&self) -> (u64, u64) {
        let s = lock(&self.state);
        let done = s.status.iter().filter(|e| **e == EntryStatus::Done).count();
        (done as u64, (s.status.len() - done) as u64)
    }

    /// Time since [`Agent::transfer`](crate::Agent::transfer) was called.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Whether every entry is done.
    pub fn all_done(&self) -> bool {
        lock(&self.state)
            .status
            .iter()
            .all(|s| *s == EntryStatus::Done)
    }

    /// The worker is done with the batch; entries still pending (never posted) fail.
    pub fn finish(&self, notification: Option<Error>) {
        let mut s = lock(&self.state);
        for st in &mut s.status {
            if *st == EntryStatus::Pending {
                *st = EntryStatus::Failed(Error::ShuttingDown);
            }
        }
        s.notification = notification;
        s.finished = true;
        s.finished_after = Some(self.started.elapsed());
        let wakers = std::mem::take(&mut s.wakers);
        drop(s);
        self.finished.notify_all();
        for w in wakers {
            w.wake();
        }
    }

    /// The batch is planned and about to go to the worker.
    pub fn submitted(&self) {
        lock(&self.state).submitted = self.started.elapsed();
    }

    /// The batch's result if it has finished; otherwise `waker` is kept (once per task) to
    /// be woken when it does.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn poll_finished(&self, waker: &Waker) -> Option<Result<()>> {
        let mut s = lock(&self.state);
        if s.finished {
            return Some(s.outcome());
        }
        if !s.wakers.iter().any(|w| w.will_wake(waker)) {
            s.wakers.push(waker.clone());
        }
        None
    }
}

/// A batch in flight ([`Agent::transfer`](crate::Agent::transfer)).
#[derive(Clone)]
pub struct Transfer {
    pub(crate) progress: Arc<Progress>,
}

impl std::fmt::Debug for Transfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transfer")
            .field("finished", &self.is_finished())
            .finish()
    }
}

impl Transfer {
    /// Each entry's status, in batch order.
    pub fn status(&self) -> Vec<EntryStatus> {
        lock(&self.progress.state).status.clone()
    }

    /// Whether the engine is done with the batch: every entry done or failed, and the
    /// notification, if any, delivered or failed.
    pub fn is_finished(&self) -> bool {
        lock(&self.progress.state).finished
    }

    /// When the batch was submitted and planned, and when it finished (the engine's own
    /// clock: NIXL's transfer telemetry).
    pub fn timing(&self) -> Timing {
        let s = lock(&self.progress.state);
        Timing {
            started: self.progress.started_wall,
            submitted: s.submitted,
            finished: s.finished_after,
        }
    }

    /// Why the batch's notification was not delivered (`None`: delivered, not asked for,
    /// or not sent because an entry failed).
    pub fn notification_error(&self) -> Option<Error> {
        lock(&self.progress.state).notification.clone()
    }

    /// Waits at most `timeout` for the batch to finish.
    ///
    /// # Errors
    /// [`Error::Timeout`] if it has not finished; [`Error::EntryFailed`] with the first
    /// failed entry; the notification's error if it was not delivered.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now().checked_add(timeout);
        let mut s = lock(&self.progress.state);
        while !s.finished {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            if left.is_zero() {
                return Err(Error::Timeout(timeout));
            }
            s = self
                .progress
                .finished
                .wait_timeout(s, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        s.outcome()
    }
}
