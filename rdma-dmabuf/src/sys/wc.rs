//! Work completions as a poll takes them: the area of its completion queue the provider
//! writes into (zeroed when the queue is made), and what is read of each entry, which is only
//! what the verbs define for that completion: a provider may leave the rest unwritten
//! (docs/safety.md, "What the provider writes").

use rdma_sys as ffi;
use std::cell::{Cell, UnsafeCell};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::num::NonZeroU32;

/// A completion as the poller recorded it, in four 32-bit words, so that each move of it on
/// the completion path is one 16-byte load and store: the length (a success's) and the
/// vendor's code (an error's) share a word, and the status shares one with the immediate
/// data's flag (and a bit always set, so that an `Option` of it needs no word of its own).
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawCompletion {
    /// `PRESENT | WITH_IMM (if any) | status` (`ibv_wc_status`, whose values are small; one
    /// past 16 bits reads as `0xffff`, an error).
    tag: NonZeroU32,
    /// For a success, the bytes of a received message (the provider's `byte_len`), or, for
    /// a request this side posted, 0 until its slot puts in the length posted
    /// ([`RawCompletion::with_posted_len`]); for an error, `vendor_err`.
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

/// A pointer to the field of the work completion at `wc` that lies `offset` bytes in,
/// typed as `_field` (a function naming that field, never called) says it is.
#[inline(always)]
fn field_ptr<T>(wc: *const ffi::ibv_wc, offset: usize, _field: fn(&ffi::ibv_wc) -> &T) -> *const T {
    wc.wrapping_byte_add(offset).cast()
}

/// `field!(wc, name)`: a pointer to field `name` of the work completion at `wc`, of its
/// type, made without a reference to the entry (the area is only ever reached through raw
/// pointers, the provider's writes included).
macro_rules! field {
    ($wc:expr, $name:ident) => {
        field_ptr($wc, std::mem::offset_of!(ffi::ibv_wc, $name), |w| &w.$name)
    };
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

    /// The bytes transferred: a received message's, or the length a request this side
    /// posted ([`RawCompletion::with_posted_len`]); 0 for an error, where the verbs leave it
    /// undefined.
    #[inline(always)]
    pub(crate) fn byte_len(&self) -> u32 {
        if self.is_success() {
            self.len_or_vendor
        } else {
            0
        }
    }

    /// The immediate data of a received message that carried one.
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

    /// This completion of a request this side posted (a send, write, read or atomic, never
    /// a receive), with `len`, the bytes it posted, as its length if it succeeded. The verbs
    /// define no length for a send's or a write's completion and mlx5 writes none, so the
    /// poll never reads one; the length posted is what the request moved when it succeeded.
    #[inline(always)]
    pub(crate) fn with_posted_len(mut self, len: u32) -> RawCompletion {
        if self.is_success() {
            self.len_or_vendor = len;
        }
        self
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

    /// What the work completion at `wc` says, reading only the fields the verbs define for
    /// it: `wr_id`, `status` and `qp_num` always; for an error, `vendor_err`; for a success,
    /// `opcode`, and only for a received message (`IBV_WC_RECV` set in it) `byte_len`,
    /// `wc_flags` and, with `IBV_WC_WITH_IMM`, the immediate data. (mlx5, for one, writes no
    /// `byte_len` for a send or a write, and flags a sender's own completion of a send or
    /// write with immediate without writing the data: what those fields hold is an earlier
    /// completion's.) Returns its `wr_id` too. Reads only: reading an entry again gives the
    /// same.
    ///
    /// # Safety
    /// `wc` points to an entry of a [`PollArea`] that the caller's poll holds (every field
    /// of it initialised; nothing writes it meanwhile), which the provider wrote in that
    /// poll.
    #[inline(always)]
    unsafe fn read(wc: *const ffi::ibv_wc) -> (u64, RawCompletion) {
        // SAFETY: this function's contract (see `read_success`).
        let wr_id = unsafe { field!(wc, wr_id).read() };
        // SAFETY: as above.
        let status = unsafe { field!(wc, status).read() };
        let c = if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            // SAFETY: this function's contract; an error.
            unsafe { RawCompletion::read_error(wc, status) }
        } else {
            // SAFETY: this function's contract; a success.
            unsafe { RawCompletion::read_success(wc) }
        };
        (wr_id, c)
    }

    /// [`RawCompletion::read`] of a success: `qp_num`, `opcode`, and what a received message
    /// defines.
    ///
    /// # Safety
    /// As for [`RawCompletion::read`], of a completion whose status is `IBV_WC_SUCCESS`.
    #[inline(always)]
    unsafe fn read_success(wc: *const ffi::ibv_wc) -> RawCompletion {
        // Each read below is of an initialised field (the area was zeroed when made, and its
        // zeroes are kept by moves: see `PollArea`; the provider writes only values) through
        // a pointer into the entry at `wc` (aligned: see `PollArea`) typed as that field;
        // the contract keeps writers away meanwhile.
        // SAFETY: as above.
        let qp_num = unsafe { field!(wc, qp_num).read() };
        // SAFETY: as above.
        let opcode = unsafe { field!(wc, opcode).read() };
        let (bits, len, imm) = if opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0 {
            // SAFETY: as above.
            let len = unsafe { field!(wc, byte_len).read() };
            // SAFETY: as above.
            let flags = unsafe { field!(wc, wc_flags).read() };
            if flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                let union = field!(wc, imm_data_invalidated_rkey_union);
                // SAFETY: as above; with IBV_WC_WITH_IMM set on a received message, the
                // union holds its immediate data (a 32-bit word at the union's start).
                let imm = unsafe { union.cast::<u32>().read() };
                (WITH_IMM, len, u32::from_be(imm))
            } else {
                (0, len, 0)
            }
        } else {
            // A request this side posted: its slot puts in the length posted.
            (0, 0, 0)
        };
        RawCompletion {
            tag: tag(bits),
            len_or_vendor: len,
            imm,
            qp_num,
        }
    }

    /// [`RawCompletion::read`] of an error of `status`: `qp_num` and `vendor_err`.
    ///
    /// # Safety
    /// As for [`RawCompletion::read`], of a completion whose status is `status`.
    #[cold]
    unsafe fn read_error(wc: *const ffi::ibv_wc, status: u32) -> RawCompletion {
        // SAFETY: as in `read_success`.
        let qp_num = unsafe { field!(wc, qp_num).read() };
        // SAFETY: as above.
        let vendor = unsafe { field!(wc, vendor_err).read() };
        RawCompletion {
            tag: tag(status.min(STATUS)),
            len_or_vendor: vendor,
            imm: 0,
            qp_num,
        }
    }
}

