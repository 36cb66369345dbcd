//! Driver GEM buffers (i915, amdgpu; xe answers `Unsupported`) and the driver-agnostic
//! allocator that picks the right one from the driver's name, as rdma-core's own test
//! allocator does.

use crate::device::{DrmDevice, NodeKind};
use crate::dmabuf::DmaBuf;
use crate::dumb::DumbBuffer;
use crate::error::{Error, Op, Result};
use crate::sys;
use std::sync::Arc;

/// Where a GPU buffer should live.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    /// System memory the GPU can reach (i915 SMEM, amdgpu GTT).
    #[default]
    System,
    /// The GPU's own memory (i915 LMEM on discrete GPUs, amdgpu VRAM), with system memory as
    /// the fallback the driver may migrate to (e.g. when a non-P2P importer maps it).
    Device,
}

/// A GEM buffer object; its reference to the handle is given back on drop, and the handle is
/// closed once no other owner on the device file (e.g. a PRIME import of its own export) holds
/// it.
#[derive(Debug)]
pub struct GemBuffer {
    device: Arc<DrmDevice>,
    handle: drm::buffer::Handle,
    size: u64,
}

impl GemBuffer {
    /// `DRM_IOCTL_I915_GEM_CREATE` (system placement) or `DRM_IOCTL_I915_GEM_CREATE_EXT` with
    /// an `I915_GEM_CREATE_EXT_MEMORY_REGIONS` list of device memory then system memory, and
    /// `I915_GEM_CREATE_EXT_FLAG_NEEDS_CPU_ACCESS` so that small-BAR GPUs keep it mappable.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is 0 or not page-aligned;
    /// [`Error::Unsupported`] if `device`'s driver is not i915; [`Error::Os`] from the driver
    /// (e.g. `EINVAL` for device placement on an integrated GPU).
    pub fn i915(device: &Arc<DrmDevice>, size: u64, placement: Placement) -> Result<GemBuffer> {
        check_size(size)?;
        require_driver(device, "i915")?;
        let target = || device.path().display().to_string();
        let create = || match placement {
            Placement::System => {
                let mut arg = sys::drm_i915_gem_create {
                    size,
                    ..Default::default()
                };
                sys::i915_gem_create(&**device, &mut arg)
                    .map_err(|e| Error::os(Op::GemCreate, target(), e))?;
                handle(device, arg.handle)
            }
            Placement::Device => {
                use sys::{
                    drm_i915_gem_memory_class_I915_MEMORY_CLASS_DEVICE as DEVICE,
                    drm_i915_gem_memory_class_I915_MEMORY_CLASS_SYSTEM as SYSTEM,
                };
                let regions = [
                    sys::drm_i915_gem_memory_class_instance {
                        memory_class: DEVICE as u16,
                        memory_instance: 0,
                    },
                    sys::drm_i915_gem_memory_class_instance {
                        memory_class: SYSTEM as u16,
                        memory_instance: 0,
                    },
                ];
                let raw = sys::i915_gem_create_in_regions(
                    &**device,
                    size,
                    sys::I915_GEM_CREATE_EXT_FLAG_NEEDS_CPU_ACCESS,
                    &regions,
                )
                .map_err(|e| Error::os(Op::GemCreate, target(), e))?;
                handle(device, raw)
            }
        };
        GemBuffer::adopt(device, create, size)
    }

    /// `DRM_IOCTL_AMDGPU_GEM_CREATE` in the GTT domain (system) or the VRAM domain (device,
    /// with `AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a size that is 0 or not page-aligned;
    /// [`Error::Unsupported`] if `device`'s driver is not amdgpu; [`Error::Os`] from the driver.
    pub fn amdgpu(device: &Arc<DrmDevice>, size: u64, placement: Placement) -> Result<GemBuffer> {
        check_size(size)?;
        require_driver(device, "amdgpu")?;
        /// `AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED` (amdgpu_drm.h).
        const CPU_ACCESS_REQUIRED: u64 = 1;
        let (domains, flags) = match placement {
            Placement::System => (sys::AMDGPU_GEM_DOMAIN_GTT, 0),
            Placement::Device => (sys::AMDGPU_GEM_DOMAIN_VRAM, CPU_ACCESS_REQUIRED),
        };
        let mut arg = sys::drm_amdgpu_gem_create {
            in_: sys::drm_amdgpu_gem_create_in {
                bo_size: size,
                alignment: crate::page_size(),
                domains: u64::from(domains),
                domain_flags: flags,
            },
        };
        let create = || {
            sys::amdgpu_gem_create(&**device, &mut arg)
                .map_err(|e| Error::os(Op::GemCreate, device.path().display(), e))?;
            handle(device, sys::amdgpu_gem_create_out_handle(&arg))
        };
        GemBuffer::adopt(device, create, size)
    }

