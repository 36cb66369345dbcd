//! CUDA device memory as a dma-buf (feature `cuda`).
//!
//! `cuMemAlloc`, then `cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`
//! (CUDA >= 11.7 with NVIDIA's open kernel modules; the device must report
//! `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`). Address and size must be multiples of the host
//! page size. Sizes are rounded up to whole pages here. `cuMemAlloc` promises only an alignment
//! fit for any variable: on an H200 (driver 580) small allocations come 512 bytes apart, so a
//! page-sized one made after them can start mid-page. A [`CudaBuffer`] therefore allocates
//! one page more and starts at the first page boundary inside, so that its pages are all its
//! own. libcuda is loaded at run time: `libcuda.so.1`, or the library that the
//! environment variable `DRM_EXPORT_LIBCUDA` names ([`LIBCUDA_ENV`]).
//!
//! Memory the program already has, at any device pointer: [`range`]
//! ([`CudaDevice::export_range`]).
//!
//! The only module besides `sys` with `unsafe` blocks: the calls that take a device address
//! are `unsafe fn`s of `sys::cuda` (the driver checks no ownership), and [`CudaBuffer`], the
//! owner of one allocation, is where the ranges are known to be its own.

#![allow(unsafe_code)]

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
pub use crate::sys::cuda::LIBCUDA_ENV;
use crate::sys::cuda::{self, Ctx, CuDevice, CuDevicePtr, Driver};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

mod cover;
pub mod range;
pub use cover::PointerInfo;
pub use range::{CudaRange, RangeParts};

fn driver() -> Result<&'static Driver> {
    static DRIVER: OnceLock<std::result::Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| {
            let d = Driver::load()?;
            match d.init() {
                0 => Ok(d),
                r => Err(format!("cuInit failed: {}", d.error_name(r))),
            }
        })
        .as_ref()
        .map_err(|why| Error::Unsupported {
            op: Op::Cuda,
            target: "libcuda.so.1".into(),
            why: format!("{why} (is the NVIDIA driver installed?)"),
        })
}

fn cu_err(d: &Driver, what: &str, r: cuda::CuResult) -> Error {
    Error::Os {
        op: Op::Cuda,
        target: what.to_string(),
        source: std::io::Error::other(d.error_name(r)),
        hint: None,
    }
}

/// A CUDA device with its primary context retained.
#[derive(Debug)]
pub struct CudaDevice {
    dev: CuDevice,
    ctx: Ctx,
    ordinal: i32,
    /// Set by [`CudaDevice::assume_udmabuf_small_pages`].
    udmabuf_small_pages: AtomicBool,
}

impl CudaDevice {
    /// Opens GPU `ordinal` and checks that it can export dma-bufs.
    ///
    /// # Errors
    /// [`Error::Unsupported`] without libcuda or without dma-buf support (needs NVIDIA's open
    /// kernel modules and CUDA >= 11.7).
    pub fn open(ordinal: i32) -> Result<Arc<CudaDevice>> {
        let d = driver()?;
        let dev = d
            .device(ordinal)
            .map_err(|r| cu_err(d, &format!("cuDeviceGet({ordinal})"), r))?;
        let ok = d
            .attribute(cuda::ATTR_DMA_BUF_SUPPORTED, dev)
            .map_err(|r| cu_err(d, "cuDeviceGetAttribute", r))?;
        if ok == 0 {
            return Err(Error::Unsupported {
                op: Op::Cuda,
                target: format!("CUDA device {ordinal}"),
                why: "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: use NVIDIA's open kernel \
                      modules (nvidia.ko from open-gpu-kernel-modules) and CUDA >= 11.7"
                    .into(),
            });
        }
        let ctx = d
            .retain_and_bind(dev)
            .map_err(|r| cu_err(d, "cuDevicePrimaryCtxRetain", r))?;
        Ok(Arc::new(CudaDevice {
            dev,
            ctx,
            ordinal,
            udmabuf_small_pages: AtomicBool::new(false),
        }))
    }

    /// For a libcuda whose exports are udmabufs (a stand-in for testing without a GPU):
    /// records that every udmabuf this device exports from now on has small pages only, as
    /// [`DmaBuf::assume_udmabuf_small_pages`] records it for one buffer, so that its ranges
    /// can be registered on soft-RoCE where the kernel's udmabuf misplaces large pages (see
    /// that function), including by code that exports for itself (a registration cache). An
    /// NVIDIA driver's exports are not udmabufs: for them this changes nothing.
    ///
    /// # Safety
    /// Every udmabuf the driver exports for this device from now on pins small pages only
    /// (its memory comes from memfds that cannot have large pages), as
    /// [`DmaBuf::assume_udmabuf_small_pages`] requires of each.
    pub unsafe fn assume_udmabuf_small_pages(&self) {
        self.udmabuf_small_pages.store(true, Ordering::Relaxed);
    }

