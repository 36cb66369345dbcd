//! The crate's error type: every failure names the operation, what it acted on, and the errno,
//! with a hint where the cause is known.

use std::fmt;
use std::io;

/// An operation of this crate, as named in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// Opening a DRM device node.
    OpenDevice,
    /// Listing `/dev/dri`.
    ListDevices,
    /// `DRM_IOCTL_VERSION`, and `DRM_IOCTL_GET_CAP` for
    /// [`DrmDevice::capabilities`](crate::DrmDevice::capabilities).
    QueryDriver,
    /// `DRM_IOCTL_MODE_CREATE_DUMB`.
    CreateDumb,
    /// `DRM_IOCTL_MODE_DESTROY_DUMB` (unused: a dumb buffer's handle is closed with
    /// `DRM_IOCTL_GEM_CLOSE`, [`Op::GemClose`], by its last owner).
    DestroyDumb,
    /// `DRM_IOCTL_PRIME_HANDLE_TO_FD`.
    PrimeExport,
    /// `DRM_IOCTL_PRIME_FD_TO_HANDLE`.
    PrimeImport,
    /// `memfd_create`, `ftruncate`, `F_ADD_SEALS` for a udmabuf's backing memory.
    PrepareMemfd,
    /// `UDMABUF_CREATE` / `UDMABUF_CREATE_LIST`.
    CreateUdmabuf,
    /// Checking that an fd is a dma-buf (fdinfo, size).
    InspectDmaBuf,
    /// `mmap` of a dma-buf.
    Map,
    /// `DMA_BUF_IOCTL_SYNC`.
    Sync,
    /// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE`.
    ExportSyncFile,
    /// `DMA_BUF_IOCTL_IMPORT_SYNC_FILE`.
    ImportSyncFile,
    /// Waiting on a sync_file (`poll`).
    WaitSyncFile,
    /// Opening `/dev/dma_heap/<name>`.
    OpenHeap,
    /// `DMA_HEAP_IOCTL_ALLOC`.
    HeapAlloc,
    /// A driver's GEM create ioctl (i915, amdgpu, xe).
    GemCreate,
    /// `DRM_IOCTL_GEM_CLOSE`.
    GemClose,
    /// vgem's fence ioctls.
    VgemFence,
    /// A CUDA driver API call.
    Cuda,
    /// Checking that an fd is a sync_file (`/proc/self/fd/<fd>`).
    InspectSyncFile,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::OpenDevice => "open DRM device",
            Op::ListDevices => "list DRM devices",
            Op::QueryDriver => "DRM_IOCTL_VERSION",
            Op::CreateDumb => "DRM_IOCTL_MODE_CREATE_DUMB",
            Op::DestroyDumb => "DRM_IOCTL_MODE_DESTROY_DUMB",
            Op::PrimeExport => "DRM_IOCTL_PRIME_HANDLE_TO_FD",
            Op::PrimeImport => "DRM_IOCTL_PRIME_FD_TO_HANDLE",
            Op::PrepareMemfd => "prepare memfd for udmabuf",
            Op::CreateUdmabuf => "UDMABUF_CREATE",
            Op::InspectDmaBuf => "inspect dma-buf",
            Op::Map => "mmap dma-buf",
            Op::Sync => "DMA_BUF_IOCTL_SYNC",
            Op::ExportSyncFile => "DMA_BUF_IOCTL_EXPORT_SYNC_FILE",
            Op::ImportSyncFile => "DMA_BUF_IOCTL_IMPORT_SYNC_FILE",
            Op::WaitSyncFile => "wait on sync_file",
            Op::OpenHeap => "open dma-heap",
            Op::HeapAlloc => "DMA_HEAP_IOCTL_ALLOC",
            Op::GemCreate => "GEM create",
            Op::GemClose => "DRM_IOCTL_GEM_CLOSE",
            Op::VgemFence => "vgem fence ioctl",
            Op::Cuda => "CUDA driver call",
            Op::InspectSyncFile => "inspect sync_file",
        })
    }
}

