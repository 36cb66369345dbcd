//! GPU and host buffers exported as dma-buf file descriptors.
//!
//! * [`DrmDevice`]: DRM card and render nodes ([`drm_nodes`]), driver identity and
//!   capabilities.
//! * [`GemBuffer`]: i915 and amdgpu GEM buffers with placement, and [`GpuBuffer::allocate`],
//!   which picks the allocator from the driver's name; [`DumbBuffer`]: dumb buffers (vgem in
//!   the testbed).
//! * [`prime_export`] and [`prime_import`]: GEM handle to dma-buf and back.
//! * [`Udmabuf`]: host memory (a sealed memfd) as a dma-buf; [`DmaHeap`]: dma-heap buffers.
//! * [`DmaBuf`]: an owned, validated dma-buf fd; CPU access through a [`Mapping`] whose
//!   guards issue `DMA_BUF_IOCTL_SYNC` and copy bytes in and out (volatile accesses, never a
//!   slice over shared memory); implicit fences as [`SyncFile`]s.
//! * [`VgemFence`]: vgem's hand-signalled fences, for testing implicit synchronisation.
//! * `cuda` (feature `cuda`): CUDA device memory exported with
//!   `cuMemGetHandleForAddressRange`, libcuda loaded at run time (`DRM_EXPORT_LIBCUDA` names
//!   another library); `cuda::range`: any device pointer the program already has.
//! * A dma-buf fd from elsewhere (Vulkan, Level Zero, ROCm, another process over
//!   `SCM_RIGHTS`): [`DmaBuf::try_from`] checks it and reads its size, exporter and identity.
//!
//! The crate's example `drm_export_quickstart`, which `cargo xtask test` runs in the testbed
//! VM (`cargo run -p drm-export --example drm_export_quickstart` on a machine with a GPU):
//!
//! ```no_run
#![doc = include_str!("../examples/drm_export_quickstart.rs")]
//! ```
//!
//! `unsafe` lives in the private `sys` module (ioctls, `mmap`, libcuda), and with feature
//! `cuda` in `cuda` too, which owns the device addresses that `sys`'s CUDA calls take as
//! `unsafe fn`s; `unsafe_code` is denied everywhere else (but for the declaration of
//! [`DmaBuf::assume_udmabuf_small_pages`], a promise its caller makes).

#![deny(unsafe_code)]
// `eprintln!` panics on a closed stderr, and notices come from drops: see `diag`.
#![deny(clippy::print_stderr, clippy::print_stdout)]

mod claim;
#[cfg(feature = "cuda")]
pub mod cuda;
mod device;
mod diag;
mod dmabuf;
mod dumb;
mod error;
mod gem;
mod heap;
mod mapping;
mod prime;
mod sync_file;
mod sys;
mod udmabuf;
mod vgem;

pub use claim::BufferId;
pub use device::{drm_nodes, Capabilities, DriverInfo, DrmDevice, NodeKind, DRI_DIR};
pub use dmabuf::DmaBuf;
pub use dumb::DumbBuffer;
pub use error::{CudaRefusal, Error, Op, Result};
pub use gem::{GemBuffer, GpuBuffer, Placement};
pub use heap::{dma_heaps, DmaHeap, DMA_HEAP_DIR};
pub use mapping::{Mapping, ReadGuard, WriteGuard};
pub use prime::{prime_export, prime_import, PrimeImport};
pub use sync_file::{FenceAccess, SyncFile};
pub use sys::{page_size, UDMABUF_DEVICE};
pub use udmabuf::{
    running_kernel_misplaces_huge_pages, sealed_memfd, udmabuf_size_limit,
    vmap_misplaces_huge_pages, MemfdPages, Udmabuf, HUGE_PAGE_VMAP_BUG, UNKNOWN_UDMABUF_PAGES,
};
pub use vgem::VgemFence;

// The README's examples are compiled as doc tests, so they cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