    /// The GPU's PCI address, `dddd:bb:dd.0` in lower-case hex as sysfs names it
    /// (`cuDeviceGetAttribute` of `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`, `_PCI_BUS_ID` and
    /// `_PCI_DEVICE_ID`; a CUDA device is function 0): where a topology library finds it
    /// under `/sys/bus/pci/devices`.
    ///
    /// # Errors
    /// [`Error::Os`] with [`Op::Cuda`] when the driver refuses an attribute.
    pub fn pci_address(&self) -> Result<String> {
        let d = driver()?;
        let mut parts = [0; 3];
        for (part, attr) in parts.iter_mut().zip([
            cuda::ATTR_PCI_DOMAIN_ID,
            cuda::ATTR_PCI_BUS_ID,
            cuda::ATTR_PCI_DEVICE_ID,
        ]) {
            *part = d.attribute(attr, self.dev).map_err(|r| {
                cu_err(
                    d,
                    &format!(
                        "cuDeviceGetAttribute({attr}) for the PCI address of CUDA device {}",
                        self.ordinal
                    ),
                    r,
                )
            })?;
        }
        let [domain, bus, device] = parts;
        Ok(format!("{domain:04x}:{bus:02x}:{device:02x}.0"))
    }

    fn bind(&self) -> Result<&'static Driver> {
        let d = driver()?;
        d.bind(&self.ctx)
            .map_err(|r| cu_err(d, "cuCtxSetCurrent", r))?;
        Ok(d)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Ok(d) = driver() {
            // SAFETY: this gives back the retain that `open` took for `self.dev` (whose `Ctx` is
            // `self.ctx`), once, as the device drops. Nothing binds `self.ctx` or uses memory of
            // the context afterwards: every `CudaBuffer` holds an `Arc` of its device, so all
            // of them, and their allocations, are gone before this runs.
            unsafe { d.release(self.dev) };
        }
    }
}

/// CUDA device memory; freed on drop.
#[derive(Debug)]
pub struct CudaBuffer {
    device: Arc<CudaDevice>,
    /// What `cuMemAlloc` returned, for `cuMemFree`: one page more than `size`.
    alloc: CuDevicePtr,
    /// The first page boundary at or after `alloc`: the buffer's start.
    ptr: CuDevicePtr,
    size: usize,
}

impl CudaBuffer {
    /// `size` bytes rounded up to the host page size, page-aligned: a `cuMemAlloc` of one
    /// page more, so that whole pages of it are the buffer's.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0 or one that overflows; [`Error::Os`] with the
    /// CUDA error name.
    pub fn new(device: &Arc<CudaDevice>, size: usize) -> Result<CudaBuffer> {
        if size == 0 {
            return Err(Error::invalid(Op::Cuda, "size 0"));
        }
        let page = crate::page_size() as usize;
        let Some(size) = size
            .checked_next_multiple_of(page)
            .filter(|s| s.checked_add(page).is_some())
        else {
            return Err(Error::invalid(Op::Cuda, "size overflows"));
        };
        let d = device.bind()?;
        let alloc = d
            .alloc(size + page)
            .map_err(|r| cu_err(d, "cuMemAlloc", r))?;
        Ok(CudaBuffer {
            device: device.clone(),
            alloc,
            ptr: alloc.next_multiple_of(page as u64),
            size,
        })
    }

    /// The size in bytes (a multiple of the page size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device address of the first byte (for [`CudaDevice::export_range`] of a part).
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// `cuMemsetD8` over the whole buffer.
    ///
    /// # Errors
    /// [`Error::Os`] with the CUDA error name.
    pub fn fill(&self, value: u8) -> Result<()> {
        let d = self.device.bind()?;
        // SAFETY: `[ptr, ptr + size)` lies in this buffer's own allocation (`cuMemAlloc` of
        // `size` + a page at `alloc` <= `ptr` < `alloc` + a page, in `new`, freed only by its
        // drop, which `&self` holds off), and `bind` just made its context current here.
        unsafe { d.memset(self.ptr, value, self.size) }.map_err(|r| cu_err(d, "cuMemsetD8", r))
    }

    /// `cuMemcpyHtoD` of `src` to the buffer's start.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `src` is longer than the buffer.
    pub fn copy_from_host(&self, src: &[u8]) -> Result<()> {
        if src.len() > self.size {
            return Err(Error::invalid(Op::Cuda, "source longer than the buffer"));
        }
        let d = self.device.bind()?;
        // SAFETY: `[ptr, ptr + src.len())` is inside this buffer's own allocation (`src.len()`
        // is at most `size`, checked above, and `[ptr, ptr + size)` lies in the allocation,
        // see `fill`; it lives until drop, which `&self` holds off), and `bind` just made its
        // context current on this thread.
        unsafe { d.copy_htod(self.ptr, src) }.map_err(|r| cu_err(d, "cuMemcpyHtoD", r))
    }