/// Errors of `drm-export`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The kernel (or, for [`Op::Cuda`], the CUDA driver) refused an operation.
    #[error("{op} on {target}: {source}{}", hint_text(*.hint))]
    Os {
        /// What was attempted.
        op: Op,
        /// The device path or fd it acted on.
        target: String,
        /// The errno (for [`Op::Cuda`], an error carrying the `CUresult`'s name).
        #[source]
        source: io::Error,
        /// The likely cause, where known.
        hint: Option<&'static str>,
    },
    /// An argument was rejected before reaching the kernel.
    #[error("{op}: invalid argument: {what}")]
    InvalidArgument {
        /// What was attempted.
        op: Op,
        /// Which value and why.
        what: String,
    },
    /// The operation is not available on this device, driver or build.
    #[error("{op} on {target}: not supported: {why}")]
    Unsupported {
        /// What was attempted.
        op: Op,
        /// The device or driver.
        target: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// A sync_file wait ran past its timeout.
    #[error("wait on sync_file fd {fd}: fences not signalled after {timeout:?}")]
    Timeout {
        /// The sync_file's fd number.
        fd: i32,
        /// The timeout that passed.
        timeout: std::time::Duration,
    },
    /// The fd is not a dma-buf.
    #[error("fd {fd} is not a dma-buf ({what})")]
    NotDmaBuf {
        /// The raw fd number, for the message.
        fd: i32,
        /// What it is instead, where known.
        what: String,
    },
    /// A live [`DmaBuf`](crate::DmaBuf) of this process already owns the buffer behind this
    /// fd (a dup of its fd, or the same buffer exported again).
    #[error(
        "fd {fd}: dma-buf inode {inode} ({exporter}) is already owned by a live DmaBuf of this \
         process (hint: use that DmaBuf, or drop it or turn it back into its fd with \
         DmaBuf::into_fd first; two owners could map the buffer while a device uses it)"
    )]
    AlreadyOwned {
        /// The raw fd number, for the message.
        fd: i32,
        /// The dma-buf file's inode.
        inode: u64,
        /// The exporter's name.
        exporter: String,
    },
    /// The fd is not a sync_file.
    #[error("fd {fd} is not a sync_file ({what})")]
    NotSyncFile {
        /// The raw fd number, for the message.
        fd: i32,
        /// What it is instead, where known.
        what: String,
    },
    /// A CUDA pointer range that cannot be exported as a dma-buf, and why (feature `cuda`).
    #[error("CUDA pointer {ptr:#x} + {len} bytes: {why}")]
    CudaPointer {
        /// The pointer asked for.
        ptr: u64,
        /// The length asked for.
        len: u64,
        /// Why it was refused.
        why: CudaRefusal,
    },
}

/// Why a CUDA pointer range was refused ([`Error::CudaPointer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaRefusal {
    /// Length 0, or a range that wraps around the address space.
    EmptyOrWrapping,
    /// The driver knows no allocation at the pointer: not CUDA memory, or freed.
    NotCudaMemory {
        /// The CUDA error name the driver answered with.
        driver: String,
    },
    /// Page-locked host memory (`CU_MEMORYTYPE_HOST`).
    HostMemory,
    /// Managed (unified) memory, which migrates between host and device.
    ManagedMemory,
    /// Memory of another GPU than the device asked.
    OtherDevice {
        /// The ordinal of the GPU that owns the memory.
        ordinal: i32,
    },
    /// The range runs past the end of the allocation holding the pointer.
    PastAllocation {
        /// The allocation's base.
        base: u64,
        /// The allocation's size.
        size: u64,
    },
    /// The range crosses from the allocation holding the pointer into a neighbouring one
    /// (`cuMemAlloc`s side by side, or allocations of one pool). Only the seams between the
    /// `cuMemMap`ped parts of a virtual range may be crossed.
    CrossesAllocations {
        /// Where the allocation holding the pointer (within its mapping) starts.
        base: u64,
        /// Its size.
        size: u64,
    },
    /// The pages holding the range reach past its allocation: a dma-buf covers whole pages,
    /// and these hold other memory (the driver packs small allocations 512 bytes apart).
    SharesPages {
        /// The allocation's base.
        base: u64,
        /// The allocation's size.
        size: u64,
    },
    /// The memory was freed, or its address given to another allocation, by another thread
    /// while it was looked up or exported; an export was closed.
    ChangedMeanwhile,
}

impl fmt::Display for CudaRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaRefusal::EmptyOrWrapping => f.write_str("the range is empty or wraps around"),
            CudaRefusal::NotCudaMemory { driver } => write!(
                f,
                "no CUDA allocation holds it ({driver}): not device memory, or already freed"
            ),
            CudaRefusal::HostMemory => f.write_str(
                "it is page-locked host memory, not device memory (hint: register host memory \
                 as a host region, e.g. rdma_dmabuf::HostBuffer, whose owner can vouch that \
                 nothing else reads or writes it)",
            ),
            CudaRefusal::ManagedMemory => f.write_str(
                "it is managed memory, which the driver migrates between host and device; \
                 it cannot be exported as a dma-buf (hint: use cuMemAlloc or cuMemCreate memory)",
            ),
            CudaRefusal::OtherDevice { ordinal } => {
                write!(f, "it is memory of CUDA device {ordinal}: open that device")
            }
            CudaRefusal::PastAllocation { base, size } => write!(
                f,
                "it runs past the end of its allocation ({size} bytes at {base:#x})"
            ),
            CudaRefusal::CrossesAllocations { base, size } => write!(
                f,
                "it crosses from its allocation ({size} bytes at {base:#x}) into a \
                 neighbouring one: register each allocation's part as a region of its own"
            ),
            CudaRefusal::SharesPages { base, size } => write!(
                f,
                "its allocation ({size} bytes at {base:#x}) does not fill the pages holding \
                 it, so their dma-buf would hold other allocations' memory (hint: allocate \
                 whole pages, page-aligned, e.g. CudaBuffer, or a larger pool)"
            ),
            CudaRefusal::ChangedMeanwhile => f.write_str(
                "its memory was freed or reallocated by another thread while it was looked up or \
                 exported",
            ),
        }
    }
}