/// `ibv_poll_cq` failed with this errno; see
/// [`CompletionQueue::poll_error`](super::cq::CompletionQueue::poll_error).
#[derive(Clone, Copy, Debug)]
pub(crate) struct PollFailed(i32);

impl PollFailed {
    /// The errno.
    pub(crate) fn errno(self) -> i32 {
        self.0
    }
}

/// Completions taken from the CQ per `ibv_poll_cq` call.
const BATCH: usize = 16;

/// Where a completion queue's polls write: one per queue, zeroed when the queue is made, so
/// that every field of it is initialised whatever a provider leaves unwritten (the verbs let
/// it leave undefined fields as they were, and some providers leave some of those they do
/// define: qedr never writes `vendor_err`, ocrdma's flushed completions no `qp_num`; see
/// docs/safety.md, "What the provider writes"). A field a provider did not write for this
/// completion reads as what an earlier one left there, or 0, never as uninitialised memory.
///
/// The entries are kept as words (`WC_WORDS` of 8 bytes, the size of an `ibv_wc`, which has
/// 2 bytes of padding): a move of the area (with its queue, into a queue pair the caller
/// moves) copies words, which have no padding, so it keeps every zero, where a copy of
/// `ibv_wc`s might not keep their padding's. They are cast to `ibv_wc` only as pointers.
///
/// A poll holds the area while its completions are read (`busy`); a poll of the same queue
/// meanwhile (a waker's, run while they are recorded) writes into an area of its own.
pub(crate) struct PollArea {
    wcs: UnsafeCell<[MaybeUninit<[u64; WC_WORDS]>; BATCH]>,
    busy: Cell<bool>,
}