    /// `cuMemcpyDtoH` of the buffer's start into `dst`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `dst` is longer than the buffer.
    pub fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        if dst.len() > self.size {
            return Err(Error::invalid(
                Op::Cuda,
                "destination longer than the buffer",
            ));
        }
        let d = self.device.bind()?;
        // SAFETY: `[ptr, ptr + dst.len())` is inside this buffer's own allocation (`dst.len()`
        // is at most `size`, checked above, and `[ptr, ptr + size)` lies in the allocation,
        // see `fill`; it lives until drop, which `&self` holds off), and `bind` just made its
        // context current on this thread.
        unsafe { d.copy_dtoh(dst, self.ptr) }.map_err(|r| cu_err(d, "cuMemcpyDtoH", r))
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: the whole buffer as a dma-buf.
    ///
    /// # Errors
    /// [`Error::Os`] with the CUDA error name.
    pub fn export(&self) -> Result<DmaBuf> {
        let d = self.device.bind()?;
        // SAFETY: `[ptr, ptr + size)` is whole pages of this buffer's own allocation (see
        // `fill`), live while `&self` is, with its context bound just above; handing it to importers is what this
        // method is for. The dma-buf may outlive the buffer: NVIDIA's exporter takes its own
        // reference to the memory (nv-dmabuf.c duplicates the allocation's handles), so the
        // `cuMemFree` in drop does not free memory the dma-buf still names.
        let fd = unsafe { d.dmabuf_fd(self.ptr, self.size) }
            .map_err(|r| cu_err(d, "cuMemGetHandleForAddressRange", r))?;
        DmaBuf::try_from(fd)
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Ok(d) = self.device.bind() {
            // SAFETY: `alloc` is the allocation `new` made in this device's context, now bound;
            // this drop is its only free, and nothing uses it after. Exported dma-bufs hold
            // their own reference to the memory (see `export`).
            let r = unsafe { d.free(self.alloc) };
            if r != 0 {
                crate::diag::warn(format_args!("cuMemFree: {}", d.error_name(r)));
            }
        }
    }
}

// Built only with feature `gpu-tests`, so that the testbed, which runs every ignored test of
// the workspace, does not run this one (the integration tests' `cuda_pointers` runs the same
// calls there against a stand-in libcuda).
#[cfg(all(test, feature = "gpu-tests"))]
// Tests report what they allocated; they run in no drain or drop.
#[allow(clippy::print_stderr)]
mod tests {
    use super::*;

    /// Everything this module does, on GPU 0: allocation sizes, fills and copies (from this
    /// thread and another), the length checks, and an export of each buffer whose memory is
    /// then freed before its dma-buf is closed. Needs an NVIDIA GPU with dma-buf support:
    /// `cargo test -p drm-export --features cuda,gpu-tests -- --ignored cuda_`.
    #[test]
    #[ignore = "needs an NVIDIA GPU with libcuda and dma-buf support"]
    fn cuda_buffers_fill_copy_and_export() {
        let dev = CudaDevice::open(0).expect("CUDA device 0");
        let page = crate::page_size() as usize;
        assert!(matches!(
            CudaBuffer::new(&dev, 0),
            Err(Error::InvalidArgument { .. })
        ));
        let bufs = [
            CudaBuffer::new(&dev, 1).unwrap(),
            CudaBuffer::new(&dev, 3 * page + 1).unwrap(),
            CudaBuffer::new(&dev, 4 << 20).unwrap(),
        ];
        assert_eq!(bufs[0].size(), page);
        assert_eq!(bufs[1].size(), 4 * page);
        assert_eq!(bufs[2].size(), 4 << 20);
        for buf in &bufs {
            eprintln!("cuMemAlloc({}) = {:#x}", buf.size(), buf.ptr);
            assert_eq!(buf.ptr % page as u64, 0, "not page-aligned: {:#x}", buf.ptr);
            // The context is bound per thread: fill from another one.
            std::thread::scope(|s| s.spawn(|| buf.fill(0xab).unwrap()).join().unwrap());
            let mut out = vec![0; buf.size()];
            buf.copy_to_host(&mut out).unwrap();
            assert!(out.iter().all(|&b| b == 0xab));
            let pattern: Vec<u8> = (0..buf.size()).map(|i| (i % 251) as u8).collect();
            buf.copy_from_host(&pattern).unwrap();
            buf.copy_to_host(&mut out).unwrap();
            assert_eq!(out, pattern);
            buf.copy_from_host(&[1, 2, 3]).unwrap();
            let mut head = [0; 5];
            buf.copy_to_host(&mut head).unwrap();
            assert_eq!(head, [1, 2, 3, pattern[3], pattern[4]]);
            let long = vec![0; buf.size() + 1];
            assert!(matches!(
                buf.copy_from_host(&long),
                Err(Error::InvalidArgument { .. })
            ));
            assert!(matches!(
                buf.copy_to_host(&mut long.clone()),
                Err(Error::InvalidArgument { .. })
            ));
        }
        let mut exported = Vec::new();
        for buf in &bufs {
            let d = buf.export().expect("export");
            eprintln!("dma-buf of {} bytes, exporter {}", d.size(), d.exporter());
            assert_eq!(d.size(), buf.size() as u64);
            exported.push(d);
        }
        // cuMemFree first; each dma-buf holds its own reference to the memory.
        drop(bufs);
        drop(dev);
        drop(exported);
    }
}
