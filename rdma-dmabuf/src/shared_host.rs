//! [`SharedHostBuffer`]: one page-aligned host buffer behind several regions at once (one
//! buffer registered on several devices).

use crate::error::{Error, Op, Result};
use crate::host::HostBuffer;
use crate::mr::{sealed, Access, Backing, MemoryRegion};
use crate::sys::mr::Registration;
use crate::sys::pd::ProtectionDomain;
use std::sync::Arc;

pub use crate::sys::host::SharedHostBuffer;

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
        access.check(Op::RegMr)?;
        let target = format!(
            "{} (shared host buffer, {} bytes at {:p})",
            pd.context().name(),
            shared.len(),
            shared.0.addr()
        );
        let reg = Registration::host(pd, shared.clone(), access.bits()).map_err(|e| {
            Error::from_errno(Op::RegMr, target, e.raw_os_error().unwrap_or(libc::EIO))
        })?;
        Ok(MemoryRegion::from_registration(reg))
    }
}
