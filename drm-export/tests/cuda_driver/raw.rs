//! The libcuda entry points these tests use to make memory of every kind that users already
//! have (page-locked host memory, managed memory, `cuMemCreate` + `cuMemMap` mappings,
//! stream-ordered pool memory), which drm-export itself never allocates. Loaded from the same
//! `libcuda.so.1` drm-export loads; every call runs on a thread where drm-export's
//! `CudaDevice::open` made the device's primary context current.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

type R = c_int;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Location {
    kind: c_int,
    id: c_int,
}

/// `CUmemAllocationProp` (64-bit Linux layout).
#[repr(C)]
pub struct Prop {
    kind: c_int,
    handle_types: c_int,
    location: Location,
    win32: *mut c_void,
    compression: u8,
    gpu_direct_rdma: u8,
    usage: u16,
    reserved: [u8; 4],
}

/// `CUmemAccessDesc`.
#[repr(C)]
struct AccessDesc {
    location: Location,
    flags: c_int,
}

const LOCATION_DEVICE: c_int = 1;
const ALLOCATION_PINNED: c_int = 1;
const HANDLE_POSIX_FD: c_int = 1;
const ACCESS_READ_WRITE: c_int = 3;
/// `CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID`: the physical allocation a pointer is in.
pub const PTR_MEMORY_BLOCK_ID: c_int = 20;
/// `CU_POINTER_ATTRIBUTE_BUFFER_ID`.
pub const PTR_BUFFER_ID: c_int = 7;
/// `CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`.
pub const PTR_RANGE_START: c_int = 11;
/// `CU_POINTER_ATTRIBUTE_RANGE_SIZE`.
pub const PTR_RANGE_SIZE: c_int = 12;
/// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`.
pub const ATTR_RDMA_WITH_VMM: c_int = 116;

/// The entry points.
pub struct Raw {
    _lib: libloading::Library,
    alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
    free: unsafe extern "C" fn(u64) -> R,
    alloc_host: unsafe extern "C" fn(*mut *mut c_void, usize) -> R,
    free_host: unsafe extern "C" fn(*mut c_void) -> R,
    alloc_managed: unsafe extern "C" fn(*mut u64, usize, c_uint) -> R,
    alloc_async: unsafe extern "C" fn(*mut u64, usize, *mut c_void) -> R,
    free_async: unsafe extern "C" fn(u64, *mut c_void) -> R,
    stream_sync: unsafe extern "C" fn(*mut c_void) -> R,
    granularity: unsafe extern "C" fn(*mut usize, *const Prop, c_int) -> R,
    create: unsafe extern "C" fn(*mut c_ulonglong, usize, *const Prop, c_ulonglong) -> R,
    release: unsafe extern "C" fn(c_ulonglong) -> R,
    reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, c_ulonglong) -> R,
    address_free: unsafe extern "C" fn(u64, usize) -> R,
    map: unsafe extern "C" fn(u64, usize, usize, c_ulonglong, c_ulonglong) -> R,
    unmap: unsafe extern "C" fn(u64, usize) -> R,
    set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> R,
    attribute: unsafe extern "C" fn(*mut c_void, c_int, u64) -> R,
    device_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> R,
    handle_for_range: unsafe extern "C" fn(*mut c_void, u64, usize, c_int, c_ulonglong) -> R,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {
        // SAFETY: `$name` is a CUDA driver API entry point and the field it initialises has
        // its C signature from cuda.h; the `Raw` keeps the library loaded.
        *unsafe { $lib.get(concat!($name, "\0").as_bytes()) }.expect($name)
    };
}

fn ok(what: &str, r: R) {
    assert_eq!(r, 0, "{what} failed with CUresult {r}");
}

