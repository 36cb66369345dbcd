//! Reading what a peer writes into a host region while it may still write: volatile copies,
//! never a slice (see docs/safety.md, "Learning that a write landed without a completion").

use crate::error::{Error, Op, Result};
use crate::host::HostBuffer;
use crate::mr::MemoryRegion;
use std::sync::atomic::{fence, Ordering};

impl MemoryRegion<HostBuffer> {
    /// Copies `out.len()` bytes at `offset` out of the region with volatile reads, whoever
    /// may be writing them (a peer's RDMA write, a local NIC's receive): the way to watch a
    /// remotely writable region for a peer's write, e.g. a sequence number the peer puts in
    /// the last bytes of each message, without a receive completion (`ib_write_lat` polls
    /// the last byte of its buffer the same way).
    ///
    /// No reference to the bytes is made, so a concurrent write cannot be undefined
    /// behaviour here: the copy may mix old and new bytes, which the protocol must tell
    /// apart (a sequence number in bytes the peer writes in one piece, read again until it
    /// changes). Which other bytes are done when the watched ones are is the protocol's
    /// business too: RDMA does not order the bytes of one write as they land, and a
    /// completion (the peer's, or a receive's) is the only guarantee that all have. The
    /// copy is followed by an acquire fence, so reads after it are not made before it.
    /// Taking `&self` keeps this away from a region lent to a local request that the NIC
    /// writes (an owned post moves the region; a scoped receive borrows it exclusively).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `offset..offset + out.len()` is outside the region.
    pub fn read_volatile(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        let copied = usize::try_from(offset)
            .is_ok_and(|offset| self.backing_unchecked().read_volatile_at(offset, out));
        if !copied {
            return Err(Error::invalid(
                Op::CpuAccess,
                format!(
                    "{} bytes at {offset} of a region of {}",
                    out.len(),
                    self.len()
                ),
            ));
        }
        fence(Ordering::Acquire);
        Ok(())
    }
}
