//! The stand-in libcuda (`tests/standin/libcuda_standin.c`, built by this crate's build
//! script): CUDA "device memory" made of memfds exported with udmabuf, for testing
//! drm-export's CUDA code in the testbed, which has no GPU. It exercises this project's code,
//! not NVIDIA's driver.
//!
//! [`standin`] points `DRM_EXPORT_LIBCUDA` at it (before drm-export's first CUDA call loads
//! the driver) and loads it here too, for its helpers: allocations of each memory kind and
//! of several segments, and the host view of its memory, through which tests check bytes.

use drm_export::cuda::{CudaDevice, LIBCUDA_ENV};
use std::sync::{Arc, OnceLock};

/// What an allocation of the stand-in reports itself as.
#[derive(Clone, Copy, Debug)]
pub enum Kind {
    /// Device memory (`CU_MEMORYTYPE_DEVICE`).
    Device = 0,
    /// Page-locked host memory (`CU_MEMORYTYPE_HOST`).
    Host = 1,
    /// Managed memory (`CU_POINTER_ATTRIBUTE_IS_MANAGED`).
    Managed = 2,
}

type AllocFn = unsafe extern "C" fn(*mut u64, usize, i32, i32) -> i32;
type CopyFn = unsafe extern "C" fn(u64, *mut u8, usize) -> i32;
type WriteFn = unsafe extern "C" fn(u64, *const u8, usize) -> i32;
type FreeFn = unsafe extern "C" fn(u64) -> i32;

/// The loaded stand-in and its helpers.
pub struct Standin {
    _lib: libloading::Library,
    alloc: AllocFn,
    read: CopyFn,
    write: WriteFn,
    free: FreeFn,
}

/// The stand-in, loaded once per process, with `DRM_EXPORT_LIBCUDA` naming it.
///
/// # Panics
/// If it cannot be loaded.
pub fn standin() -> &'static Standin {
    static S: OnceLock<Standin> = OnceLock::new();
    S.get_or_init(|| {
        let path = env!("CUDA_STANDIN");
        // Set before drm-export's first CUDA call, which reads it once, on this test
        // binary's first use of the stand-in.
        std::env::set_var(LIBCUDA_ENV, path);
        // SAFETY: the stand-in, built by this workspace, has no initialisers.
        let lib = unsafe { libloading::Library::new(path) }.expect("load the stand-in libcuda");
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the stand-in defines this symbol with this C signature.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.expect($name)
            };
        }
        Standin {
            alloc: sym!("standin_alloc"),
            read: sym!("standin_read"),
            write: sym!("standin_write"),
            free: sym!("cuMemFree_v2"),
            _lib: lib,
        }
    })
}

/// CUDA device 0 of the stand-in.
///
/// # Panics
/// If it cannot be opened.
pub fn device() -> Arc<CudaDevice> {
    standin();
    CudaDevice::open(0).expect("the stand-in's CUDA device 0")
}

impl Standin {
    /// An allocation of `size` bytes of `kind`, mapped from `segments` equal physical parts.
    ///
    /// # Panics
    /// If the stand-in refuses.
    pub fn alloc(&self, size: usize, segments: i32, kind: Kind) -> u64 {
        let mut p = 0;
        // SAFETY: `p` is a live out-pointer for one device address.
        let r = unsafe { (self.alloc)(&mut p, size, segments, kind as i32) };
        assert_eq!(r, 0, "standin_alloc({size}, {segments}, {kind:?})");
        p
    }

    /// `cuMemFree` of an allocation made by [`Standin::alloc`].
    ///
    /// # Panics
    /// If the stand-in refuses.
    pub fn free(&self, p: u64) {
        // SAFETY: the stand-in checks the address against its own allocations.
        assert_eq!(unsafe { (self.free)(p) }, 0, "cuMemFree({p:#x})");
    }