/// The 8-byte words of an `ibv_wc`.
const WC_WORDS: usize = std::mem::size_of::<ffi::ibv_wc>() / 8;
const _: () = assert!(
    std::mem::size_of::<ffi::ibv_wc>() == WC_WORDS * 8 && std::mem::align_of::<ffi::ibv_wc>() <= 8,
    "an ibv_wc is a whole number of 8-byte words, aligned to at most 8"
);

/// Sets a [`PollArea`] free when dropped (also while unwinding from a waker's panic).
struct Hold<'a>(&'a Cell<bool>);

impl Drop for Hold<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl PollArea {
    /// An area of zeroes.
    pub(crate) fn new() -> PollArea {
        PollArea {
            wcs: UnsafeCell::new([const { MaybeUninit::zeroed() }; BATCH]),
            busy: Cell::new(false),
        }
    }

    /// Polls with `poll` (handed the room it may fill and where: for `ibv_poll_cq`, whose
    /// return it returns) and hands what it wrote, or its failure, to `read`.
    #[inline(always)]
    pub(crate) fn poll<R>(
        &self,
        poll: impl FnOnce(i32, *mut ffi::ibv_wc) -> i32,
        read: impl FnOnce(Result<&Polled<'_>, PollFailed>) -> R,
    ) -> R {
        if self.busy.replace(true) {
            return Self::nested(poll, read);
        }
        let _hold = Hold(&self.busy);
        let first = self.wcs.get().cast::<ffi::ibv_wc>();
        let n = poll(BATCH as i32, first);
        let polled = if n < 0 {
            Err(PollFailed(-n))
        } else {
            Ok(Polled {
                first,
                // At most BATCH (the provider writes no more than it is given room for).
                n: (n as usize).min(BATCH),
                _area: PhantomData,
            })
        };
        // One call of `read` (inlined once, not once per outcome).
        read(polled.as_ref().map_err(|&failed| failed))
    }

    /// [`PollArea::poll`] while this area is held by an outer poll of the same queue: into
    /// an area of its own (on the stack, zeroed), so that the outer poll's completions not
    /// yet read stay as they were.
    #[cold]
    #[inline(never)]
    fn nested<R>(
        poll: impl FnOnce(i32, *mut ffi::ibv_wc) -> i32,
        read: impl FnOnce(Result<&Polled<'_>, PollFailed>) -> R,
    ) -> R {
        PollArea::new().poll(poll, read)
    }
}

/// The completions one poll took, as the provider wrote them into a [`PollArea`], which the
/// poll holds meanwhile (nothing else writes them); read as [`RawCompletion`]s, each through
/// pointers to the fields the verbs define for it, never through a reference to an entry.
pub(crate) struct Polled<'a> {
    first: *mut ffi::ibv_wc,
    /// How many entries from `first` the poll wrote.
    n: usize,
    _area: PhantomData<&'a PollArea>,
}

impl Polled<'_> {
    /// How many completions the poll took.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Completion `i` of the poll's (`i < self.n`).
    #[inline(always)]
    fn at(&self, i: usize) -> (u64, RawCompletion) {
        debug_assert!(i < self.n);
        let wc = self.first.wrapping_add(i);
        // SAFETY: `i < n`: an entry of the held area (`PollArea::poll`), every field of it
        // initialised, which the poll that set `n` wrote.
        unsafe { RawCompletion::read(wc) }
    }

    /// Hands each completion (its `wr_id` and what it said) to `each`, in order.
    #[inline(always)]
    pub(crate) fn each(&self, mut each: impl FnMut(u64, RawCompletion)) {
        for i in 0..self.n {
            let (wr_id, c) = self.at(i);
            each(wr_id, c);
        }
    }

