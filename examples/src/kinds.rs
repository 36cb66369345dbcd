//! The kinds of memory a region can have: host memory, or a dma-buf from udmabuf, the system
//! dma-heap or the GPU (vgem in the testbed). Benchmarks register each kind the same way, so
//! that what a dma-buf costs against host memory is measured, not claimed.

use crate::gpu::{self, Where};
use drm_export::page_size;
use drm_export::{DmaBuf, DmaHeap, Udmabuf};
use rdma_dmabuf::{Access, HostBuffer, MemoryRegion, ProtectionDomain};
use std::sync::Arc;

/// What backs a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegionKind {
    /// Anonymous host memory (`ibv_reg_mr`).
    Host,
    /// Host memory exported through `/dev/udmabuf` (`ibv_reg_dmabuf_mr`).
    Udmabuf,
    /// The system dma-heap, `/dev/dma_heap/system` (`ibv_reg_dmabuf_mr`).
    SystemHeap,
    /// A GPU buffer exported with PRIME: i915, xe or amdgpu where there is one, else any DRM
    /// driver with dumb buffers (vgem in the testbed) (`ibv_reg_dmabuf_mr`).
    Gpu,
}

impl RegionKind {
    /// Every kind, host first.
    pub const ALL: [RegionKind; 4] = [
        RegionKind::Host,
        RegionKind::Udmabuf,
        RegionKind::SystemHeap,
        RegionKind::Gpu,
    ];

    /// The name options and reports use: `host`, `udmabuf`, `heap`, `gpu`.
    pub fn name(self) -> &'static str {
        match self {
            RegionKind::Host => "host",
            RegionKind::Udmabuf => "udmabuf",
            RegionKind::SystemHeap => "heap",
            RegionKind::Gpu => "gpu",
        }
    }
}

impl std::str::FromStr for RegionKind {
    type Err = String;
    fn from_str(s: &str) -> Result<RegionKind, String> {
        RegionKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("region kind {s:?}: host, udmabuf, heap or gpu"))
    }
}

/// Allocates buffers of one kind, each written once by the CPU so that every page exists
/// before registration (a registration then pins pages; it does not allocate them).
#[derive(Debug)]
pub struct Allocator {
    kind: RegionKind,
    heap: Option<DmaHeap>,
    /// The GPU's DRM node, found on first use and kept.
    gpu: std::cell::RefCell<Option<String>>,
}

impl Allocator {
    /// An allocator of `kind`.
    ///
    /// # Errors
    /// The system heap cannot be opened.
    pub fn new(kind: RegionKind) -> Result<Allocator, String> {
        let heap = match kind {
            RegionKind::SystemHeap => Some(DmaHeap::system().map_err(|e| e.to_string())?),
            _ => None,
        };
        Ok(Allocator {
            kind,
            heap,
            gpu: std::cell::RefCell::new(None),
        })
    }

    /// The kind it allocates.
    pub fn kind(&self) -> RegionKind {
        self.kind
    }

    /// A host buffer of `size` bytes (rounded up to the page size), every page written.
    ///
    /// # Errors
    /// The mapping fails.
    pub fn host(&self, size: usize) -> Result<HostBuffer, String> {
        let mut b = HostBuffer::new(size).map_err(|e| e.to_string())?;
        b.as_mut_slice().fill(0x5a);
        Ok(b)
    }

    /// A dma-buf of at least `size` bytes (rounded up to the page size) of this allocator's
    /// kind, every page written through its CPU mapping.
    ///
    /// # Errors
    /// The kind is [`RegionKind::Host`], or the exporter fails.
    pub fn dmabuf(&self, size: usize) -> Result<DmaBuf, String> {
        let len = (size.max(1) as u64).next_multiple_of(page_size());
        let mut buf = match self.kind {
            RegionKind::Host => return Err("host memory is not a dma-buf".into()),
            RegionKind::Udmabuf => Udmabuf::new(len).map_err(|e| e.to_string())?.into_parts().1,
            RegionKind::SystemHeap => self
                .heap
                .as_ref()
                .ok_or("no system heap")?
                .allocate(len)
                .map_err(|e| e.to_string())?,
            RegionKind::Gpu => {
                let path = self.gpu.borrow().clone();
                // The GEM handle closes when `alloc` drops; the dma-buf keeps the object.
                let (alloc, dmabuf) = gpu::allocate(path.as_deref(), len, Where::Auto)?;
                *self.gpu.borrow_mut() = Some(alloc.device.path().display().to_string());
                dmabuf
            }
        };
        buf.map()
            .and_then(|mut m| m.write().map(|mut w| w.fill(0x5a)))
            .map_err(|e| format!("writing the {} dma-buf: {e}", self.kind.name()))?;
        Ok(buf)
    }

    /// A registered host region of `size` bytes (only for [`RegionKind::Host`]).
    ///
    /// # Errors
    /// Allocation or registration fails.
    pub fn host_region(
        &self,
        pd: &Arc<ProtectionDomain>,
        size: usize,
        access: Access,
    ) -> Result<MemoryRegion<HostBuffer>, String> {
        MemoryRegion::register(pd, self.host(size)?, access).map_err(|e| e.to_string())
    }

    /// A registered dma-buf region of `size` bytes (from offset 0 of a buffer of this kind).
    ///
    /// # Errors
    /// Allocation or registration fails.
    pub fn dmabuf_region(
        &self,
        pd: &Arc<ProtectionDomain>,
        size: usize,
        access: Access,
    ) -> Result<MemoryRegion<DmaBuf>, String> {
        let buf = self.dmabuf(size)?;
        MemoryRegion::register_dmabuf(pd, buf, 0, size as u64, None, access)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_by_name() {
        for k in RegionKind::ALL {
            assert_eq!(k.name().parse::<RegionKind>(), Ok(k));
        }
        assert!("vram".parse::<RegionKind>().is_err());
    }
}
