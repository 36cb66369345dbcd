//! Verbs calls made directly through `rdma-sys`, for what the crate refuses first or does not
//! allow: the driver's own errnos, and a second region on a buffer that a `DmaBuf` of this
//! process already holds.

use crate::testbed::Testbed;
use rdma_sys as ffi;

/// A device context and a protection domain on it, opened and freed directly.
pub struct RawPd {
    ctx: *mut ffi::ibv_context,
    pd: *mut ffi::ibv_pd,
}

/// A memory region registered directly; deregistered when dropped.
pub struct RawMr<'a> {
    mr: *mut ffi::ibv_mr,
    _pd: &'a RawPd,
}

impl RawPd {
    /// Opens the testbed's device and allocates a protection domain.
    ///
    /// # Panics
    /// If the device is missing or either call fails.
    pub fn open(tb: &Testbed) -> RawPd {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { ffi::ibv_get_device_list(&mut n) };
        assert!(!list.is_null() && n > 0);
        // SAFETY: `n` valid entries until freed.
        let devs = unsafe { std::slice::from_raw_parts(list, n as usize) };
        let dev = devs
            .iter()
            .copied()
            .find(|&d| {
                // SAFETY: a live entry of the list.
                let name = unsafe { ffi::ibv_get_device_name(d) };
                // SAFETY: a NUL-terminated string owned by the device.
                unsafe { std::ffi::CStr::from_ptr(name) }.to_str() == Ok(&tb.device)
            })
            .expect("the testbed device");
        // SAFETY: a live entry of the list.
        let ctx = unsafe { ffi::ibv_open_device(dev) };
        // SAFETY: freed once; the context stays valid.
        unsafe { ffi::ibv_free_device_list(list) };
        assert!(!ctx.is_null());
        // SAFETY: an open context.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx) };
        assert!(!pd.is_null());
        RawPd { ctx, pd }
    }

    /// `ibv_reg_dmabuf_mr`: the region, or the errno it failed with.
    pub fn reg_dmabuf(
        &self,
        offset: u64,
        len: usize,
        iova: u64,
        fd: i32,
        access: i32,
    ) -> Result<RawMr<'_>, i32> {
        // SAFETY: a live PD; the kernel validates every other argument.
        let mr = unsafe { ffi::ibv_reg_dmabuf_mr(self.pd, offset, len, iova, fd, access) };
        if mr.is_null() {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(-1));
        }
        Ok(RawMr { mr, _pd: self })
    }

    /// The errno of `ibv_reg_dmabuf_mr` with these arguments, or 0 if it registered (the
    /// region is deregistered at once).
    pub fn reg_errno(&self, offset: u64, len: usize, iova: u64, fd: i32, access: i32) -> i32 {
        self.reg_dmabuf(offset, len, iova, fd, access)
            .err()
            .unwrap_or(0)
    }
}

impl Drop for RawMr<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by `reg_dmabuf`, deregistered once, before its PD (borrowed).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr) };
        assert_eq!(rc, 0, "ibv_dereg_mr");
    }
}

impl Drop for RawPd {
    fn drop(&mut self) {
        // SAFETY: every region borrowed the PD and is gone; freed once, before its context.
        unsafe { ffi::ibv_dealloc_pd(self.pd) };
        // SAFETY: the PD on it was freed just above; closed once.
        unsafe { ffi::ibv_close_device(self.ctx) };
    }
}
