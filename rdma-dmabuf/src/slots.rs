//! The in-flight table of a queue pair: one slot per outstanding work request, allocated once
//! at creation so that posting and polling never allocate.

use crate::error::{Error, Op, Result};
use crate::wr::WorkKind;

pub(crate) use crate::sys::wc::RawCompletion;

/// Where a slot's request is. `Copy`, so that moving a slot from one state to the next runs
/// no drop glue on the hot path; what an abandoned or stranded request lent is in
/// [`Slot::held`].
#[derive(Clone, Copy)]
pub(crate) enum State {
    Free,
    Posted,
    Done(RawCompletion),
    /// The waiter was dropped before the completion: its buffer waits in `held` for it.
    Abandoned,
    /// Lent to requests no completion will end (a batch the provider took only part of,
    /// its queue pair flushed): `held` keeps it until the table drops, after the queue pair
    /// is destroyed. Not outstanding: nothing waits for it.
    Stranded,
}

pub(crate) struct Slot {
    pub gen: u32,
    pub kind: WorkKind,
    pub state: State,
    /// Send-queue entries the request holds: 1, or a batch's `k` (its unsignalled requests
    /// occupy the queue until the signalled last one completes).
    pub weight: u32,
    /// The first error completion of a batch's unsignalled request, reported in place of
    /// the last request's (then flushed) completion.
    pub early: Option<RawCompletion>,
    /// What an [`State::Abandoned`] or [`State::Stranded`] request lent; `None` otherwise.
    pub held: Option<Box<dyn Send>>,
    /// While the slot is free: the next free slot ([`NO_SLOT`] for none).
    next_free: u32,
    /// The bytes the request posted (a batch's: its last request's), its completion's
    /// length if it succeeds ([`RawCompletion::with_posted_len`]); unused for a receive,
    /// whose completion says how much arrived.
    len: u32,
}

impl Slot {
    /// What the request's completion `c` says, with the length it posted if it is not a
    /// receive (the poll reads a length only of a received message: see
    /// [`RawCompletion::with_posted_len`]).
    #[inline(always)]
    fn completed(&self, c: RawCompletion) -> RawCompletion {
        if self.kind == WorkKind::Recv {
            c
        } else {
            c.with_posted_len(self.len)
        }
    }
}

/// The end of the free list.
const NO_SLOT: u32 = u32::MAX;

pub(crate) struct Slots {
    slots: Vec<Slot>,
    /// The first free slot ([`NO_SLOT`] for none), the others linked through
    /// [`Slot::next_free`]: the last slot freed is the first taken.
    free: u32,
    sends: u32,
    recvs: u32,
    send_depth: u32,
    recv_depth: u32,
}

/// `wr_id` = generation << 32 | slot index.
pub(crate) fn wr_id(index: u32, gen: u32) -> u64 {
    (u64::from(gen) << 32) | u64::from(index)
}

/// Set in the `wr_id` of a batch's unsignalled requests (all but its last): their
/// completions, which come only when they fail or are flushed, never end the batch.
pub(crate) const MEMBER: u64 = 1 << 31;

/// The slot index of a `wr_id` (a batch member's too).
pub(crate) fn slot_index(wr_id: u64) -> u32 {
    (wr_id & 0x7fff_ffff) as u32
}

impl Slots {
    /// A table for `send_depth + recv_depth` requests (the builder checked both against the
    /// device's limits, so the sum fits a `u32`).
    pub fn new(send_depth: u32, recv_depth: u32) -> Slots {
        // Below 2^31, so that an index never reaches the `MEMBER` bit.
        let n = send_depth.saturating_add(recv_depth).min(0x7fff_ffff);
        Slots {
            slots: (0..n)
                .map(|i| Slot {
                    gen: 0,
                    kind: WorkKind::Send,
                    state: State::Free,
                    weight: 1,
                    early: None,
                    held: None,
                    // Slot 0 first, then 1, and so on.
                    next_free: if i + 1 < n { i + 1 } else { NO_SLOT },
                    len: 0,
                })
                .collect(),
            free: if n > 0 { 0 } else { NO_SLOT },
            sends: 0,
            recvs: 0,
            send_depth,
            recv_depth,
        }
    }

