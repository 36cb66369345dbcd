//! [`SharedDmaBuf`]: one dma-buf behind several regions at once (the registration cache's
//! regions of one buffer, or one buffer registered on several devices).

use crate::error::Result;
use crate::mr::{reg_dmabuf, sealed, Access, Backing, MemoryRegion};
use crate::sys::pd::ProtectionDomain;
use drm_export::DmaBuf;
use std::sync::Arc;

/// A dma-buf that several regions hold at once: those of a
/// [`RegistrationCache`](crate::RegistrationCache) over one buffer, or one per protection domain when one buffer
/// is registered on several devices ([`MemoryRegion::register_shared_dmabuf`]).
///
/// It gives the CPU no access at all (no mapping, no bytes): the regions over it lend it to
/// NICs independently, so any of them may be in use at any time. The [`DmaBuf`] comes back
/// from [`SharedDmaBuf::try_into_inner`] only once nothing else holds it, that is, after
/// every region over it has been deregistered.
#[derive(Debug, Clone)]
pub struct SharedDmaBuf(Arc<DmaBuf>);

impl SharedDmaBuf {
    /// Shares `dmabuf`, for registering it in several protection domains.
    pub fn new(dmabuf: DmaBuf) -> SharedDmaBuf {
        SharedDmaBuf(Arc::new(dmabuf))
    }

    pub(crate) fn from_arc(dmabuf: Arc<DmaBuf>) -> SharedDmaBuf {
        SharedDmaBuf(dmabuf)
    }

    /// The buffer, for registering it (no CPU access: a `DmaBuf` maps only through `&mut`).
    pub(crate) fn dmabuf(&self) -> &DmaBuf {
        &self.0
    }

    /// The buffer's size in bytes.
    pub fn size(&self) -> u64 {
        self.0.size()
    }

    /// The exporter's name.
    pub fn exporter(&self) -> &str {
        self.0.exporter()
    }

    /// How many handles share the buffer: this one, its clones, and one per region over it.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// The [`DmaBuf`] back, with its CPU access, if this is the last handle (every region
    /// over it deregistered, every clone dropped); `Err(self)` otherwise.
    ///
    /// # Errors
    /// `Err(self)` while another handle or a region holds the buffer.
    pub fn try_into_inner(self) -> std::result::Result<DmaBuf, SharedDmaBuf> {
        Arc::try_unwrap(self.0).map_err(SharedDmaBuf)
    }
}

impl sealed::Sealed for SharedDmaBuf {}
impl Backing for SharedDmaBuf {}

impl MemoryRegion<SharedDmaBuf> {
    /// `ibv_reg_dmabuf_mr` of `len` bytes of `shared` from `offset` in `pd`, as
    /// [`MemoryRegion::register_dmabuf`] does, the region holding a handle of the buffer:
    /// one buffer registered on several devices (a protection domain each), or several
    /// times in one. [`MemoryRegion::into_inner`] gives the handle back after
    /// deregistration.
    ///
    /// # Errors
    /// As [`MemoryRegion::register_dmabuf`].
    pub fn register_shared_dmabuf(
        pd: &Arc<ProtectionDomain>,
        shared: &SharedDmaBuf,
        offset: u64,
        len: u64,
        iova: Option<u64>,
        access: Access,
    ) -> Result<Self> {
        let reg = reg_dmabuf(
            pd,
            shared.clone(),
            SharedDmaBuf::dmabuf,
            offset,
            len,
            iova,
            access,
        )?;
        Ok(MemoryRegion::from_registration(reg))
    }
}
