//! Work completions as a poll takes them: the array the provider writes into (on the stack,
//! uninitialised), and what is read of each entry, which is only what the verbs define for
//! that completion: a provider may leave the rest unwritten (docs/safety.md, "What the
//! provider writes").

use rdma_sys as ffi;
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
/// type, made without a reference to the entry (whose other fields may be unwritten).
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
    /// write with immediate without writing the data.) Returns its `wr_id` too.
    ///
    /// # Safety
    /// `wc` points to a work completion the provider wrote in a successful poll: at least
    /// the fields the verbs define for it.
    #[inline(always)]
    unsafe fn read(wc: *const ffi::ibv_wc) -> (u64, RawCompletion) {
        // Each read below is of a field that the verbs define for this completion, so that
        // the provider wrote it (this function's contract), through a pointer into the
        // entry at `wc` (aligned: an element of `Polled::wcs`) typed as that field.
        // SAFETY: defined for every completion.
        let wr_id = unsafe { field!(wc, wr_id).read() };
        // SAFETY: defined for every completion.
        let status = unsafe { field!(wc, status).read() };
        // SAFETY: defined for every completion.
        let qp_num = unsafe { field!(wc, qp_num).read() };
        let (bits, len_or_vendor, imm) = if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            // SAFETY: defined for an error.
            let vendor = unsafe { field!(wc, vendor_err).read() };
            (status.min(STATUS), vendor, 0)
        } else {
            // SAFETY: defined for a success.
            let opcode = unsafe { field!(wc, opcode).read() };
            if opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0 {
                // SAFETY: defined for a received message.
                let len = unsafe { field!(wc, byte_len).read() };
                // SAFETY: defined for a received message.
                let flags = unsafe { field!(wc, wc_flags).read() };
                if flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                    let union = field!(wc, imm_data_invalidated_rkey_union);
                    // SAFETY: defined for a received message with IBV_WC_WITH_IMM set: the
                    // union holds its immediate data (a 32-bit word at the union's start).
                    let imm = unsafe { union.cast::<u32>().read() };
                    (WITH_IMM, len, u32::from_be(imm))
                } else {
                    (0, len, 0)
                }
            } else {
                // A request this side posted: its slot puts in the length posted.
                (0, 0, 0)
            }
        };
        let c = RawCompletion {
            tag: tag(bits),
            len_or_vendor,
            imm,
            qp_num,
        };
        (wr_id, c)
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

