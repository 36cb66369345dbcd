//! [`SharedHostBuffer`]: one page-aligned host buffer behind several regions at once (one
//! buffer registered on several devices).

use crate::error::Result;
use crate::host::HostBuffer;
use crate::mr::{reg_host_mr, sealed, Access, Backing, MemoryRegion};
use crate::sys::pd::ProtectionDomain;
use std::sync::Arc;

/// A [`HostBuffer`] that several regions hold at once: one per protection domain when one
/// buffer is registered on several devices ([`MemoryRegion::register_shared_host`]).
///
/// It gives the CPU no access at all (no bytes, neither shared nor mutable): the regions
/// over it lend it to NICs independently, so any of them may be in use at any time, and a
/// peer may write it through any of them. The [`HostBuffer`] comes back from
/// [`SharedHostBuffer::try_into_inner`] only once nothing else holds it, that is, after
/// every region over it has been deregistered.
#[derive(Debug, Clone)]
pub struct SharedHostBuffer(Arc<HostBuffer>);

impl SharedHostBuffer {
    /// Shares `buffer`, for registering it in several protection domains.
    pub fn new(buffer: HostBuffer) -> SharedHostBuffer {
        SharedHostBuffer(Arc::new(buffer))
    }

    /// The buffer's length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the buffer is empty (never: a [`HostBuffer`] has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many handles share the buffer: this one, its clones, and one per region over it.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The [`HostBuffer`] back, with its CPU access, if this is the last handle (every
    /// region over it deregistered, every clone dropped); `Err(self)` otherwise.
    ///
    /// # Errors
    /// `Err(self)` while another handle or a region holds the buffer.
    pub fn try_into_inner(self) -> std::result::Result<HostBuffer, SharedHostBuffer> {
        Arc::try_unwrap(self.0).map_err(SharedHostBuffer)
    }
}

impl sealed::Sealed for SharedHostBuffer {}
impl Backing for SharedHostBuffer {}

impl MemoryRegion<SharedHostBuffer> {
    /// `ibv_reg_mr` over the whole of `shared` in `pd`, as [`MemoryRegion::register`] does
    /// for a [`HostBuffer`], the region holding a handle of the buffer: one buffer registered
    /// on several devices (a protection domain each), or several times in one. Work requests
    /// address it by the buffer's host address. [`MemoryRegion::into_inner`] gives the
    /// handle back after deregistration.
    ///
    /// # Errors
    /// As [`MemoryRegion::register`].
    pub fn register_shared_host(
        pd: &Arc<ProtectionDomain>,
        shared: &SharedHostBuffer,
        access: Access,
    ) -> Result<Self> {
        let mr = reg_host_mr(pd, &shared.0, access)?;
        let (addr, len) = (shared.0.addr() as u64, shared.0.len() as u64);
        // SAFETY: `reg_host_mr` just registered `mr` in `pd` over `shared`'s mapping, which
        // the region keeps alive through its own handle; nothing else has the MR.
        Ok(unsafe { MemoryRegion::from_parts(mr, pd, shared.clone(), addr, len, access) })
    }
}