impl Raw {
    /// Loads libcuda.
    ///
    /// # Panics
    /// Without it.
    pub fn load() -> Raw {
        // SAFETY: the NVIDIA driver's library, already loaded by drm-export; loading it again
        // only takes another reference.
        let lib = unsafe { libloading::Library::new("libcuda.so.1") }.expect("libcuda.so.1");
        Raw {
            alloc: sym!(lib, "cuMemAlloc_v2"),
            free: sym!(lib, "cuMemFree_v2"),
            alloc_host: sym!(lib, "cuMemAllocHost_v2"),
            free_host: sym!(lib, "cuMemFreeHost"),
            alloc_managed: sym!(lib, "cuMemAllocManaged"),
            alloc_async: sym!(lib, "cuMemAllocAsync"),
            free_async: sym!(lib, "cuMemFreeAsync"),
            stream_sync: sym!(lib, "cuStreamSynchronize"),
            granularity: sym!(lib, "cuMemGetAllocationGranularity"),
            create: sym!(lib, "cuMemCreate"),
            release: sym!(lib, "cuMemRelease"),
            reserve: sym!(lib, "cuMemAddressReserve"),
            address_free: sym!(lib, "cuMemAddressFree"),
            map: sym!(lib, "cuMemMap"),
            unmap: sym!(lib, "cuMemUnmap"),
            set_access: sym!(lib, "cuMemSetAccess"),
            attribute: sym!(lib, "cuPointerGetAttribute"),
            device_attribute: sym!(lib, "cuDeviceGetAttribute"),
            handle_for_range: sym!(lib, "cuMemGetHandleForAddressRange"),
            _lib: lib,
        }
    }

    /// `cuMemAlloc`.
    pub fn alloc(&self, size: usize) -> u64 {
        let mut p = 0;
        // SAFETY: `p` is a live out-pointer.
        ok("cuMemAlloc", unsafe { (self.alloc)(&mut p, size) });
        p
    }

    /// `cuMemFree` of an allocation of [`Raw::alloc`] that nothing uses any more.
    pub fn free(&self, p: u64) {
        // SAFETY: the driver checks the address; no CPU reference of it exists (device memory).
        ok("cuMemFree", unsafe { (self.free)(p) });
    }

    /// `cuMemAllocHost`: page-locked host memory, as its device-visible address.
    pub fn alloc_host(&self, size: usize) -> u64 {
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a live out-pointer.
        ok("cuMemAllocHost", unsafe { (self.alloc_host)(&mut p, size) });
        p as u64
    }

    /// `cuMemFreeHost`.
    pub fn free_host(&self, p: u64) {
        // SAFETY: `p` came from `alloc_host`; the tests make no reference into it.
        ok("cuMemFreeHost", unsafe {
            (self.free_host)(p as *mut c_void)
        });
    }

    /// `cuMemAllocManaged(.., CU_MEM_ATTACH_GLOBAL)`.
    pub fn alloc_managed(&self, size: usize) -> u64 {
        let mut p = 0;
        // SAFETY: `p` is a live out-pointer.
        ok("cuMemAllocManaged", unsafe {
            (self.alloc_managed)(&mut p, size, 1)
        });
        p
    }

    /// `cuMemAllocAsync` on the legacy stream, synchronised.
    pub fn alloc_async(&self, size: usize) -> u64 {
        let mut p = 0;
        // SAFETY: `p` is a live out-pointer; the null stream is the legacy default stream.
        ok("cuMemAllocAsync", unsafe {
            (self.alloc_async)(&mut p, size, std::ptr::null_mut())
        });
        // SAFETY: as above.
        ok("cuStreamSynchronize", unsafe {
            (self.stream_sync)(std::ptr::null_mut())
        });
        p
    }

    /// `cuMemFreeAsync` on the legacy stream, synchronised.
    pub fn free_async(&self, p: u64) {
        // SAFETY: `p` came from `alloc_async`; nothing uses it.
        ok("cuMemFreeAsync", unsafe {
            (self.free_async)(p, std::ptr::null_mut())
        });
        // SAFETY: the null stream is the legacy default stream.
        ok("cuStreamSynchronize", unsafe {
            (self.stream_sync)(std::ptr::null_mut())
        });
    }

    /// An unsigned 64-bit pointer attribute.
    pub fn attribute_u64(&self, attr: c_int, p: u64) -> Result<u64, R> {
        let mut v = 0u64;
        // SAFETY: `v` is a live out-pointer of the attribute's size (8 bytes).
        match unsafe { (self.attribute)((&mut v as *mut u64).cast(), attr, p) } {
            0 => Ok(v),
            r => Err(r),
        }
    }