    /// Takes a slot for a request of `kind` that posts `len` bytes, or says the queue is
    /// full.
    #[inline]
    pub fn acquire(&mut self, kind: WorkKind, len: u32) -> Result<(u32, u32)> {
        self.acquire_n(kind, 1, len)
    }

    /// Takes one slot for `weight` requests of `kind` that end with one completion (a
    /// batch: each holds an entry of the queue until the last completes, whose `len` bytes
    /// its completion reports), or says the queue has not that many entries free.
    #[inline]
    pub fn acquire_n(&mut self, kind: WorkKind, weight: u32, len: u32) -> Result<(u32, u32)> {
        let (count, depth, op) = match kind {
            WorkKind::Recv => (&mut self.recvs, self.recv_depth, Op::PostRecv),
            _ => (&mut self.sends, self.send_depth, Op::PostSend),
        };
        if depth - *count < weight {
            return Err(Error::QueueFull { op, depth });
        }
        let index = self.free;
        let slot = self
            .slots
            .get_mut(index as usize)
            .expect("a free slot exists while the queue is not full");
        self.free = slot.next_free;
        *count += weight;
        debug_assert!(slot.held.is_none(), "a free slot holds no buffer");
        slot.gen = slot.gen.wrapping_add(1);
        slot.kind = kind;
        slot.state = State::Posted;
        // `early` is None here: only a batch's members set it, and its last completion takes
        // it (a stranded batch's slot is never reused).
        slot.weight = weight;
        slot.len = len;
        Ok((index, slot.gen))
    }

    /// Gives back a slot whose request was never accepted by the provider.
    ///
    /// # Safety
    /// The provider refused the request of slot `index` (its post returned an error), or it
    /// was never posted, so the NIC has nothing of it: on a request it accepted, this would
    /// free the slot while the NIC may still use what the request lent.
    #[allow(unsafe_code)] // a promise the caller makes: the provider refused the request
    pub unsafe fn cancel(&mut self, index: u32) {
        let kind = self.slots[index as usize].kind;
        self.retire(index, kind);
    }

    #[inline]
    fn retire(&mut self, index: u32, kind: WorkKind) {
        let slot = &mut self.slots[index as usize];
        slot.state = State::Free;
        let weight = slot.weight;
        slot.next_free = self.free;
        self.free = index;
        match kind {
            WorkKind::Recv => self.recvs -= weight,
            _ => self.sends -= weight,
        }
    }

    /// Records a completion; returns an abandoned buffer to drop (outside the borrow).
    ///
    /// A batch member's completion (an unsignalled request that failed or was flushed)
    /// only records the batch's first error: the batch ends with its last request's
    /// completion, which the send queue delivers after every earlier one's.
    #[inline]
    pub fn complete(&mut self, wr_id: u64, c: RawCompletion) -> Option<Box<dyn Send>> {
        let (index, gen) = (slot_index(wr_id), (wr_id >> 32) as u32);
        let slot = self.slots.get_mut(index as usize)?;
        if slot.gen != gen {
            return None;
        }
        if wr_id & MEMBER != 0 {
            // (A member's success would come only from a queue pair that signals every
            // request; ours do not. It says nothing the last completion will not.)
            let pending = matches!(slot.state, State::Posted | State::Abandoned);
            if !c.is_success() && pending && slot.early.is_none() {
                slot.early = Some(c);
            }
            return None;
        }
        // A batch's first error, if one of its members failed (never set for one request).
        let c = match slot.early {
            Some(_) => slot.early.take().unwrap_or(c),
            None => c,
        };
        match slot.state {
            State::Abandoned => {
                let (kind, buf) = (slot.kind, slot.held.take());
                self.retire(index, kind);
                buf
            }
            State::Posted => {
                slot.state = State::Done(slot.completed(c));
                None
            }
            // A second completion for one request cannot happen; keep what was there.
            State::Free | State::Done(_) | State::Stranded => None,
        }
    }

