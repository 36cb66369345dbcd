//! The CUDA driver API, loaded at run time from `libcuda.so.1`, or from the file that
//! [`LIBCUDA_ENV`] names (nothing is needed to build).
//!
//! Device memory is named by bare addresses (`CUdeviceptr`), and the driver does not check
//! who owns an address: it accepts any range it has mapped, another allocation's or, under
//! unified addressing, pinned host memory of this process. So every call that takes a device
//! address is an `unsafe fn` whose caller vouches for the range (`crate::cuda`, whose
//! `CudaBuffer` owns one allocation). Signatures are cuda.h's, for 64-bit Linux.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr};
use std::os::fd::OwnedFd;

/// `CUresult`.
pub type CuResult = c_int;
/// `CUdevice`.
pub type CuDevice = c_int;
/// `CUdeviceptr`.
pub type CuDevicePtr = u64;
/// `CUcontext`.
pub type CuContext = *mut c_void;

/// A retained primary context, as an opaque handle that may cross threads. Made only by
/// [`Driver::retain_and_bind`]; the retain is given back by [`Driver::release`].
#[derive(Debug)]
pub struct Ctx(CuContext);

// SAFETY: `Ctx` holds only the context's handle, which Rust never dereferences. The driver API
// takes a context handle from any thread (`cuCtxSetCurrent` binds it to the calling thread,
// and a context may be current on several threads at once), and its entry points are
// thread-safe.
unsafe impl Send for Ctx {}
// SAFETY: `&Ctx` only lends the handle to `Driver::bind`, which any thread may call, as above.
unsafe impl Sync for Ctx {}

/// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
pub const ATTR_DMA_BUF_SUPPORTED: c_int = 124;
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID`.
pub const ATTR_PCI_BUS_ID: c_int = 33;
/// `CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID` (the device number on its bus).
pub const ATTR_PCI_DEVICE_ID: c_int = 34;
/// `CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID`.
pub const ATTR_PCI_DOMAIN_ID: c_int = 50;
/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
pub const HANDLE_TYPE_DMA_BUF_FD: c_int = 1;

/// The environment variable that names the library to load in place of `libcuda.so.1`: a
/// path (or another soname) of a library with the same entry points, e.g. a test stand-in.
/// Read once, when the first CUDA call of the process loads the driver.
pub const LIBCUDA_ENV: &str = "DRM_EXPORT_LIBCUDA";

/// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (an `unsigned int`, a `CUmemorytype`).
pub const PTR_MEMORY_TYPE: c_int = 2;
/// `CU_POINTER_ATTRIBUTE_BUFFER_ID` (an `unsigned long long`, unique per allocation for the
/// life of the process).
pub const PTR_BUFFER_ID: c_int = 7;
/// `CU_POINTER_ATTRIBUTE_IS_MANAGED` (an `unsigned int`, a boolean).
pub const PTR_IS_MANAGED: c_int = 8;
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (an `int`).
pub const PTR_DEVICE_ORDINAL: c_int = 9;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR` (a `CUdeviceptr`): for `cuMemMap`ped memory,
/// where the `cuMemAddressReserve`d range holding the pointer starts (seen on an H200,
/// driver 580).
pub const PTR_RANGE_START_ADDR: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE` (a `size_t`): that range's size.
pub const PTR_RANGE_SIZE: c_int = 12;
/// `CU_POINTER_ATTRIBUTE_MAPPING_SIZE` (a `size_t`: the size of the physical mapping that
/// holds the pointer; CUDA >= 11.7).
pub const PTR_MAPPING_SIZE: c_int = 18;
/// `CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR` (a `CUdeviceptr`: where that mapping starts).
pub const PTR_MAPPING_BASE_ADDR: c_int = 19;
/// `CU_MEMORYTYPE_HOST`.
pub const MEMORYTYPE_HOST: u32 = 1;
/// `CU_MEMORYTYPE_DEVICE`.
pub const MEMORYTYPE_DEVICE: u32 = 2;

/// Entry points of libcuda used here (names as exported, with their `_v2` suffixes).
pub struct Driver {
    /// Keeps libcuda loaded while the function pointers below may be called.
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
    address_range: unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    pointer_attribute: unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult,
    retain_allocation_handle: unsafe extern "C" fn(*mut c_ulonglong, *mut c_void) -> CuResult,
    mem_release: unsafe extern "C" fn(c_ulonglong) -> CuResult,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: `get` asks that the type be the symbol's: `$name` is a CUDA driver API entry
        // point, and the field this initialises has its C signature from cuda.h. The pointer
        // is copied out of the `Symbol` and stays valid as long as the library stays loaded,
        // which the `Driver` it is stored in ensures (its `_lib`).
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| e.to_string())?
    };
}

impl Driver {
    /// Loads libcuda (or the library [`LIBCUDA_ENV`] names) and resolves the entry points.
    pub fn load() -> Result<Driver, String> {
        let name = std::env::var_os(LIBCUDA_ENV).unwrap_or_else(|| "libcuda.so.1".into());
        // SAFETY: loading runs the library's initialisers. libcuda.so.1 is the NVIDIA driver's
        // user-space library, loaded by its soname as every CUDA program loads it; its
        // initialisers set up its own state and ask nothing of the loading program. A library
        // named by LIBCUDA_ENV is one the user chose to stand for it, with the same contract.
        let lib = unsafe { libloading::Library::new(&name) }
            .map_err(|e| format!("{}: {e}", name.to_string_lossy()))?;
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
            address_range: sym!(lib, "cuMemGetAddressRange_v2"),
            pointer_attribute: sym!(lib, "cuPointerGetAttribute"),
            retain_allocation_handle: sym!(lib, "cuMemRetainAllocationHandle"),
            mem_release: sym!(lib, "cuMemRelease"),
            _lib: lib,
        })
    }

    /// `cuGetErrorName`.
    pub fn error_name(&self, r: CuResult) -> String {
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `&mut p` is a live out-pointer for one `const char *`; any `r` is accepted
        // (an unknown one gets CUDA_ERROR_INVALID_VALUE and a null string).
        if unsafe { (self.error_name)(r, &mut p) } == 0 && !p.is_null() {
            // SAFETY: on success `p` points to a NUL-terminated string in libcuda's static
            // data, valid while libcuda stays loaded (as long as `self`); it is copied at once.
            return unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        }
        format!("CUresult {r}")
    }

    /// `cuInit(0)`.
    pub fn init(&self) -> CuResult {
        // SAFETY: cuInit takes no pointer; its only argument, the flags, must be 0, as here.
        unsafe { (self.init)(0) }
    }

    /// `cuDeviceGet`.
    pub fn device(&self, ordinal: c_int) -> Result<CuDevice, CuResult> {
        let mut d = 0;
        // SAFETY: `&mut d` is a live out-pointer for one `CUdevice`; a bad ordinal is refused
        // (CUDA_ERROR_INVALID_DEVICE).
        check(unsafe { (self.device_get)(&mut d, ordinal) }).map(|()| d)
    }

    /// `cuDeviceGetAttribute`.
    pub fn attribute(&self, attr: c_int, dev: CuDevice) -> Result<c_int, CuResult> {
        let mut v = 0;
        // SAFETY: `&mut v` is a live out-pointer for one `int`; a bad attribute or device is
        // refused (CUDA_ERROR_INVALID_VALUE / _DEVICE).
        check(unsafe { (self.device_get_attribute)(&mut v, attr, dev) }).map(|()| v)
    }

    /// `cuDevicePrimaryCtxRetain` then `cuCtxSetCurrent` on this thread.
    pub fn retain_and_bind(&self, dev: CuDevice) -> Result<Ctx, CuResult> {
        let mut ctx = std::ptr::null_mut();
        // SAFETY: `&mut ctx` is a live out-pointer for one `CUcontext`; a bad device is refused.
        check(unsafe { (self.primary_ctx_retain)(&mut ctx, dev) })?;
        let ctx = Ctx(ctx);
        self.bind(&ctx).map(|()| ctx)
    }

    /// `cuCtxSetCurrent`.
    pub fn bind(&self, ctx: &Ctx) -> Result<(), CuResult> {
        // SAFETY: a `Ctx` is made only by `retain_and_bind`, from a successful retain, and
        // `release`, the only way to give that retain back, forbids binding the `Ctx`
        // afterwards: `ctx.0` is a live primary context.
        check(unsafe { (self.ctx_set_current)(ctx.0) })
    }

    /// `cuDevicePrimaryCtxRelease`.
    ///
    /// # Safety
    /// Gives back one retain of `dev`'s primary context that the caller took with
    /// [`Driver::retain_and_bind`]. The caller binds the `Ctx` of that retain no more, and
    /// uses no memory it allocated in the context afterwards: the last release destroys the
    /// context and frees everything allocated in it.
    pub unsafe fn release(&self, dev: CuDevice) -> CuResult {
        // SAFETY: no pointer argument; this balances a retain of the caller's, as its contract
        // says, so no one's context is destroyed under them.
        unsafe { (self.primary_ctx_release)(dev) }
    }

    /// `cuMemAlloc` (context bound by the caller).
    pub fn alloc(&self, size: usize) -> Result<CuDevicePtr, CuResult> {
        let mut p = 0;
        // SAFETY: `&mut p` is a live out-pointer for one `CUdeviceptr`; the new allocation
        // belongs to no one yet (the caller owns it from here).
        check(unsafe { (self.mem_alloc)(&mut p, size) }).map(|()| p)
    }

    /// `cuMemFree`.
    ///
    /// # Safety
    /// `p` is an address that [`Driver::alloc`] returned, not freed since, and the caller owns
    /// that allocation; the context it was made in is bound on this thread. Nothing uses `p`
    /// afterwards: the driver may give the same addresses to the next allocation. (A dma-buf
    /// exported from the range keeps its memory: NVIDIA's exporter holds its own reference.)
    pub unsafe fn free(&self, p: CuDevicePtr) -> CuResult {
        // SAFETY: `p` is a live allocation of the caller's, freed once, with its context bound,
        // as this function's contract requires.
        unsafe { (self.mem_free)(p) }
    }

    /// `cuMemsetD8`: sets `n` bytes from `p` to `v`.
    ///
    /// # Safety
    /// `[p, p + n)` lies inside one live allocation from [`Driver::alloc`] that the caller
    /// owns, and its context is bound on this thread. The driver does not check this: it
    /// writes any range it has mapped, including another allocation or pinned host memory.
    pub unsafe fn memset(&self, p: CuDevicePtr, v: u8, n: usize) -> Result<(), CuResult> {
        // SAFETY: the caller vouches that `[p, p + n)` is memory it owns in the bound context
        // (this function's contract); no host pointer is passed.
        check(unsafe { (self.memset_d8)(p, v, n) })
    }

    /// `cuMemcpyDtoH` of `dst.len()` bytes from `src` into `dst`.
    ///
    /// # Safety
    /// `[src, src + dst.len())` lies inside one live allocation from [`Driver::alloc`] that the
    /// caller owns, and its context is bound on this thread (the driver reads any range it has
    /// mapped, pinned host memory of this process included).
    pub unsafe fn copy_dtoh(&self, dst: &mut [u8], src: CuDevicePtr) -> Result<(), CuResult> {
        // SAFETY: `dst` is a live, writable host slice of exactly the length copied, borrowed
        // mutably so nothing else reads or writes it meanwhile; the source range is the
        // caller's (this function's contract). The copy is synchronous: it is done on return.
        check(unsafe { (self.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len()) })
    }

    /// `cuMemcpyHtoD` of `src` to `dst`.
    ///
    /// # Safety
    /// `[dst, dst + src.len())` lies inside one live allocation from [`Driver::alloc`] that the
    /// caller owns, and its context is bound on this thread (the driver writes any range it
    /// has mapped, another allocation or pinned host memory included).
    pub unsafe fn copy_htod(&self, dst: CuDevicePtr, src: &[u8]) -> Result<(), CuResult> {
        // SAFETY: `src` is a live host slice of exactly the length copied; the destination range
        // is the caller's (this function's contract). The copy is synchronous: `src` is no
        // longer read on return.
        check(unsafe { (self.memcpy_htod)(dst, src.as_ptr().cast(), src.len()) })
    }

    /// `cuMemGetHandleForAddressRange(DMA_BUF_FD)`: a new dma-buf fd for the range.
    ///
    /// # Safety
    /// `[p, p + size)` lies inside one live allocation from [`Driver::alloc`] that the caller
    /// owns, or covers device memory (neither host nor managed, as the pointer attributes
    /// tell) that the caller was asked to export; its context is bound on this thread. The
    /// dma-buf lets whoever imports it (a
    /// NIC, a GPU) read and write the range by DMA for as long as it is open, so the range
    /// must be memory that the caller may hand out.
    pub unsafe fn dmabuf_fd(&self, p: CuDevicePtr, size: usize) -> Result<OwnedFd, CuResult> {
        let mut fd: c_int = -1;
        // SAFETY: for CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD the handle out-parameter is an
        // `int` (cuda.h), and `fd` is a live one; flags must be 0, as here; the range is the
        // caller's (this function's contract).
        check(unsafe {
            (self.get_handle)(
                (&mut fd as *mut c_int).cast(),
                p,
                size,
                HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        // SAFETY: the call succeeded, so libcuda has stored in `fd` the dma-buf fd that the
        // NVIDIA kernel module has just created for it, which the caller owns and must close
        // (cuda.h); nothing else has seen it.
        Ok(unsafe { super::owned(fd) })
    }
}

impl Driver {
    /// `cuMemGetAddressRange`: the base and size of the allocation holding `p`. Only reads the
    /// driver's tables: any address may be asked about.
    pub fn address_range(&self, p: CuDevicePtr) -> Result<(CuDevicePtr, usize), CuResult> {
        let (mut base, mut size) = (0, 0);
        // SAFETY: both out-pointers are live locals of the right types (`CUdeviceptr`,
        // `size_t`); the driver only looks `p` up, it does not access the memory.
        check(unsafe { (self.address_range)(&mut base, &mut size, p) }).map(|()| (base, size))
    }

    /// Whether `p` is in virtual memory mapped with `cuMemMap` (a physical allocation of
    /// `cuMemCreate`): `cuMemRetainAllocationHandle` succeeds only there. The handle it
    /// retains is released at once. Only reads the driver's tables: any address may be asked
    /// about.
    pub fn is_mapped(&self, p: CuDevicePtr) -> bool {
        let mut handle: c_ulonglong = 0;
        // SAFETY: `handle` is a live out-pointer for a `CUmemGenericAllocationHandle` (an
        // `unsigned long long`); the address is only looked up, never dereferenced.
        if unsafe { (self.retain_allocation_handle)(&mut handle, p as *mut c_void) } != 0 {
            return false;
        }
        // SAFETY: gives back the one reference the retain above took on `handle`; the
        // physical allocation stays mapped (the mapping holds its own reference).
        unsafe { (self.mem_release)(handle) };
        true
    }

    /// `cuPointerGetAttribute` of an attribute whose value is a `u64` (`unsigned long long`,
    /// `size_t` or `CUdeviceptr` on 64-bit Linux): [`PTR_BUFFER_ID`], [`PTR_MAPPING_SIZE`],
    /// [`PTR_MAPPING_BASE_ADDR`], [`PTR_RANGE_START_ADDR`], [`PTR_RANGE_SIZE`].
    pub fn pointer_u64(&self, attr: c_int, p: CuDevicePtr) -> Result<u64, CuResult> {
        debug_assert!(matches!(
            attr,
            PTR_BUFFER_ID
                | PTR_MAPPING_SIZE
                | PTR_MAPPING_BASE_ADDR
                | PTR_RANGE_START_ADDR
                | PTR_RANGE_SIZE
        ));
        let mut v: u64 = 0;
        // SAFETY: for the attributes above the driver writes 8 bytes, and `v` is a live u64;
        // it only looks `p` up.
        check(unsafe { (self.pointer_attribute)((&mut v as *mut u64).cast(), attr, p) }).map(|()| v)
    }

    /// `cuPointerGetAttribute` of an attribute whose value is 4 bytes (`unsigned int` or
    /// `int`): [`PTR_MEMORY_TYPE`], [`PTR_IS_MANAGED`], [`PTR_DEVICE_ORDINAL`].
    pub fn pointer_u32(&self, attr: c_int, p: CuDevicePtr) -> Result<u32, CuResult> {
        debug_assert!(matches!(
            attr,
            PTR_MEMORY_TYPE | PTR_IS_MANAGED | PTR_DEVICE_ORDINAL
        ));
        let mut v: u32 = 0;
        // SAFETY: for the attributes above the driver writes 4 bytes, and `v` is a live u32;
        // it only looks `p` up.
        check(unsafe { (self.pointer_attribute)((&mut v as *mut u32).cast(), attr, p) }).map(|()| v)
    }
}

fn check(r: CuResult) -> Result<(), CuResult> {
    if r == 0 {
        Ok(())
    } else {
        Err(r)
    }
}
