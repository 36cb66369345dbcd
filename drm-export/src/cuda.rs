//! CUDA device memory as a dma-buf (feature `cuda`).
//!
//! `cuMemAlloc`, then `cuMemGetHandleForAddressRange(.., CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD)`
//! (CUDA >= 11.7 with NVIDIA's open kernel modules; the device must report
//! `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`). Address and size must be multiples of the host
//! page size: sizes are rounded up, and `cuMemAlloc`'s addresses are at least 2 MiB aligned.
//! libcuda is loaded at run time.

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys::cuda::{self, Ctx, CuDevice, CuDevicePtr, Driver};
use std::sync::{Arc, OnceLock};

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
        Ok(Arc::new(CudaDevice { dev, ctx }))
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
            d.release(self.dev);
        }
    }
}

/// CUDA device memory; freed on drop.
#[derive(Debug)]
pub struct CudaBuffer {
    device: Arc<CudaDevice>,
    ptr: CuDevicePtr,
    size: usize,
}

impl CudaBuffer {
    /// `cuMemAlloc` of `size` bytes rounded up to the host page size.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0; [`Error::Os`] with the CUDA error name.
    pub fn new(device: &Arc<CudaDevice>, size: usize) -> Result<CudaBuffer> {
        if size == 0 {
            return Err(Error::invalid(Op::Cuda, "size 0"));
        }
        let page = crate::udmabuf::page_size() as usize;
        let size = size.div_ceil(page) * page;
        let d = device.bind()?;
        let ptr = d.alloc(size).map_err(|r| cu_err(d, "cuMemAlloc", r))?;
        Ok(CudaBuffer {
            device: device.clone(),
            ptr,
            size,
        })
    }

    /// The size in bytes (a multiple of the page size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// `cuMemsetD8` over the whole buffer.
    ///
    /// # Errors
    /// [`Error::Os`] with the CUDA error name.
    pub fn fill(&self, value: u8) -> Result<()> {
        let d = self.device.bind()?;
        d.memset(self.ptr, value, self.size)
            .map_err(|r| cu_err(d, "cuMemsetD8", r))
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
        d.copy_htod(self.ptr, src)
            .map_err(|r| cu_err(d, "cuMemcpyHtoD", r))
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
        d.copy_dtoh(dst, self.ptr)
            .map_err(|r| cu_err(d, "cuMemcpyDtoH", r))
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: the whole buffer as a dma-buf.
    ///
    /// # Errors
    /// [`Error::Os`] with the CUDA error name.
    pub fn export(&self) -> Result<DmaBuf> {
        let d = self.device.bind()?;
        let fd = d
            .dmabuf_fd(self.ptr, self.size)
            .map_err(|r| cu_err(d, "cuMemGetHandleForAddressRange", r))?;
        DmaBuf::try_from(cuda::owned_fd(fd))
    }
}

impl Drop for CudaBuffer {
    fn drop(&mut self) {
        if let Ok(d) = self.device.bind() {
            let r = d.free(self.ptr);
            if r != 0 {
                eprintln!("drm-export: cuMemFree: {}", d.error_name(r));
            }
        }
    }
}
