//! CPU access to a dma-buf: a [`Mapping`] (`mmap`) whose guards bracket each access with
//! `DMA_BUF_IOCTL_SYNC` and copy bytes in and out with volatile accesses.
//!
//! A dma-buf is shared memory. Other mappings of it, other processes holding its fd, the GPU
//! and the NIC can change it at any time, and Rust cannot see any of them. A `&[u8]` over such
//! memory would be undefined behaviour as soon as anyone else writes it (the compiler assumes a
//! shared slice does not change, and release builds act on that). So this module never hands
//! out a slice: [`ReadGuard::read_at`] and [`ReadGuard::to_vec`] copy out,
//! [`WriteGuard::write_at`] and [`WriteGuard::fill`] copy in, each byte touched once by a
//! volatile access (rust-vmm's `vm-memory`, the model for memory shared with guests and
//! devices). Whatever another writer does, our process sees some value for each byte; it
//! cannot be made to misbehave.

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys;

/// A CPU mapping of a [`DmaBuf`] (`mmap`, `MAP_SHARED`, read-write); access goes through
/// sync guards. It borrows the `DmaBuf` exclusively, so one `DmaBuf` value has at most one
/// mapping at a time.
#[derive(Debug)]
pub struct Mapping<'b> {
    buf: &'b DmaBuf,
    map: sys::Mmap,
}

impl DmaBuf {
    /// Maps the whole buffer for CPU access (`mmap`, `MAP_SHARED`, read-write).
    ///
    /// The mapping gives no bytes by itself: [`Mapping::read`] and [`Mapping::write`] return
    /// guards that bracket the access with `DMA_BUF_IOCTL_SYNC` start and end, so that caches
    /// are coherent with the device, and copy bytes in and out (volatile accesses: no slice
    /// over shared memory, see [`crate::Mapping`]).
    ///
    /// It takes the `DmaBuf` exclusively: while a region or a request holds this `DmaBuf`
    /// (or a shared borrow of it), it cannot be mapped. There is deliberately no way to clone a
    /// `DmaBuf` into a second mappable handle.
    ///
    /// # Errors
    /// [`Error::Os`] if the exporter refuses CPU mappings (hint on `EINVAL`/`EACCES`).
    pub fn map(&mut self) -> Result<Mapping<'_>> {
        Mapping::new(self)
    }
}

impl<'b> Mapping<'b> {
    pub(crate) fn new(buf: &'b mut DmaBuf) -> Result<Mapping<'b>> {
        let buf: &'b DmaBuf = buf;
        let map = sys::Mmap::of(buf).map_err(|e| Error::os(Op::Map, buf.describe(), e))?;
        Ok(Mapping { buf, map })
    }

    /// Begins a CPU read (`DMA_BUF_SYNC_START | DMA_BUF_SYNC_READ`); the guard ends it on drop.
    ///
    /// # Errors
    /// [`Error::Os`] if the sync ioctl fails.
    pub fn read(&self) -> Result<ReadGuard<'_>> {
        self.sync(sys::DMA_BUF_SYNC_START | sys::DMA_BUF_SYNC_READ)?;
        Ok(ReadGuard { mapping: self })
    }

    /// Begins a CPU read-write access (`DMA_BUF_SYNC_START | DMA_BUF_SYNC_RW`); the guard ends
    /// it on drop.
    ///
    /// # Errors
    /// [`Error::Os`] if the sync ioctl fails.
    pub fn write(&mut self) -> Result<WriteGuard<'_, 'b>> {
        self.sync(sys::DMA_BUF_SYNC_START | sys::DMA_BUF_SYNC_RW)?;
        Ok(WriteGuard { mapping: self })
    }

    /// The mapped length in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the mapping is empty (never: dma-bufs have a size).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sync(&self, flags: u32) -> Result<()> {
        sys::dmabuf_sync(self.buf, flags).map_err(|e| Error::os(Op::Sync, self.buf.describe(), e))
    }

    fn end(&self, flags: u32) {
        if let Err(e) = self.sync(sys::DMA_BUF_SYNC_END | flags) {
            crate::diag::warn(format_args!("{e}"));
        }
    }

    /// `[offset, offset + len)` of the mapping, checked.
    fn range(&self, op: Op, offset: usize, len: usize) -> Result<vm_memory::VolatileSlice<'_>> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => self
                .map
                .volatile()
                .subslice(offset, len)
                .map_err(|e| Error::invalid(op, e.to_string())),
            _ => Err(Error::invalid(
                op,
                format!(
                    "bytes {offset}..{offset}+{len} are outside the {} mapped bytes of {}",
                    self.len(),
                    self.buf.describe()
                ),
            )),
        }
    }

    fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.map.volatile().copy_to(&mut v[..]);
        v
    }

    fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.range(Op::Map, offset, dst.len())?.copy_to(dst);
        Ok(())
    }
}

/// A CPU read of a mapped dma-buf, between `DMA_BUF_IOCTL_SYNC` start and end.
#[derive(Debug)]
pub struct ReadGuard<'m> {
    mapping: &'m Mapping<'m>,
}

/// The copying reads both guards offer (each guard's `mapping` field is the mapping).
macro_rules! copy_out {
    () => {
        /// Copies `dst.len()` bytes from `offset` into `dst`.
        ///
        /// # Errors
        /// [`Error::InvalidArgument`] if the range reaches past the mapping.
        pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
            self.mapping.read_at(offset, dst)
        }

        /// A copy of the whole buffer.
        pub fn to_vec(&self) -> Vec<u8> {
            self.mapping.to_vec()
        }

        /// The mapped length in bytes.
        pub fn len(&self) -> usize {
            self.mapping.len()
        }

        /// Whether the mapping is empty (never).
        pub fn is_empty(&self) -> bool {
            self.len() == 0
        }
    };
}

impl ReadGuard<'_> {
    copy_out!();
}

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.mapping.end(sys::DMA_BUF_SYNC_READ);
    }
}

/// A CPU read-write access of a mapped dma-buf, between `DMA_BUF_IOCTL_SYNC` start and end.
#[derive(Debug)]
pub struct WriteGuard<'m, 'b> {
    mapping: &'m mut Mapping<'b>,
}

impl WriteGuard<'_, '_> {
    /// Copies `src` into the buffer from `offset`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the range reaches past the mapping.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> Result<()> {
        self.mapping
            .range(Op::Map, offset, src.len())?
            .copy_from(src);
        Ok(())
    }

    /// Sets every byte of the buffer to `byte`.
    pub fn fill(&mut self, byte: u8) {
        const CHUNK: usize = 64 * 1024;
        let chunk = [byte; CHUNK];
        let all = self.mapping.map.volatile();
        let mut at = 0;
        while at < all.len() {
            let n = CHUNK.min(all.len() - at);
            if let Ok(part) = all.subslice(at, n) {
                part.copy_from(&chunk[..n]);
            }
            at += n;
        }
    }

    copy_out!();
}

impl Drop for WriteGuard<'_, '_> {
    fn drop(&mut self) {
        self.mapping.end(sys::DMA_BUF_SYNC_RW);
    }
}