    /// Ends the request `wr_id` with its completion `c` at once, for the poller that holds
    /// its handle: [`Slots::complete`] then [`Slots::take`] in one step, without recording
    /// the completion. `None` (nothing changed) unless the request is posted and waiting,
    /// and `wr_id` is not a batch member's; the caller then records `c` as usual.
    #[inline]
    pub fn finish(&mut self, wr_id: u64, c: RawCompletion) -> Option<RawCompletion> {
        if wr_id & MEMBER != 0 {
            return None;
        }
        self.finish_own(slot_index(wr_id), (wr_id >> 32) as u32, c)
    }

    /// [`Slots::finish`] of the request in slot `index`, generation `gen` (its last, or
    /// only, request's completion: never a batch member's).
    #[inline]
    pub fn finish_own(&mut self, index: u32, gen: u32, c: RawCompletion) -> Option<RawCompletion> {
        let slot = self.slots.get_mut(index as usize)?;
        if slot.gen != gen || !matches!(slot.state, State::Posted) {
            return None;
        }
        // A batch's first error, if one of its members failed (never set for one request).
        let c = slot.early.take().unwrap_or(c);
        let kind = slot.kind;
        let c = slot.completed(c);
        self.retire(index, kind);
        Some(c)
    }

    /// Takes the completion of a finished request and frees its slot.
    #[inline]
    pub fn take(&mut self, index: u32, gen: u32) -> Option<RawCompletion> {
        let slot = &mut self.slots[index as usize];
        if slot.gen != gen {
            return None;
        }
        if let State::Done(c) = slot.state {
            let kind = slot.kind;
            self.retire(index, kind);
            return Some(c);
        }
        None
    }

    /// Leaves `buf` in the slot until its completion arrives. Returns it back if the
    /// completion has already arrived (then the slot is freed and the caller drops it).
    pub fn abandon(&mut self, index: u32, gen: u32, buf: Box<dyn Send>) -> Option<Box<dyn Send>> {
        let slot = &mut self.slots[index as usize];
        if slot.gen != gen {
            return Some(buf);
        }
        match slot.state {
            State::Done(_) => {
                let kind = slot.kind;
                self.retire(index, kind);
                Some(buf)
            }
            // Its request has ended and the slot was freed: nothing waits to release `buf`,
            // so it goes back to be dropped now (as for another generation).
            State::Free => Some(buf),
            State::Posted => {
                slot.state = State::Abandoned;
                slot.held = Some(buf);
                None
            }
            // Cannot happen: a handle abandons its slot once, and a stranded slot has no
            // handle. Were it to, storing `buf` would drop what the slot holds while the NIC
            // may use it: memory the NIC may use is never dropped, so both are kept, `buf`
            // leaked.
            State::Abandoned | State::Stranded => {
                std::mem::forget(buf);
                None
            }
        }
    }

    /// Keeps `buf` in slot `index` until the table drops (see [`State::Stranded`]).
    pub fn strand(&mut self, index: u32, gen: u32, buf: Box<dyn Send>) {
        let slot = &mut self.slots[index as usize];
        if slot.gen == gen {
            slot.state = State::Stranded;
            slot.held = Some(buf);
        } else {
            // Cannot happen (the slot was just acquired); keeping it is the safe side.
            std::mem::forget(buf);
        }
    }

    /// How many slots the table has (its queue's depths together).
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Requests posted and not yet completed (waiting or abandoned).
    pub fn outstanding(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| matches!(s.state, State::Posted | State::Abandoned))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok() -> RawCompletion {
        RawCompletion::for_test(0, 1)
    }