    /// The completion of `wr_id` if the poll took that one alone and it succeeded: the
    /// common case of a poll for one's own request, which then has nothing else to record.
    #[inline(always)]
    pub(crate) fn only_success(&self, wr_id: u64) -> Option<RawCompletion> {
        if self.n != 1 {
            return None;
        }
        let wc = self.first;
        // SAFETY: entry 0 of the held area, which the poll wrote (`n == 1`); initialised
        // bytes (see `RawCompletion::read`).
        let id = unsafe { field!(wc, wr_id).read() };
        // SAFETY: as above.
        let status = unsafe { field!(wc, status).read() };
        if id != wr_id || status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            return None;
        }
        // SAFETY: as above; a success.
        Some(unsafe { RawCompletion::read_success(wc) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `v` where `p` points: a field of the entry a test's provider writes.
    fn put<T>(p: *const T, v: T) {
        // SAFETY: every caller passes a `field!` pointer into the first entry of an area
        // its poll holds, which nothing else reads or writes meanwhile (`poll_one`).
        unsafe { p.cast_mut().write(v) }
    }

    /// One poll of `area` by a provider that writes one completion with `write`, read by
    /// `read`.
    fn poll_one<R>(
        area: &PollArea,
        write: impl FnOnce(*mut ffi::ibv_wc),
        read: impl FnOnce(&Polled<'_>) -> R,
    ) -> R {
        area.poll(
            |room, wcs| {
                assert_eq!(room, BATCH as i32);
                write(wcs);
                1
            },
            |polled| read(polled.expect("the poll succeeds")),
        )
    }

    /// An area whose first entry holds `0xa5` in every byte: what an earlier completion
    /// might have left in the fields the next one's provider does not write.
    fn stale_area() -> PollArea {
        let area = PollArea::new();
        poll_one(
            &area,
            // SAFETY: `wcs` is the first entry of the area this poll holds.
            |wcs| unsafe {
                wcs.cast::<u8>()
                    .write_bytes(0xa5, std::mem::size_of::<ffi::ibv_wc>())
            },
            |_| (),
        );
        area
    }

    /// How mlx5 writes a requester's successful completion: `wc_flags` and `qp_num`,
    /// the opcode, `IBV_WC_WITH_IMM` for a send or write with immediate, `wr_id` and the
    /// status; no `byte_len` (but for a read's or an atomic's) and no immediate data.
    fn mlx5_requester(opcode: u32, with_imm: bool) -> impl FnOnce(*mut ffi::ibv_wc) {
        move |wc| {
            let flags = if with_imm {
                ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0
            } else {
                0
            };
            put(field!(wc, wc_flags), flags);
            put(field!(wc, qp_num), 0x11);
            put(field!(wc, opcode), opcode);
            put(field!(wc, wr_id), 7);
            put(field!(wc, status), ffi::ibv_wc_status::IBV_WC_SUCCESS);
        }
    }

    /// How qedr writes a flushed completion: no `vendor_err` (it never writes one).
    fn qedr_flush(wc: *mut ffi::ibv_wc) {
        put(field!(wc, qp_num), 0x13);
        put(field!(wc, status), ffi::ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
        put(field!(wc, wr_id), 3);
        put(field!(wc, byte_len), 0);
    }

    #[test]
    fn a_new_area_is_zeroes() {
        let area = PollArea::new();
        let wcs = area
            .wcs
            .get()
            .cast::<[u8; std::mem::size_of::<[ffi::ibv_wc; BATCH]>()]>();
        // SAFETY: nothing holds the area, which was made of zeroes (initialised bytes).
        let bytes = unsafe { wcs.read() };
        assert!(bytes.iter().all(|&b| b == 0));
    }

    #[test]
    fn a_sent_write_with_immediate_reads_no_length_and_no_immediate() {
        let area = stale_area();
        let write = mlx5_requester(ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE, true);
        let c = poll_one(&area, write, |p| p.only_success(7)).expect("one success, request 7");
        assert_eq!(
            c.imm(),
            None,
            "the sender's own completion carries no immediate"
        );
        assert_eq!(
            c.byte_len(),
            0,
            "no length read: the slot puts in the posted one"
        );
        assert_eq!(c.qp_num(), 0x11);
        assert_eq!(c.with_posted_len(4096).byte_len(), 4096);
        let write = mlx5_requester(ffi::ibv_wc_opcode::IBV_WC_SEND, false);
        let seen = poll_one(&area, write, |p| {
            p.each(|id, c| assert_eq!((id, c.byte_len(), c.imm()), (7, 0, None)));
            p.len()
        });
        assert_eq!(seen, 1);
    }

    #[test]
    fn a_received_message_reads_its_length_and_immediate() {
        let area = stale_area();
        let write = |wc: *mut ffi::ibv_wc| {
            put(field!(wc, wc_flags), ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0);
            put(field!(wc, qp_num), 0x12);
            put(field!(wc, byte_len), 3000);
            put(field!(wc, wr_id), 9);
            put(
                field!(wc, opcode),
                ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM,
            );
            put(
                field!(wc, imm_data_invalidated_rkey_union).cast::<u32>(),
                0xfeed_beef_u32.to_be(),
            );
            put(field!(wc, status), ffi::ibv_wc_status::IBV_WC_SUCCESS);
        };
        let c = poll_one(&area, write, |p| p.only_success(9)).expect("one success");
        assert_eq!(
            (c.byte_len(), c.imm(), c.qp_num()),
            (3000, Some(0xfeed_beef), 0x12)
        );
    }

    #[test]
    fn an_error_reads_its_vendor_code_and_a_provider_that_writes_none_reads_0() {
        let area = stale_area();
        let write = |wc: *mut ffi::ibv_wc| {
            put(field!(wc, qp_num), 0x13);
            put(
                field!(wc, status),
                ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            );
            put(field!(wc, vendor_err), 0x88);
            put(field!(wc, wr_id), 3);
        };
        let mut seen = Vec::new();
        poll_one(&area, write, |p| {
            assert!(p.only_success(3).is_none(), "not a success");
            p.each(|id, c| seen.push((id, c)));
        });
        let [(3, c)] = seen[..] else {
            panic!("one completion, request 3: {seen:?}")
        };
        assert_eq!(c.status(), ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
        assert_eq!((c.vendor_err(), c.byte_len(), c.imm()), (0x88, 0, None));
        assert_eq!(
            c.with_posted_len(64).byte_len(),
            0,
            "an error has no length"
        );
        // qedr writes no vendor_err: on its own queue (an area of zeroes that no provider
        // but qedr writes) a flush reads 0; read twice, the same.
        let area = PollArea::new();
        let c = poll_one(&area, qedr_flush, |p| {
            assert_eq!(p.at(0).1.vendor_err(), p.at(0).1.vendor_err());
            p.at(0).1
        });
        assert_eq!((c.status(), c.vendor_err(), c.qp_num()), (5, 0, 0x13));
    }

    #[test]
    fn a_status_past_16_bits_reads_as_an_error() {
        let write = |wc: *mut ffi::ibv_wc| {
            put(field!(wc, status), 0x1_0000);
            put(field!(wc, wr_id), 1);
        };
        poll_one(&PollArea::new(), write, |p| {
            p.each(|_, c| assert!(!c.is_success()))
        });
    }

    #[test]
    fn a_poll_while_the_area_is_held_writes_elsewhere_and_a_failure_is_the_errno() {
        let area = PollArea::new();
        let write = mlx5_requester(ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE, false);
        poll_one(&area, write, |outer| {
            // A waker polling the same queue while the outer poll's completions are read.
            let inner = poll_one(&area, qedr_flush, |p| p.at(0));
            assert_eq!(inner.0, 3);
            assert_eq!(outer.at(0).0, 7, "the outer completion stays as it was");
            assert!(outer.only_success(7).is_some());
        });
        let failed = area
            .poll(|_, _| -libc::EINVAL, |p| p.err())
            .expect("a failure");
        assert_eq!(failed.errno(), libc::EINVAL);
        // Released after a failure and after a panic while reading.
        assert!(!area.busy.get());
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            poll_one(&area, qedr_flush, |_| panic!("a waker panicked"))
        }));
        assert!(caught.is_err());
        assert!(!area.busy.get(), "a panic while reading releases the area");
    }
}
