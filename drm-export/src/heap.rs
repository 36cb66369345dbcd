//! dma-heap: dma-bufs from the kernel's heaps (`/dev/dma_heap/<name>`, e.g. `system`).

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys;
use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::path::PathBuf;

/// The heap folder.
pub const HEAPS: &str = "/dev/dma_heap";

/// An open dma-heap.
#[derive(Debug)]
pub struct DmaHeap {
    file: File,
    name: String,
}

impl DmaHeap {
    /// Opens `/dev/dma_heap/<name>` (`system`, `cma`, ... : see [`heaps`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name with a `/`; [`Error::Os`] with a hint for
    /// `ENOENT` (unknown heap).
    pub fn open(name: &str) -> Result<DmaHeap> {
        if name.is_empty() || name.contains('/') {
            return Err(Error::invalid(
                Op::OpenHeap,
                format!("bad heap name {name:?}"),
            ));
        }
        let path = PathBuf::from(HEAPS).join(name);
        let file = OpenOptions::new()
            .read(true)
            .open(&path)
            .map_err(|e| Error::os(Op::OpenHeap, path.display(), e))?;
        Ok(DmaHeap {
            file,
            name: name.to_string(),
        })
    }

    /// The system heap (page allocator memory).
    ///
    /// # Errors
    /// As [`DmaHeap::open`].
    pub fn system() -> Result<DmaHeap> {
        DmaHeap::open("system")
    }

    /// `DMA_HEAP_IOCTL_ALLOC`: a read-write, close-on-exec dma-buf of `size` bytes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0; [`Error::Os`] if the heap refuses.
    pub fn allocate(&self, size: u64) -> Result<DmaBuf> {
        if size == 0 {
            return Err(Error::invalid(Op::HeapAlloc, "size 0"));
        }
        let mut arg = sys::dma_heap_allocation_data {
            len: size,
            fd: 0,
            fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
            heap_flags: 0,
        };
        let fd = sys::heap_alloc(self.file.as_fd(), &mut arg).map_err(|e| {
            Error::os(
                Op::HeapAlloc,
                format!("{HEAPS}/{} ({size} bytes)", self.name),
                e,
            )
        })?;
        DmaBuf::try_from(fd)
    }

    /// The heap's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The heaps this kernel offers.
///
/// # Errors
/// [`Error::Os`] if `/dev/dma_heap` exists but cannot be read.
pub fn heaps() -> Result<Vec<String>> {
    match std::fs::read_dir(HEAPS) {
        Ok(d) => {
            let mut v: Vec<String> = d
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            v.sort();
            Ok(v)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::os(Op::OpenHeap, HEAPS, e)),
    }
}
