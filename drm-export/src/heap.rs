//! dma-heap: dma-bufs from the kernel's heaps (`/dev/dma_heap/<name>`, e.g. `system`).

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;

/// The heap folder.
pub const DMA_HEAP_DIR: &str = "/dev/dma_heap";

/// An open dma-heap.
#[derive(Debug)]
pub struct DmaHeap {
    file: File,
    name: String,
}

impl DmaHeap {
    /// Opens `/dev/dma_heap/<name>` (`system`, `cma`, ... : see [`dma_heaps`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty name, `.`, `..` or a name with a `/`;
    /// [`Error::Os`] with a hint for `ENOENT` (unknown heap).
    pub fn open(name: &str) -> Result<DmaHeap> {
        // Every entry of /dev/dma_heap is a heap; these names would open something else
        // (the folder, /dev), to which `sys::heap_alloc` must never send its ioctl.
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::invalid(
                Op::OpenHeap,
                format!("bad heap name {name:?}"),
            ));
        }
        let path = PathBuf::from(DMA_HEAP_DIR).join(name);
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
    /// The size is checked first: the kernel would round a partial page up without saying so,
    /// and a heap asked for more than the machine has (the system heap allocates page by page)
    /// runs until the OOM killer ends the process instead of failing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for size 0, a size that is not a multiple of the page size,
    /// or one larger than the machine's memory (`sysinfo` total RAM, as `MemTotal` in
    /// `/proc/meminfo`); [`Error::Os`] if the heap refuses.
    pub fn allocate(&self, size: u64) -> Result<DmaBuf> {
        check_size(size, &self.name)?;
        let mut arg = sys::dma_heap_allocation_data {
            len: size,
            fd: 0,
            fd_flags: (libc::O_RDWR | libc::O_CLOEXEC) as u32,
            heap_flags: 0,
        };
        let fd = sys::heap_alloc(self, &mut arg).map_err(|e| {
            Error::os(
                Op::HeapAlloc,
                format!("{DMA_HEAP_DIR}/{} ({size} bytes)", self.name),
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

// The proof `sys` asks of a heap's file: `open`, the only constructor, opened it in the heap
// folder.
impl sys::HeapFile for DmaHeap {
    fn heap_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// Refuses sizes the heap would round up or could never hold, before the ioctl.
fn check_size(size: u64, heap: &str) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid(
            Op::HeapAlloc,
            format!("size 0 from {DMA_HEAP_DIR}/{heap}: a dma-heap buffer has at least one page"),
        ));
    }
    let page = crate::page_size();
    if !size.is_multiple_of(page) {
        return Err(Error::invalid(
            Op::HeapAlloc,
            format!(
                "size {size} from {DMA_HEAP_DIR}/{heap} is not a multiple of the page size ({page} \
                 bytes); round it up to {}",
                size.div_ceil(page).saturating_mul(page)
            ),
        ));
    }
    let memory = nix::sys::sysinfo::sysinfo()
        .map_err(|e| Error::os(Op::HeapAlloc, "sysinfo (total RAM)", e.into()))?
        .ram_total();
    if size > memory {
        return Err(Error::invalid(
            Op::HeapAlloc,
            format!(
                "size {size} bytes from {DMA_HEAP_DIR}/{heap} exceeds this machine's memory \
                 ({memory} bytes, MemTotal): the heap would allocate until the OOM killer \
                 ends the process"
            ),
        ));
    }
    Ok(())
}

/// The heaps this kernel offers.
///
/// # Errors
/// [`Error::Os`] if `/dev/dma_heap` exists but cannot be read.
pub fn dma_heaps() -> Result<Vec<String>> {
    match std::fs::read_dir(DMA_HEAP_DIR) {
        Ok(d) => {
            let mut v: Vec<String> = d
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect();
            v.sort();
            Ok(v)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::os(Op::OpenHeap, DMA_HEAP_DIR, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(size: u64, needle: &str) {
        match check_size(size, "system") {
            Err(e @ Error::InvalidArgument { .. }) => {
                assert!(e.to_string().contains(needle), "{e}")
            }
            other => panic!("size {size}: expected InvalidArgument ({needle}), got {other:?}"),
        }
    }

    #[test]
    fn names_outside_the_heap_folder_are_refused() {
        for name in ["", ".", "..", "../zero", "a/b"] {
            match DmaHeap::open(name) {
                Err(Error::InvalidArgument { .. }) => {}
                other => panic!("{name:?}: expected InvalidArgument, got {other:?}"),
            }
        }
    }

    #[test]
    fn sizes_are_checked_before_the_kernel() {
        let page = crate::page_size();
        refused(0, "size 0");
        refused(page + 1, "not a multiple of the page size");
        let memory = nix::sys::sysinfo::sysinfo().unwrap().ram_total();
        let too_big = (memory / page + 1) * page;
        refused(too_big, &format!("size {too_big} bytes"));
        refused(too_big, &format!("({memory} bytes, MemTotal)"));
        refused(u64::MAX - page + 1, "exceeds this machine's memory");
        check_size(page, "system").expect("one page");
    }
}