/// The completions one poll took from a completion queue, as the provider wrote them
/// ([`CompletionQueue::poll_into`](super::cq::CompletionQueue::poll_into)); read as
/// [`RawCompletion`]s. On the stack, uninitialised past what the poll wrote, and, within
/// what it wrote, wherever the provider left a field the verbs do not define for that
/// completion: no reference to an entry is ever made, only reads of the defined fields.
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

    /// How many completions a poll may write, and where: for `ibv_poll_cq`.
    #[inline(always)]
    pub(super) fn room(&mut self) -> (i32, *mut ffi::ibv_wc) {
        (BATCH as i32, self.wcs.as_mut_ptr().cast())
    }

    /// Records what `ibv_poll_cq` returned for [`Polled::room`]: how many it wrote, or its
    /// failure (then nothing is held).
    #[inline(always)]
    pub(super) fn set_written(&mut self, n: i32) -> Result<usize, PollFailed> {
        if n < 0 {
            self.n = 0;
            return Err(PollFailed(-n));
        }
        // At most BATCH (the provider writes no more than it is given room for).
        self.n = (n as usize).min(BATCH);
        Ok(self.n)
    }

    /// Completion `i` of the poll's (`i < self.n`).
    #[inline(always)]
    fn at(&self, i: usize) -> (u64, RawCompletion) {
        debug_assert!(i < self.n);
        let wc = self.wcs[i].as_ptr();
        // SAFETY: `i < n`: the poll that set `n` wrote entry `i` (the provider writes the
        // first `n` of the room it was given).
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
        let (id, c) = self.at(0);
        (id == wr_id && c.is_success()).then_some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `v` where `p` points: a field of the entry `written_as` hands out.
    fn put<T>(p: *const T, v: T) {
        // SAFETY: every caller passes a `field!` pointer into the first entry of the array
        // of a `Polled` that the test owns and nothing else borrows (`written_as`).
        unsafe { p.cast_mut().write(v) }
    }

    /// A completion as a provider leaves it: every byte `0xa5` but the fields `write`
    /// sets, as a provider leaves what it does not write as it was.
    fn written_as(write: impl FnOnce(*mut ffi::ibv_wc)) -> Polled {
        let mut polled = Polled::new();
        let (_, wcs) = polled.room();
        // SAFETY: `wcs` has room for BATCH entries, of which this fills the first.
        unsafe {
            wcs.cast::<u8>()
                .write_bytes(0xa5, std::mem::size_of::<ffi::ibv_wc>())
        };
        write(wcs);
        polled.set_written(1).unwrap();
        polled
    }

    /// How mlx5 writes a requester's successful completion: `wc_flags` and `qp_num`,
    /// the opcode, `IBV_WC_WITH_IMM` for a send or write with immediate, `wr_id` and the
    /// status; no `byte_len` (but for a read's or an atomic's) and no immediate data.
    fn mlx5_requester(opcode: u32, with_imm: bool) -> Polled {
        written_as(|wc| {
            put(
                field!(wc, wc_flags),
                if with_imm {
                    ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0
                } else {
                    0
                },
            );
            put(field!(wc, qp_num), 0x11);
            put(field!(wc, opcode), opcode);
            put(field!(wc, wr_id), 7);
            put(field!(wc, status), ffi::ibv_wc_status::IBV_WC_SUCCESS);
        })
    }

    #[test]
    fn a_sent_write_with_immediate_reads_no_length_and_no_immediate() {
        let polled = mlx5_requester(ffi::ibv_wc_opcode::IBV_WC_RDMA_WRITE, true);
        let c = polled.only_success(7).expect("one success, request 7");
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
        let polled = mlx5_requester(ffi::ibv_wc_opcode::IBV_WC_SEND, false);
        polled.each(|id, c| {
            assert_eq!((id, c.byte_len(), c.imm()), (7, 0, None));
        });
    }

    #[test]
    fn a_received_message_reads_its_length_and_immediate() {
        let polled = written_as(|wc| {
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
        });
        let c = polled.only_success(9).expect("one success");
        assert_eq!(
            (c.byte_len(), c.imm(), c.qp_num()),
            (3000, Some(0xfeed_beef), 0x12)
        );
    }

    #[test]
    fn an_error_reads_its_vendor_code_and_nothing_a_success_defines() {
        let polled = written_as(|wc| {
            put(field!(wc, qp_num), 0x13);
            put(
                field!(wc, status),
                ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
            );
            put(field!(wc, vendor_err), 0x88);
            put(field!(wc, wr_id), 3);
        });
        assert!(polled.only_success(3).is_none(), "not a success");
        let mut seen = 0;
        polled.each(|id, c| {
            seen += 1;
            assert_eq!(id, 3);
            assert_eq!(c.status(), ffi::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
            assert_eq!((c.vendor_err(), c.byte_len(), c.imm()), (0x88, 0, None));
            assert_eq!(
                c.with_posted_len(64).byte_len(),
                0,
                "an error has no length"
            );
        });
        assert_eq!(seen, 1);
    }

    #[test]
    fn a_status_past_16_bits_reads_as_an_error() {
        let polled = written_as(|wc| {
            put(field!(wc, qp_num), 1);
            put(field!(wc, status), 0x1_0000);
            put(field!(wc, vendor_err), 0);
            put(field!(wc, wr_id), 1);
        });
        polled.each(|_, c| assert!(!c.is_success()));
    }
}
