//! Device memory: NIC-resident memory (`ibv_alloc_dm`), registered as a zero-based region
//! (`ibv_reg_dm_mr`) and filled or read by the CPU with `ibv_memcpy_{to,from}_dm`.
//!
//! Only some providers have it (mlx5, mana); soft-RoCE answers [`Error::Unsupported`].

use crate::device::Context;
use crate::error::{Error, Op, Result};
use crate::mr::{sealed::Sealed, Access, Backing, MemoryRegion};
use crate::sys::pd::ProtectionDomain;
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

const DM_HINT: &str = "this device has no device memory (ibv_alloc_dm): mlx5 (ConnectX-5 and \
    later) and mana have it, rxe and siw do not; use host or dma-buf regions";

impl DeviceMemory {
    /// `ibv_alloc_dm` of `len` bytes aligned to `1 << log_align`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] where the provider has no device memory; [`Error::Verbs`] (e.g.
    /// `ENOMEM` past the device's `max_dm_size`).
    pub fn allocate(ctx: &Arc<Context>, len: u64, log_align: u32) -> Result<DeviceMemory> {
        if len == 0 {
            return Err(Error::invalid(Op::AllocDm, "length 0"));
        }
        let mut attr = ffi::ibv_alloc_dm_attr {
            length: len as usize,
            log_align_req: log_align,
            comp_mask: 0,
        };
        // SAFETY: open context; `attr` valid for the call.
        let dm =
            unsafe { ffi::ibv_alloc_dm(ctx.as_ptr(), &mut attr) }.unwrap_or(std::ptr::null_mut());
        let Some(dm) = NonNull::new(dm) else {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS) {
                return Err(Error::Unsupported {
                    op: Op::AllocDm,
                    device: ctx.name().into(),
                    errno,
                    why: DM_HINT,
                });
            }
            return Err(Error::from_errno(
                Op::AllocDm,
                format!("{} ({len} bytes)", ctx.name()),
                errno,
            ));
        };
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

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, offset: u64, n: usize) -> Result<()> {
        if n == 0 || offset.checked_add(n as u64).is_none_or(|e| e > self.len) {
            return Err(Error::invalid(
                Op::CopyDm,
                format!("copy of {offset}+{n} outside {} bytes", self.len),
            ));
        }
        Ok(())
    }

    /// `ibv_memcpy_to_dm`: copies `data` to `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] outside the memory; [`Error::Verbs`] from the provider.
    pub fn copy_from_host(&mut self, offset: u64, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        // SAFETY: live device memory; `data` is a live host slice of the length copied; the
        // range was checked above.
        let rc = unsafe {
            ffi::ibv_memcpy_to_dm(self.dm.as_ptr(), offset, data.as_ptr().cast(), data.len())
        };
        if rc != 0 {
            return Err(Error::from_errno(Op::CopyDm, self.ctx.name(), rc));
        }
        Ok(())
    }

    /// `ibv_memcpy_from_dm`: copies from `offset` into `out`.
    ///
    /// # Errors
    /// As [`DeviceMemory::copy_from_host`].
    pub fn copy_to_host(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        // SAFETY: as copy_from_host, with `out` writable.
        let rc = unsafe {
            ffi::ibv_memcpy_from_dm(out.as_mut_ptr().cast(), self.dm.as_ptr(), offset, out.len())
        };
        if rc != 0 {
            return Err(Error::from_errno(Op::CopyDm, self.ctx.name(), rc));
        }
        Ok(())
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_dm {
        self.dm.as_ptr()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        // SAFETY: any region over it was deregistered first (it owns this value); freed once.
        let rc = unsafe { ffi::ibv_free_dm(self.dm.as_ptr()) };
        if rc != 0 {
            crate::diag::warn(format_args!(
                "ibv_free_dm on {} failed: {rc}",
                self.ctx.name()
            ));
        }
    }
}

impl Sealed for DeviceMemory {}
impl Backing for DeviceMemory {}

impl MemoryRegion<DeviceMemory> {
    /// `ibv_reg_dm_mr` over the whole device memory, zero-based: work requests address it
    /// from 0.
    ///
    /// # Errors
    /// As [`MemoryRegion::register`]; [`Error::Unsupported`] without the provider op.
    pub fn register_dm(
        pd: &Arc<ProtectionDomain>,
        dm: DeviceMemory,
        access: Access,
    ) -> Result<Self> {
        /// `IBV_ACCESS_ZERO_BASED`, which `ibv_reg_dm_mr` requires.
        const ZERO_BASED: u32 = 1 << 5;
        access.check(Op::RegDmMr)?;
        // SAFETY: live PD and device memory; the region keeps `dm` alive until deregistered.
        let mr = unsafe {
            ffi::ibv_reg_dm_mr(
                pd.as_ptr(),
                dm.as_ptr(),
                0,
                dm.len as usize,
                access.bits() | ZERO_BASED,
            )
        }
        .unwrap_or(std::ptr::null_mut());
        let Some(mr) = NonNull::new(mr) else {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO);
            if errno == libc::EOPNOTSUPP {
                return Err(Error::Unsupported {
                    op: Op::RegDmMr,
                    device: pd.context().name().into(),
                    errno,
                    why: DM_HINT,
                });
            }
            return Err(Error::from_errno(Op::RegDmMr, pd.context().name(), errno));
        };
        let len = dm.len;
        // SAFETY: `mr` was just registered in `pd` over `dm`; nothing else has it.
        Ok(unsafe { MemoryRegion::from_parts(mr, pd, dm, 0, len, access) })
    }

    /// The device memory, for CPU copies.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region.
    pub fn device_memory(&mut self) -> Result<&mut DeviceMemory> {
        self.backing_mut()
    }
}
