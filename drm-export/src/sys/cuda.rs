//! The CUDA driver API, loaded at run time from `libcuda.so.1` (nothing is needed to build).

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUcontext`.
pub type CuContext = *mut c_void;

/// A retained primary context, as an opaque handle that may cross threads.
#[derive(Debug)]
pub struct Ctx(CuContext);

// SAFETY: a CUDA context handle is an opaque driver object that may be made current on any
// thread (every use binds it first with cuCtxSetCurrent); the driver API is thread-safe.
unsafe impl Send for Ctx {}
// SAFETY: as above.
unsafe impl Sync for Ctx {}

/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
pub const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// Entry points of libcuda used here (names as exported, with their `_v2` suffixes).
pub struct Driver {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memset_d8: unsafe extern "C" fn(CuDevicePtr, u8, usize) -> CuResult,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    get_handle:
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, c_int, c_ulonglong) -> CuResult,
    error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: the symbol is the CUDA driver API's, whose C signature (cuda.h) is the
        // function-pointer type of the field this initialises.
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| e.to_string())?
    };
}

impl Driver {
    /// Loads libcuda and resolves the entry points.
    pub fn load() -> Result<Driver, String> {
        // SAFETY: loading libcuda runs its initialisers, which have no preconditions.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.map_err(|e| e.to_string())?;
        Ok(Driver {
            init: sym!(lib, "cuInit"),
            device_get: sym!(lib, "cuDeviceGet"),
            device_get_attribute: sym!(lib, "cuDeviceGetAttribute"),
            primary_ctx_retain: sym!(lib, "cuDevicePrimaryCtxRetain"),
            primary_ctx_release: sym!(lib, "cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: sym!(lib, "cuCtxSetCurrent"),
            mem_alloc: sym!(lib, "cuMemAlloc_v2"),
            mem_free: sym!(lib, "cuMemFree_v2"),
            memset_d8: sym!(lib, "cuMemsetD8_v2"),
            memcpy_dtoh: sym!(lib, "cuMemcpyDtoH_v2"),
            memcpy_htod: sym!(lib, "cuMemcpyHtoD_v2"),
            get_handle: sym!(lib, "cuMemGetHandleForAddressRange"),
            error_name: sym!(lib, "cuGetErrorName"),
            _lib: lib,
        })
    }

    /// `cuGetErrorName`.
    pub fn error_name(&self, r: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out-pointer; on success it points to a static C string.
        if unsafe { (self.error_name)(r, &mut p) } == 0 && !p.is_null() {
            // SAFETY: libcuda returns a NUL-terminated string with static lifetime.
            return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        }
        format!("CUresult {r}")
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> CuResult {
        // SAFETY: no pointer arguments.
        unsafe { (self.init)(0) }
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: c_int) -> Result<CuDevice, CuResult> {
        let mut d = 0;
        // SAFETY: `d` is a valid out-pointer.
        check(unsafe { (self.device_get)(&mut d, ordinal) }).map(|()| d)
    }

    /// `cuDeviceGetAttribute`.
    pub fn attribute(&self, attr: c_int, dev: CuDevice) -> Result<c_int, CuResult> {
        let mut v = 0;
        // SAFETY: `v` is a valid out-pointer.
        check(unsafe { (self.device_get_attribute)(&mut v, attr, dev) }).map(|()| v)
    }

    /// `cuDevicePrimaryCtxRetain` then `cuCtxSetCurrent` on this thread.
    pub fn retain_and_bind(&self, dev: CuDevice) -> Result<Ctx, CuResult> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `ctx` is a valid out-pointer.
        check(unsafe { (self.primary_ctx_retain)(&mut ctx, dev) })?;
        let ctx = Ctx(ctx);
        self.bind(&ctx).map(|()| ctx)
    }

    /// `cuCtxSetCurrent`.
    pub fn bind(&self, ctx: &Ctx) -> Result<(), CuResult> {
        // SAFETY: `ctx` came from cuDevicePrimaryCtxRetain and is retained by the caller.
        check(unsafe { (self.ctx_set_current)(ctx.0) })
    }

    /// `cuDevicePrimaryCtxRelease`.
    pub fn release(&self, dev: CuDevice) -> CuResult {
        // SAFETY: balances one retain by the caller.
        unsafe { (self.primary_ctx_release)(dev) }
    }

    /// `cuMemAlloc` (context bound by the caller).
    pub fn alloc(&self, size: usize) -> Result<CuDevicePtr, CuResult> {
        let mut p = 0;
        // SAFETY: `p` is a valid out-pointer.
        check(unsafe { (self.mem_alloc)(&mut p, size) }).map(|()| p)
    }

    /// `cuMemFree`.
    pub fn free(&self, p: CuDevicePtr) -> CuResult {
        // SAFETY: `p` came from `alloc` and is freed once (the owner's Drop).
        unsafe { (self.mem_free)(p) }
    }

    /// `cuMemsetD8`.
    pub fn memset(&self, p: CuDevicePtr, v: u8, n: usize) -> Result<(), CuResult> {
        // SAFETY: device pointers are checked by the driver, which fails on a bad range.
        check(unsafe { (self.memset_d8)(p, v, n) })
    }

    /// `cuMemcpyDtoH` into `dst`.
    pub fn copy_dtoh(&self, dst: &mut [u8], src: CuDevicePtr) -> Result<(), CuResult> {
        // SAFETY: `dst` is a live, writable host slice of exactly the length copied.
        check(unsafe { (self.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    /// `cuMemcpyHtoD` from `src`.
    pub fn copy_htod(&self, dst: CuDevicePtr, src: &[u8]) -> Result<(), CuResult> {
        // SAFETY: `src` is a live host slice of exactly the length copied.
        check(unsafe { (self.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) })
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a new dma-buf fd for the range.
    pub fn dmabuf_fd(&self, p: CuDevicePtr, size: usize) -> Result<c_int, CuResult> {
        let mut fd: c_int = -1;
        // SAFETY: for the DMA_BUF_FD handle type the handle out-parameter is an `int`.
        check(unsafe {
            (self.get_handle)(
                (&mut fd as *mut c_int).cast(),
                p,
                size,
                HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })
        .map(|()| fd)
    }
}

fn check(r: CuResult) -> Result<(), CuResult> {
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}

/// Wraps an fd libcuda just returned.
pub fn owned_fd(fd: c_int) -> std::os::fd::OwnedFd {
    super::owned_fd(fd)
}
