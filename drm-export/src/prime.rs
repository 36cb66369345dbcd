//! PRIME: GEM handle to dma-buf fd and back.

use crate::device::DrmDevice;
use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use drm::control::Device as _;
use std::os::fd::AsFd;

/// `DRM_CLOEXEC | DRM_RDWR`: close on exec, and allow writable CPU mappings of the dma-buf.
const EXPORT_FLAGS: u32 = (libc::O_CLOEXEC | libc::O_RDWR) as u32;

/// `DRM_IOCTL_PRIME_HANDLE_TO_FD`: exports GEM `handle` of `device` as a dma-buf.
///
/// # Errors
/// [`Error::Os`] if the driver refuses.
pub fn prime_export(device: &DrmDevice, handle: drm::buffer::Handle) -> Result<DmaBuf> {
    let fd = device
        .ops()
        .buffer_to_prime_fd(handle, EXPORT_FLAGS)
        .map_err(|e| {
            Error::os(
                Op::PrimeExport,
                format!("{} handle {handle:?}", device.path().display()),
                e,
            )
        })?;
    DmaBuf::try_from(fd)
}

/// A GEM handle imported from a dma-buf; its reference to the handle is given back on drop.
///
/// Importing a dma-buf that this device file already has a handle for (e.g. one exported from
/// a [`DumbBuffer`](crate::DumbBuffer) of the same [`DrmDevice`]) yields that same handle; it
/// stays open until its last owner is dropped (see [`DrmDevice`]).
#[derive(Debug)]
pub struct PrimeImport<'d> {
    device: &'d DrmDevice,
    handle: drm::buffer::Handle,
}

impl PrimeImport<'_> {
    /// The GEM handle on the importing device.
    pub fn handle(&self) -> drm::buffer::Handle {
        self.handle
    }
}

impl Drop for PrimeImport<'_> {
    fn drop(&mut self) {
        // `DRM_IOCTL_GEM_CLOSE` once no other owner on this device file holds the handle.
        self.device.release_handle(self.handle);
    }
}

/// `DRM_IOCTL_PRIME_FD_TO_HANDLE`: imports `dmabuf` into `device` (any node type).
///
/// When `device` already has a handle for the buffer (its own export, or an earlier import),
/// the kernel returns that handle; the returned [`PrimeImport`] then shares it with its other
/// owners, and dropping it leaves the handle open for them.
///
/// # Errors
/// [`Error::Os`] (`EINVAL`/`EBADF` with a hint) if the fd is not a dma-buf the device accepts.
pub fn prime_import<'d>(device: &'d DrmDevice, dmabuf: &impl AsFd) -> Result<PrimeImport<'d>> {
    let handle = device.acquire_handle(
        || {
            device
                .ops()
                .prime_fd_to_buffer(dmabuf.as_fd())
                .map_err(|e| Error::os(Op::PrimeImport, device.path().display(), e))
        },
        |h| *h,
    )?;
    Ok(PrimeImport { device, handle })
}
