//! sync_file fences bridged to dma-bufs' implicit fences
//! (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE` / `IMPORT_SYNC_FILE`, kernel >= 6.0).

use crate::error::{Error, Op, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Which of a buffer's fences a sync_file stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Export: the fences a reader must wait for (writers). Import: a fence for a read.
    Read,
    /// Export: the fences a writer must wait for (readers and writers). Import: a write.
    Write,
    /// Both.
    ReadWrite,
}

impl Access {
    pub(crate) fn flags(self) -> u32 {
        match self {
            Access::Read => crate::sys::DMA_BUF_SYNC_READ,
            Access::Write => crate::sys::DMA_BUF_SYNC_WRITE,
            Access::ReadWrite => crate::sys::DMA_BUF_SYNC_RW,
        }
    }
}

/// An owned sync_file: one fence (possibly merged from several), signalled once.
#[derive(Debug)]
pub struct SyncFile(OwnedFd);

impl SyncFile {
    /// Wraps an fd known to be a sync_file.
    pub fn from_fd(fd: OwnedFd) -> SyncFile {
        SyncFile(fd)
    }

    /// Whether the fence has signalled (a zero-timeout `poll`).
    ///
    /// # Errors
    /// [`Error::Os`] if `poll` fails.
    pub fn is_signalled(&self) -> Result<bool> {
        self.poll_for(Duration::ZERO)
    }

    /// Waits until the fence signals, for at most `timeout`.
    ///
    /// # Errors
    /// [`Error::Timeout`] if it has not signalled by then; [`Error::Os`] if `poll` fails.
    pub fn wait(&self, timeout: Duration) -> Result<()> {
        if self.poll_for(timeout)? {
            Ok(())
        } else {
            Err(Error::Timeout {
                fd: self.0.as_raw_fd(),
                timeout,
            })
        }
    }

    fn poll_for(&self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = PollTimeout::try_from(left.as_millis().min(i32::MAX as u128) as i32)
                .unwrap_or(PollTimeout::MAX);
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, ms) {
                Ok(0) if left.is_zero() => return Ok(false),
                Ok(0) => continue,
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(Error::os(
                        Op::WaitSyncFile,
                        format!("sync_file fd {}", self.0.as_raw_fd()),
                        e.into(),
                    ))
                }
            }
        }
    }

    /// Gives up the wrapper.
    pub fn into_fd(self) -> OwnedFd {
        self.0
    }
}

impl AsFd for SyncFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
