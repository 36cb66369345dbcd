//! vgem's test fences (`DRM_IOCTL_VGEM_FENCE_ATTACH` / `SIGNAL`): a fence attached to a buffer
//! that userspace signals by hand, to test implicit synchronisation without a GPU.

use crate::device::DrmDevice;
use crate::error::{Error, Op, Result};
use crate::sys;

/// An unsignalled vgem fence on a buffer; signalled on drop if not before (vgem itself
/// signals stale fences after about 10 s).
#[derive(Debug)]
pub struct VgemFence<'d> {
    device: &'d DrmDevice,
    fence: u32,
    signalled: bool,
}

impl<'d> VgemFence<'d> {
    /// Attaches a fence to GEM `handle`: a write fence (exclusive) if `write`, else a read
    /// fence. Needs a vgem device.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on other drivers; [`Error::Os`] from the ioctl.
    pub fn attach(device: &'d DrmDevice, handle: drm::buffer::Handle, write: bool) -> Result<Self> {
        if device.driver().name != "vgem" {
            return Err(Error::Unsupported {
                op: Op::VgemFence,
                target: device.path().display().to_string(),
                why: format!("driver is {}, not vgem", device.driver().name),
            });
        }
        let mut arg = sys::drm_vgem_fence_attach {
            handle: u32::from(handle),
            flags: if write { sys::VGEM_FENCE_WRITE } else { 0 },
            ..Default::default()
        };
        sys::vgem_fence_attach(device, &mut arg)
            .map_err(|e| Error::os(Op::VgemFence, device.path().display(), e))?;
        Ok(VgemFence {
            device,
            fence: arg.out_fence,
            signalled: false,
        })
    }

    /// Signals the fence.
    ///
    /// # Errors
    /// [`Error::Os`] from the ioctl (`ETIMEDOUT` if vgem already signalled it as stale).
    pub fn signal(mut self) -> Result<()> {
        self.signalled = true;
        sys::vgem_fence_signal(self.device, self.fence)
            .map_err(|e| Error::os(Op::VgemFence, self.device.path().display(), e))
    }
}

impl Drop for VgemFence<'_> {
    fn drop(&mut self) {
        if !self.signalled {
            let _ = sys::vgem_fence_signal(self.device, self.fence);
        }
    }
}
