//! Protection domains (`ibv_alloc_pd`).

use super::device::Context;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// A protection domain: regions and queue pairs created in it may be used together.
pub struct ProtectionDomain {
    pd: NonNull<ffi::ibv_pd>,
    ctx: Arc<Context>,
}

// SAFETY: a PD is used only through thread-safe verbs (registration, QP creation).
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain {}

impl fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name())
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_alloc_pd`.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<ProtectionDomain>> {
        // SAFETY: the context is open (the Arc keeps it so).
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| Error::last_os(Op::AllocPd, ctx.name()))?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            ctx: ctx.clone(),
        }))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The `ibv_pd`, for the calls of this layer that take it.
    pub(in crate::sys) fn as_ptr(&self) -> *mut ffi::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: regions and QPs hold an Arc to this PD, so none is left; freed once.
        let rc = unsafe { ffi::ibv_dealloc_pd(self.as_ptr()) };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_dealloc_pd on {} failed: {rc}",
                self.ctx.name()
            ));
        }
    }
}