    #[test]
    fn depth_is_enforced_per_queue() {
        let mut s = Slots::new(2, 1);
        s.acquire(WorkKind::Send, 1).unwrap();
        s.acquire(WorkKind::Write, 1).unwrap();
        assert!(matches!(
            s.acquire(WorkKind::Read, 1),
            Err(Error::QueueFull { depth: 2, .. })
        ));
        s.acquire(WorkKind::Recv, 1).unwrap();
        assert!(matches!(
            s.acquire(WorkKind::Recv, 1),
            Err(Error::QueueFull { depth: 1, .. })
        ));
    }

    #[test]
    fn completion_then_take_frees_the_slot() {
        let mut s = Slots::new(1, 0);
        let (i, g) = s.acquire(WorkKind::Send, 1).unwrap();
        assert!(s.take(i, g).is_none());
        assert!(s.complete(wr_id(i, g), ok()).is_none());
        assert_eq!(s.take(i, g).unwrap().byte_len(), 1);
        assert_eq!(s.outstanding(), 0);
        s.acquire(WorkKind::Send, 1).unwrap();
    }

    /// What a second abandon brings: it must never be dropped (the slot keeps the first
    /// buffer, and the second is leaked rather than freed while the NIC may use it). Zero
    /// sized, so that leaking it leaks no allocation (Miri reports a leak as an error).
    struct NeverDropped;

    impl Drop for NeverDropped {
        fn drop(&mut self) {
            panic!("what a second abandon brought was dropped");
        }
    }

    #[test]
    fn a_second_abandon_never_drops_what_the_slot_holds() {
        let first = std::sync::Arc::new(());
        let mut s = Slots::new(1, 0);
        let (i, g) = s.acquire(WorkKind::Send, 1).unwrap();
        assert!(s.abandon(i, g, Box::new(first.clone())).is_none());
        assert!(s.abandon(i, g, Box::new(NeverDropped)).is_none());
        assert_eq!(
            std::sync::Arc::strong_count(&first),
            2,
            "what the NIC may use is still held"
        );
        let released = s
            .complete(wr_id(i, g), ok())
            .expect("released by completion");
        drop(released);
        assert_eq!(
            std::sync::Arc::strong_count(&first),
            1,
            "released once done"
        );
    }

    #[test]
    fn abandoned_buffers_are_released_by_their_completion() {
        let dropped = std::sync::Arc::new(());
        let mut s = Slots::new(1, 0);
        let (i, g) = s.acquire(WorkKind::Send, 1).unwrap();
        assert!(s.abandon(i, g, Box::new(dropped.clone())).is_none());
        assert_eq!(
            std::sync::Arc::strong_count(&dropped),
            2,
            "kept while in flight"
        );
        let buf = s
            .complete(wr_id(i, g), ok())
            .expect("handed back for dropping");
        drop(buf);
        assert_eq!(
            std::sync::Arc::strong_count(&dropped),
            1,
            "released exactly once"
        );
        assert_eq!(s.outstanding(), 0);
    }

    #[test]
    fn a_batch_holds_its_weight_and_ends_only_with_its_last_completion() {
        let mut s = Slots::new(4, 0);
        assert!(matches!(
            s.acquire_n(WorkKind::Write, 5, 1),
            Err(Error::QueueFull { depth: 4, .. })
        ));
        let (i, g) = s.acquire_n(WorkKind::Write, 3, 1).unwrap();
        s.acquire(WorkKind::Write, 1).unwrap();
        assert!(s.acquire(WorkKind::Write, 1).is_err(), "3 + 1 of 4 held");
        let failed = RawCompletion::for_test(10, 0);
        // A member's error completion, then a member's flush: the batch goes on.
        assert!(s.complete(wr_id(i, g) | MEMBER, failed).is_none());
        let flushed = RawCompletion::for_test(5, 0);
        assert!(s.complete(wr_id(i, g) | MEMBER, flushed).is_none());
        assert!(s.take(i, g).is_none(), "not ended by a member");
        s.complete(wr_id(i, g), flushed);
        assert_eq!(
            s.take(i, g).unwrap().status(),
            10,
            "the first error is kept"
        );
        s.acquire_n(WorkKind::Write, 3, 1).unwrap();
    }