    /// The driver's own answer to a dma-buf export of `[p, p + size)`, bypassing drm-export's
    /// checks: the dma-buf's fd, or the CUresult.
    pub fn dmabuf_unchecked(&self, p: u64, size: usize) -> Result<std::os::fd::OwnedFd, R> {
        let mut fd: c_int = -1;
        // SAFETY: `fd` is a live out-pointer for an int (the dma-buf handle type's); the range
        // is only exported, never accessed by this process.
        match unsafe { (self.handle_for_range)((&mut fd as *mut c_int).cast(), p, size, 1, 0) } {
            // SAFETY: the driver made a new fd that nothing else owns.
            0 => Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) }),
            r => Err(r),
        }
    }

    /// A device attribute of device 0.
    pub fn device_attribute(&self, attr: c_int) -> Result<c_int, R> {
        let mut v = 0;
        // SAFETY: `v` is a live out-pointer.
        match unsafe { (self.device_attribute)(&mut v, attr, 0) } {
            0 => Ok(v),
            r => Err(r),
        }
    }

    fn prop(rdma: bool) -> Prop {
        Prop {
            kind: ALLOCATION_PINNED,
            handle_types: if rdma { HANDLE_POSIX_FD } else { 0 },
            location: Location {
                kind: LOCATION_DEVICE,
                id: 0,
            },
            win32: std::ptr::null_mut(),
            compression: 0,
            gpu_direct_rdma: u8::from(rdma),
            usage: 0,
            reserved: [0; 4],
        }
    }

    /// The minimum granularity of `cuMemCreate` on device 0.
    pub fn granularity(&self, rdma: bool) -> usize {
        let mut g = 0;
        // SAFETY: `g` is a live out-pointer, the property a live struct of cuda.h's layout.
        ok("cuMemGetAllocationGranularity", unsafe {
            (self.granularity)(&mut g, &Self::prop(rdma), 0)
        });
        g
    }

    /// `cuMemCreate` of one physical allocation.
    pub fn create(&self, size: usize, rdma: bool) -> c_ulonglong {
        let mut h = 0;
        // SAFETY: `h` is a live out-pointer, the property a live struct of cuda.h's layout.
        ok("cuMemCreate", unsafe {
            (self.create)(&mut h, size, &Self::prop(rdma), 0)
        });
        h
    }

    /// `cuMemRelease`.
    pub fn release(&self, h: c_ulonglong) {
        // SAFETY: `h` came from `create`; mappings keep their own reference.
        ok("cuMemRelease", unsafe { (self.release)(h) });
    }

    /// `cuMemAddressReserve` of `size` bytes.
    pub fn reserve(&self, size: usize, align: usize) -> u64 {
        self.reserve_at(size, align, 0)
    }

    /// `cuMemAddressReserve` of `size` bytes, asking for address `at` (0: anywhere).
    pub fn reserve_at(&self, size: usize, align: usize, at: u64) -> u64 {
        let mut p = 0;
        // SAFETY: `p` is a live out-pointer.
        ok("cuMemAddressReserve", unsafe {
            (self.reserve)(&mut p, size, align, at, 0)
        });
        p
    }

    /// `cuMemAddressFree`.
    pub fn address_free(&self, p: u64, size: usize) {
        // SAFETY: `[p, p + size)` was reserved by `reserve` and is unmapped.
        ok("cuMemAddressFree", unsafe { (self.address_free)(p, size) });
    }

    /// `cuMemMap` of physical allocation `h` at `p`, then read-write access for device 0.
    pub fn map(&self, p: u64, size: usize, h: c_ulonglong) {
        // SAFETY: `[p, p + size)` is reserved and unmapped; `h` is a live allocation.
        ok("cuMemMap", unsafe { (self.map)(p, size, 0, h, 0) });
        let desc = AccessDesc {
            location: Location {
                kind: LOCATION_DEVICE,
                id: 0,
            },
            flags: ACCESS_READ_WRITE,
        };
        // SAFETY: `desc` is a live struct of cuda.h's layout; the range was just mapped.
        ok("cuMemSetAccess", unsafe {
            (self.set_access)(p, size, &desc, 1)
        });
    }

    /// `cuMemUnmap`.
    pub fn unmap(&self, p: u64, size: usize) {
        // SAFETY: `[p, p + size)` was mapped by `map`; nothing uses it.
        ok("cuMemUnmap", unsafe { (self.unmap)(p, size) });
    }
}
