//! Device memory (`ibv_alloc_dm`, `ibv_memcpy_{to,from}_dm`, `ibv_free_dm`).

use super::device::Context;
use rdma_sys as ffi;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// Device memory; freed on drop.
pub struct DeviceMemory {
    dm: NonNull<ffi::ibv_dm>,
    ctx: Arc<Context>,
    len: u64,
}

// SAFETY: device memory is used through thread-safe verbs; `&mut self` guards the copies.
unsafe impl Send for DeviceMemory {}
// SAFETY: `&DeviceMemory` allows only reads (`copy_to_host`).
unsafe impl Sync for DeviceMemory {}

impl fmt::Debug for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceMemory")
            .field("device", &self.ctx.name())
            .field("len", &self.len)
            .finish()
    }
}

impl DeviceMemory {
    /// `ibv_alloc_dm` of `len` bytes aligned to `1 << log_align`.
    ///
    /// # Errors
    /// The OS error of the call (or `EOPNOTSUPP` where the provider has no such op).
    pub(crate) fn alloc(
        ctx: &Arc<Context>,
        len: u64,
        log_align: u32,
    ) -> std::io::Result<DeviceMemory> {
        let mut attr = ffi::ibv_alloc_dm_attr {
            length: len as usize,
            log_align_req: log_align,
            comp_mask: 0,
        };
        // SAFETY: an open context.
        let alloc_dm = unsafe { super::ctx_ops::ctx_op!(ctx.as_ptr(), alloc_dm) }
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        // SAFETY: the provider's `alloc_dm` of this open context; `attr` valid for the call.
        let dm = unsafe { alloc_dm(ctx.as_ptr(), &mut attr) };
        let dm = NonNull::new(dm).ok_or_else(std::io::Error::last_os_error)?;
        Ok(DeviceMemory {
            dm,
            ctx: ctx.clone(),
            len,
        })
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// The context it was allocated on.
    pub(crate) fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// `ibv_memcpy_to_dm`: copies `data` to `offset`, which the caller checked with the
    /// length to be inside the memory (the provider checks again).
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn write_at(&mut self, offset: u64, data: &[u8]) -> std::result::Result<(), i32> {
        // SAFETY: live device memory; `data` is a live host slice of the length copied.
        let rc = unsafe {
            ffi::ibv_memcpy_to_dm(self.dm.as_ptr(), offset, data.as_ptr().cast(), data.len())
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// `ibv_memcpy_from_dm`: copies from `offset` into `out`.
    ///
    /// # Errors
    /// The errno the provider returned.
    pub(crate) fn read_at(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), i32> {
        // SAFETY: live device memory; `out` is a live, writable host slice of the length
        // copied.
        let rc = unsafe {
            ffi::ibv_memcpy_from_dm(out.as_mut_ptr().cast(), self.dm.as_ptr(), offset, out.len())
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(())
    }

    /// The `ibv_dm`, for registering it.
    pub(in crate::sys) fn as_ptr(&self) -> *mut ffi::ibv_dm {
        self.dm.as_ptr()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: the context is open (held by `self.ctx`).
        let rc = match unsafe { super::ctx_ops::ctx_op!(self.ctx.as_ptr(), free_dm) } {
            // SAFETY: any region over it was deregistered first (a registration owns it);
            // freed once, by the provider that allocated it.
            Some(free_dm) => unsafe { free_dm(self.dm.as_ptr()) },
            None => libc::EOPNOTSUPP,
        };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_free_dm on {} failed: {rc}",
                self.ctx.name()
            ));
        }
    }
}