fn hint_text(hint: Option<&'static str>) -> String {
    hint.map(|h| format!(" (hint: {h})")).unwrap_or_default()
}

impl Error {
    /// The errno behind this error, if the kernel gave one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Os { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// Builds an [`Error::Os`] from an errno, adding the hint known for it.
    pub(crate) fn os(op: Op, target: impl fmt::Display, source: io::Error) -> Error {
        let hint = hint_for(op, source.raw_os_error());
        Error::Os {
            op,
            target: target.to_string(),
            source,
            hint,
        }
    }

    pub(crate) fn invalid(op: Op, what: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op,
            what: what.into(),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Os { source, .. } => source.kind(),
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// `ENOTSUPP`: a kernel-internal errno (not in the C library's list) that drivers return to
/// user space, e.g. NVIDIA's dma-buf `mmap`.
const ENOTSUPP: i32 = 524;

fn hint_for(op: Op, errno: Option<i32>) -> Option<&'static str> {
    match (op, errno?) {
        (Op::OpenDevice, libc::EACCES) => {
            Some("no permission on the node: add the user to the `render` (or `video`) group")
        }
        (Op::OpenDevice, libc::ENOENT) => Some("no such DRM device: is the GPU driver loaded?"),
        (Op::OpenHeap, libc::ENOENT) => {
            Some("no such heap: see /dev/dma_heap/ (system needs CONFIG_DMABUF_HEAPS_SYSTEM)")
        }
        (Op::Map, libc::EINVAL) => Some("the exporter may not support CPU mmap of its dma-bufs"),
        (Op::Map, ENOTSUPP | libc::EOPNOTSUPP) => Some(
            "the exporter does not map its dma-bufs for the CPU (NVIDIA's nv_dmabuf: copy device \
             memory with cuMemcpy, e.g. CudaBuffer::copy_to_host)",
        ),
        (Op::Map, libc::EACCES) => {
            Some("the dma-buf was exported read-only (PRIME export needs DRM_RDWR)")
        }
        (Op::ExportSyncFile | Op::ImportSyncFile, libc::ENOTTY) => {
            Some("kernel older than 6.0 lacks dma-buf sync_file import/export")
        }
        (Op::CreateDumb, libc::ENOSYS | libc::EOPNOTSUPP | libc::EACCES) => {
            Some("dumb buffers need the card node (/dev/dri/cardN), not a render node")
        }
        (Op::CreateUdmabuf, libc::EINVAL) => Some(
            "udmabuf needs a sealed memfd (F_SEAL_SHRINK, no F_SEAL_WRITE), page-aligned \
             offset and size, and size within udmabuf.size_limit_mb",
        ),
        (Op::CreateUdmabuf, libc::ENOENT) => Some("/dev/udmabuf is missing: CONFIG_UDMABUF"),
        (Op::CreateUdmabuf, libc::ENOMEM) => Some(
            "out of memory; over a hugetlb memfd: too few free huge pages of its size \
             (HugePages_Free in /proc/meminfo; reserve more with vm.nr_hugepages)",
        ),
        (Op::PrimeImport, libc::EINVAL | libc::EBADF) => Some("the fd is not a dma-buf"),
        (Op::InspectSyncFile, libc::ENOENT) => {
            Some("/proc/self/fd is unreadable: is /proc mounted?")
        }
        _ => None,
    }
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_carry_op_target_errno_and_hint() {
        let e = Error::os(
            Op::OpenDevice,
            "/dev/dri/renderD128",
            io::Error::from_raw_os_error(libc::EACCES),
        );
        let msg = e.to_string();
        assert!(msg.starts_with("open DRM device on /dev/dri/renderD128: Permission denied"));
        assert!(msg.contains("`render`"), "{msg}");
        assert_eq!(e.errno(), Some(libc::EACCES));
    }

    #[test]
    fn unknown_errno_has_no_hint() {
        let e = Error::os(
            Op::PrimeExport,
            "handle 3",
            io::Error::from_raw_os_error(libc::EIO),
        );
        assert!(!e.to_string().contains("hint"));
    }
}
