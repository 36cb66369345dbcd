//! Remote atomics: fetch-and-add and compare-and-swap on 8 bytes of a peer's region, the old
//! value landing in an 8-byte part of a local region.

use super::pending::{Pending, WorkError};
use super::post::Shape;
use super::QueuePair;
use crate::device::AtomicCap;
use crate::error::{Error, Op};
use crate::mr::Backing;
use crate::part::Local;
use crate::remote::RemoteRegion;
use crate::wr::AtomicOp;

impl QueuePair {
    /// A remote atomic `op` on the first 8 bytes of `remote` (8-byte aligned, in a region the
    /// peer registered with `REMOTE_ATOMIC`); the value it had before lands in `local`, an
    /// 8-byte part of a region with `LOCAL_WRITE` (in the byte order the device writes: the
    /// host's on rxe). The region moves into the request and comes back with the completion,
    /// like every owned post.
    ///
    /// # Errors
    /// A [`WorkError`] with the region back: a device without atomics
    /// ([`Error::Unsupported`]), a local part that is not 8 bytes, a misaligned or short
    /// remote, and the checks of every post; a remote region without `REMOTE_ATOMIC` fails
    /// at completion (a remote access error).
    pub fn post_atomic<B: Backing>(
        &self,
        local: impl Into<Local<B>>,
        remote: RemoteRegion,
        op: AtomicOp,
    ) -> std::result::Result<Pending<'_, B>, WorkError<B>> {
        let local = local.into();
        let kind = op.kind();
        let back = |error: Error, local: Local<B>| WorkError {
            error,
            region: local.into_region(),
        };
        let refuse = |error: Error, local: Local<B>| Err(back(error, local));
        if self.raw.caps().atomics == AtomicCap::None {
            let error = Error::Unsupported {
                op: Op::PostSend,
                device: self.raw.pd().context().name().to_string(),
                errno: libc::EOPNOTSUPP,
                why: "the device does no remote atomics (atomic_cap is IBV_ATOMIC_NONE)",
            };
            return refuse(error, local);
        }
        let range = local.range();
        if range.end.checked_sub(range.start) != Some(8) {
            let why = format!(
                "{kind} into {}..{}: the old value takes exactly 8 bytes",
                range.start, range.end
            );
            return refuse(Error::invalid(Op::PostSend, why), local);
        }
        if !remote.addr.is_multiple_of(8) {
            let why = format!(
                "{kind} at remote address {:#x}: atomics need an 8-byte aligned address",
                remote.addr
            );
            return refuse(Error::invalid(Op::PostSend, why), local);
        }
        let shape = Shape {
            atomic: Some(op),
            ..Shape::new(kind, Some(remote), None)
        };
        self.post_owned(shape, local, |ticket| Pending { ticket }, back)
    }
}