    #[test]
    fn finish_ends_only_a_waiting_request_and_keeps_a_batchs_first_error() {
        let mut s = Slots::new(4, 0);
        let (i, g) = s.acquire(WorkKind::Write, 1).unwrap();
        assert!(
            s.finish(wr_id(i, g + 1), ok()).is_none(),
            "stale generation"
        );
        assert!(s.finish(wr_id(i, g) | MEMBER, ok()).is_none(), "a member");
        assert_eq!(s.finish(wr_id(i, g), ok()).unwrap().byte_len(), 1);
        assert_eq!(s.outstanding(), 0, "the slot is free");
        assert!(s.finish(wr_id(i, g), ok()).is_none(), "not twice");
        let (i, g) = s.acquire_n(WorkKind::Write, 2, 1).unwrap();
        let failed = RawCompletion::for_test(10, 0);
        assert!(s.complete(wr_id(i, g) | MEMBER, failed).is_none());
        let flushed = RawCompletion::for_test(5, 0);
        assert_eq!(s.finish(wr_id(i, g), flushed).unwrap().status(), 10);
        let (i, g) = s.acquire(WorkKind::Write, 1).unwrap();
        assert!(s.abandon(i, g, Box::new(())).is_none());
        assert!(
            s.finish(wr_id(i, g), ok()).is_none(),
            "abandoned: complete() frees it"
        );
        assert!(s.complete(wr_id(i, g), ok()).is_some());
    }

    #[test]
    fn a_free_slot_does_not_take_an_abandoned_buffer() {
        let dropped = std::sync::Arc::new(());
        let mut s = Slots::new(1, 0);
        let (i, g) = s.acquire(WorkKind::Send, 1).unwrap();
        assert_eq!(s.finish(wr_id(i, g), ok()).unwrap().byte_len(), 1);
        let back = s.abandon(i, g, Box::new(dropped.clone()));
        assert!(back.is_some(), "handed back, not kept in a free slot");
        drop(back);
        assert_eq!(std::sync::Arc::strong_count(&dropped), 1);
        assert_eq!(s.outstanding(), 0);
    }

    #[test]
    fn a_posted_request_reports_the_length_it_posted_and_a_receive_what_arrived() {
        let mut s = Slots::new(2, 1);
        // The poll reads no length of a send's or write's completion (0 here).
        let sent = RawCompletion::for_test(0, 0);
        let (i, g) = s.acquire(WorkKind::Write, 4096).unwrap();
        assert_eq!(s.finish(wr_id(i, g), sent).unwrap().byte_len(), 4096);
        let (i, g) = s.acquire(WorkKind::Send, 12).unwrap();
        assert!(s.complete(wr_id(i, g), sent).is_none());
        assert_eq!(s.take(i, g).unwrap().byte_len(), 12, "recorded, then taken");
        let (i, g) = s.acquire(WorkKind::Recv, 4096).unwrap();
        let arrived = RawCompletion::for_test(0, 300);
        assert_eq!(s.finish(wr_id(i, g), arrived).unwrap().byte_len(), 300);
        let (i, g) = s.acquire(WorkKind::Write, 64).unwrap();
        let failed = RawCompletion::for_test(10, 0x77);
        let c = s.finish(wr_id(i, g), failed).unwrap();
        assert_eq!(
            (c.byte_len(), c.vendor_err()),
            (0, 0x77),
            "an error keeps its code"
        );
    }

    #[test]
    fn stale_generations_are_ignored() {
        let mut s = Slots::new(1, 0);
        let (i, g) = s.acquire(WorkKind::Send, 1).unwrap();
        assert!(s.complete(wr_id(i, g + 1), ok()).is_none());
        assert!(s.take(i, g).is_none());
    }
}
