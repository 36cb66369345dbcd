//! `DMA_BUF_IOCTL_SYNC` for callers that map a dma-buf themselves (`linux/dma-buf.h`).

use crate::{invalid, Failure};
use std::os::fd::{AsRawFd, BorrowedFd};

/// `struct dma_buf_sync`.
#[repr(C)]
struct DmaBufSync {
    flags: u64,
}

/// `DMA_BUF_SYNC_RW | DMA_BUF_SYNC_END`: every valid flag.
const VALID: u64 = 0b111;

nix::ioctl_write_ptr!(dma_buf_sync, b'b', 0, DmaBufSync);

/// Begins or ends a CPU access (`flags` as the kernel's), retrying on `EINTR` and `EAGAIN` as
/// the uapi asks.
pub(crate) fn sync(fd: BorrowedFd<'_>, flags: u64) -> Result<(), Failure> {
    if flags & !VALID != 0 || flags & 0b11 == 0 {
        return Err(invalid(format!(
            "sync flags {flags:#x}: READ, WRITE or RW, with START or END, and nothing else"
        )));
    }
    let arg = DmaBufSync { flags };
    loop {
        // SAFETY: `fd` is a dma-buf (checked by the caller) and `arg` a live `dma_buf_sync`
        // the kernel only reads.
        match unsafe { dma_buf_sync(fd.as_raw_fd(), &arg) } {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
            Err(e) => {
                return Err(Failure {
                    errno: e as i32,
                    message: format!(
                        "DMA_BUF_IOCTL_SYNC {flags:#x} on fd {}: {e}",
                        fd.as_raw_fd()
                    ),
                })
            }
        }
    }
}
