//! Dumb buffers (`DRM_IOCTL_MODE_CREATE_DUMB`): linear buffers any KMS driver (and vgem) can
//! allocate on its card node, exportable with PRIME.

use crate::device::DrmDevice;
use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use drm::control::Device as _;
use std::sync::Arc;

/// A dumb buffer; its reference to the GEM handle is given back on drop, and the handle is
/// closed once no other owner on the device file (e.g. a PRIME import of its own export) holds
/// it.
#[derive(Debug)]
pub struct DumbBuffer {
    device: Arc<DrmDevice>,
    buffer: drm::control::dumbbuffer::DumbBuffer,
}

impl DumbBuffer {
    /// `DRM_IOCTL_MODE_CREATE_DUMB`: at least `size` bytes as a `width` x `height`, 32 bpp
    /// buffer (width 1024 pixels, rows as needed). Needs the card node.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0; [`Error::Os`] (with a hint on render nodes).
    pub fn new(device: &Arc<DrmDevice>, size: u64) -> Result<DumbBuffer> {
        if size == 0 {
            return Err(Error::invalid(Op::CreateDumb, "size 0"));
        }
        const WIDTH: u64 = 1024;
        let rows = size.div_ceil(WIDTH * 4);
        let height = u32::try_from(rows)
            .map_err(|_| Error::invalid(Op::CreateDumb, format!("size {size} too large")))?;
        let buffer = device.acquire_handle(
            || {
                device
                    .ops()
                    .create_dumb_buffer(
                        (WIDTH as u32, height),
                        drm::buffer::DrmFourcc::Xrgb8888,
                        32,
                    )
                    .map_err(|e| Error::os(Op::CreateDumb, device.path().display(), e))
            },
            drm::buffer::Buffer::handle,
        )?;
        Ok(DumbBuffer {
            device: device.clone(),
            buffer,
        })
    }

    /// The buffer's size in bytes as the driver allocated it.
    pub fn size(&self) -> u64 {
        let (_, h) = drm::buffer::Buffer::size(&self.buffer);
        u64::from(drm::buffer::Buffer::pitch(&self.buffer)) * u64::from(h)
    }

    /// The GEM handle.
    pub fn handle(&self) -> drm::buffer::Handle {
        drm::buffer::Buffer::handle(&self.buffer)
    }

    /// `DRM_IOCTL_PRIME_HANDLE_TO_FD` with `DRM_CLOEXEC | DRM_RDWR`: the buffer as a dma-buf.
    ///
    /// # Errors
    /// [`Error::Os`] if the driver refuses the export.
    pub fn export(&self) -> Result<DmaBuf> {
        crate::prime::prime_export(&self.device, self.handle())
    }
}

impl Drop for DumbBuffer {
    fn drop(&mut self) {
        // `DRM_IOCTL_GEM_CLOSE` once the last owner lets go; the kernel's
        // `DRM_IOCTL_MODE_DESTROY_DUMB` is the same handle deletion.
        self.device.release_handle(self.handle());
    }
}