    /// xe needs `DRM_IOCTL_XE_GEM_CREATE` with a VM-less placement mask from a memory-region
    /// query; that uapi (kernel >= 6.8) is not in the headers this crate builds against, so
    /// this answers [`Error::Unsupported`].
    ///
    /// # Errors
    /// Always [`Error::Unsupported`].
    pub fn xe(device: &Arc<DrmDevice>, _size: u64, _placement: Placement) -> Result<GemBuffer> {
        Err(Error::Unsupported {
            op: Op::GemCreate,
            target: device.path().display().to_string(),
            why: "xe GEM allocation is not implemented (its uapi headers are not available to \
                  this build); export an xe buffer with Mesa/Level Zero and wrap the fd with \
                  DmaBuf::try_from"
                .into(),
        })
    }

    /// Runs the driver's create ioctl and becomes one owner of the handle it returns (see
    /// [`DrmDevice`] on shared handles).
    fn adopt(
        device: &Arc<DrmDevice>,
        create: impl FnOnce() -> Result<drm::buffer::Handle>,
        size: u64,
    ) -> Result<GemBuffer> {
        let handle = device.acquire_handle(create, |h| *h)?;
        Ok(GemBuffer {
            device: device.clone(),
            handle,
            size,
        })
    }

    /// The GEM handle.
    pub fn handle(&self) -> drm::buffer::Handle {
        self.handle
    }

    /// The requested size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// `DRM_IOCTL_PRIME_HANDLE_TO_FD`: the buffer as a dma-buf.
    ///
    /// # Errors
    /// [`Error::Os`] if the driver refuses the export.
    pub fn export(&self) -> Result<DmaBuf> {
        crate::prime::prime_export(&self.device, self.handle)
    }
}

impl Drop for GemBuffer {
    fn drop(&mut self) {
        // `DRM_IOCTL_GEM_CLOSE` once no other owner on this device file holds the handle.
        self.device.release_handle(self.handle);
    }
}

/// The handle a create ioctl returned. A successful create never returns handle 0; a driver
/// that did would be broken.
fn handle(device: &DrmDevice, raw: u32) -> Result<drm::buffer::Handle> {
    let handle = std::num::NonZeroU32::new(raw).ok_or_else(|| {
        Error::os(
            Op::GemCreate,
            device.path().display(),
            std::io::Error::from_raw_os_error(libc::EPROTO),
        )
    })?;
    Ok(drm::buffer::Handle::from(handle))
}

/// Refuses a device of another driver: the create ioctls are driver-specific numbers, which
/// another driver would read as commands of its own.
fn require_driver(device: &DrmDevice, driver: &str) -> Result<()> {
    if device.driver().name == driver {
        return Ok(());
    }
    Err(Error::Unsupported {
        op: Op::GemCreate,
        target: device.path().display().to_string(),
        why: format!(
            "driver is {}, not {driver}: use GpuBuffer::allocate, which picks the allocator",
            device.driver().name
        ),
    })
}

fn check_size(size: u64) -> Result<()> {
    if size == 0 || !size.is_multiple_of(crate::page_size()) {
        return Err(Error::invalid(
            Op::GemCreate,
            format!("size {size} must be a non-zero multiple of the page size"),
        ));
    }
    Ok(())
}

/// A GPU buffer from whichever allocator fits the device.
#[derive(Debug)]
pub enum GpuBuffer {
    /// A driver GEM object (i915, amdgpu).
    Gem(GemBuffer),
    /// A dumb buffer (any other KMS driver, vgem).
    Dumb(DumbBuffer),
}

impl GpuBuffer {
    /// Allocates `size` bytes on `device`, choosing the allocator from the driver's name:
    /// i915 and amdgpu GEM (honouring `placement`), xe (unsupported), else a dumb buffer
    /// (which needs the card node and ignores `placement`).
    ///
    /// # Errors
    /// The chosen allocator's.
    pub fn allocate(device: &Arc<DrmDevice>, size: u64, placement: Placement) -> Result<GpuBuffer> {
        match device.driver().name.as_str() {
            "i915" => GemBuffer::i915(device, size, placement).map(GpuBuffer::Gem),
            "amdgpu" => GemBuffer::amdgpu(device, size, placement).map(GpuBuffer::Gem),
            "xe" => GemBuffer::xe(device, size, placement).map(GpuBuffer::Gem),
            _ if device.kind() == NodeKind::Render => Err(Error::Unsupported {
                op: Op::CreateDumb,
                target: device.path().display().to_string(),
                why: format!(
                    "driver {} has no GEM allocator here and dumb buffers need the card node",
                    device.driver().name
                ),
            }),
            _ => DumbBuffer::new(device, size).map(GpuBuffer::Dumb),
        }
    }

    /// The buffer's size in bytes.
    pub fn size(&self) -> u64 {
        match self {
            GpuBuffer::Gem(b) => b.size(),
            GpuBuffer::Dumb(b) => b.size(),
        }
    }

    /// The buffer as a dma-buf.
    ///
    /// # Errors
    /// [`Error::Os`] if the driver refuses the export.
    pub fn export(&self) -> Result<DmaBuf> {
        match self {
            GpuBuffer::Gem(b) => b.export(),
            GpuBuffer::Dumb(b) => b.export(),
        }
    }

    /// The GEM handle.
    pub fn handle(&self) -> drm::buffer::Handle {
        match self {
            GpuBuffer::Gem(b) => b.handle(),
            GpuBuffer::Dumb(b) => b.handle(),
        }
    }
}