    /// `n` bytes at device address `p`, through the host view.
    ///
    /// # Panics
    /// If the range is not inside one live allocation.
    pub fn read(&self, p: u64, n: usize) -> Vec<u8> {
        let mut out = vec![0; n];
        // SAFETY: `out` is a live, writable buffer of `n` bytes; the stand-in checks `p`.
        let r = unsafe { (self.read)(p, out.as_mut_ptr(), n) };
        assert_eq!(r, 0, "standin_read({p:#x}, {n})");
        out
    }

    /// Writes `data` at device address `p`, through the host view.
    ///
    /// # Panics
    /// If the range is not inside one live allocation.
    pub fn write(&self, p: u64, data: &[u8]) {
        // SAFETY: `data` is live for the call; the stand-in checks `p`.
        let r = unsafe { (self.write)(p, data.as_ptr(), data.len()) };
        assert_eq!(r, 0, "standin_write({p:#x}, {})", data.len());
    }
}

/// CUDA device 0 of the stand-in, whose exports may be registered on soft-RoCE by code that
/// exports for itself (the registration cache's `checkout_cuda`, the engine's CUDA
/// segments): their pages are vouched small for the device, as [`vouch_small_pages`] does
/// for one buffer.
///
/// # Panics
/// If it cannot be opened, or shmem transparent huge pages are enabled.
pub fn vouched_device() -> Arc<CudaDevice> {
    assert!(
        shmem_huge_pages_off(),
        "shmem transparent huge pages are on: the stand-in's memfds may have large pages"
    );
    let d = device();
    // SAFETY: every export of the stand-in is a udmabuf of its plain shmem memfds
    // (memfd_create without MFD_HUGETLB), and shmem transparent huge pages are off at every
    // size (checked just above; the testbed never changes them), so their pages are small.
    unsafe { d.assume_udmabuf_small_pages() };
    d
}

/// Records that a udmabuf of the stand-in has small pages only (rdma-dmabuf refuses udmabufs
/// of unknown pages on soft-RoCE on kernels whose udmabuf misplaces large ones), after
/// checking that its memfds cannot have large pages.
///
/// # Panics
/// If shmem transparent huge pages are enabled.
pub fn vouch_small_pages(dmabuf: &mut drm_export::DmaBuf) {
    assert!(
        shmem_huge_pages_off(),
        "shmem transparent huge pages are on: the stand-in's memfds may have large pages"
    );
    // SAFETY: the stand-in's memfds are plain shmem (memfd_create without MFD_HUGETLB), and
    // shmem transparent huge pages are off at every size (checked just above; the testbed
    // never changes them), so every page they have is a small one.
    unsafe { dmabuf.assume_udmabuf_small_pages() };
}

/// Whether shmem transparent huge pages are off at every size (or not built in).
fn shmem_huge_pages_off() -> bool {
    let selected = |path: &std::path::Path| {
        std::fs::read_to_string(path).ok().and_then(|s| {
            let (_, rest) = s.split_once('[')?;
            Some(rest.split_once(']')?.0.to_string())
        })
    };
    let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage");
    let top = selected(&thp.join("shmem_enabled"));
    let top_off = top.as_deref().is_none_or(|s| s == "never" || s == "deny");
    let sizes = std::fs::read_dir(thp).into_iter().flatten().flatten();
    top_off
        && sizes
            .filter(|e| e.file_name().to_string_lossy().starts_with("hugepages-"))
            .all(|e| {
                matches!(
                    selected(&e.path().join("shmem_enabled")).as_deref(),
                    None | Some("never") | Some("inherit")
                )
            })
}

/// What an export or lookup came to, for a test's report: "exported", the refusal, or the
/// other error.
pub fn outcome<T>(r: &drm_export::Result<T>) -> String {
    match r {
        Ok(_) => "exported".into(),
        Err(drm_export::Error::CudaPointer { why, .. }) => format!("refused: {why:?}"),
        Err(e) => format!("other error (not a CudaRefusal): {e}"),
    }
}
