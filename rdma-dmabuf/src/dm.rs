//! Device memory: NIC-resident memory (`ibv_alloc_dm`), registered as a zero-based region
//! (`ibv_reg_dm_mr`) and filled or read by the CPU with `ibv_memcpy_{to,from}_dm`.
//!
//! Only some providers have it (mlx5, mana); soft-RoCE answers [`Error::Unsupported`].

use crate::device::Context;
use crate::error::{Error, Op, Result};
use crate::mr::{sealed::Sealed, Access, Backing, MemoryRegion};
use crate::sys::mr::Registration;
use crate::sys::pd::ProtectionDomain;
use std::sync::Arc;

pub use crate::sys::dm::DeviceMemory;

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
        DeviceMemory::alloc(ctx, len, log_align).map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            if matches!(errno, libc::EOPNOTSUPP | libc::ENOSYS) {
                return Error::Unsupported {
                    op: Op::AllocDm,
                    device: ctx.name().into(),
                    errno,
                    why: DM_HINT,
                };
            }
            Error::from_errno(Op::AllocDm, format!("{} ({len} bytes)", ctx.name()), errno)
        })
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn check(&self, offset: u64, n: usize) -> Result<()> {
        if n == 0 || offset.checked_add(n as u64).is_none_or(|e| e > self.len()) {
            return Err(Error::invalid(
                Op::CopyDm,
                format!("copy of {offset}+{n} outside {} bytes", self.len()),
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
        self.write_at(offset, data)
            .map_err(|rc| Error::from_errno(Op::CopyDm, self.context().name(), rc))
    }

    /// `ibv_memcpy_from_dm`: copies from `offset` into `out`.
    ///
    /// # Errors
    /// As [`DeviceMemory::copy_from_host`].
    pub fn copy_to_host(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        self.read_at(offset, out)
            .map_err(|rc| Error::from_errno(Op::CopyDm, self.context().name(), rc))
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
        access.check(Op::RegDmMr)?;
        let device = pd.context().name().to_string();
        let reg = Registration::device_memory(pd, dm, access.bits()).map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(libc::EIO);
            if errno == libc::EOPNOTSUPP {
                return Error::Unsupported {
                    op: Op::RegDmMr,
                    device: device.clone(),
                    errno,
                    why: DM_HINT,
                };
            }
            Error::from_errno(Op::RegDmMr, &device, errno)
        })?;
        Ok(MemoryRegion::from_registration(reg))
    }

    /// The device memory, for CPU copies.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region.
    pub fn device_memory(&mut self) -> Result<&mut DeviceMemory> {
        self.backing_mut()
    }
}
