//! sync_file fences bridged to dma-bufs' implicit fences
//! (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE` / `IMPORT_SYNC_FILE`, kernel >= 6.0).

use crate::error::{Error, Op, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

/// Which of a buffer's fences a sync_file stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceAccess {
    /// Export: the fences a reader must wait for (writers). Import: a fence for a read.
    Read,
    /// Export: the fences a writer must wait for (readers and writers). Import: a write.
    Write,
    /// Both.
    ReadWrite,
}

impl FenceAccess {
    pub(crate) fn flags(self) -> u32 {
        match self {
            FenceAccess::Read => crate::sys::DMA_BUF_SYNC_READ,
            FenceAccess::Write => crate::sys::DMA_BUF_SYNC_WRITE,
            FenceAccess::ReadWrite => crate::sys::DMA_BUF_SYNC_RW,
        }
    }
}

/// What `/proc/self/fd/<fd>` reads for a sync_file: the kernel makes each one an anonymous
/// inode named `sync_file` (`anon_inode_getfile("sync_file", ...)` in
/// drivers/dma-buf/sync_file.c).
const SYNC_FILE_LINK: &str = "anon_inode:sync_file";

/// An owned sync_file: one fence (possibly merged from several), signalled once.
///
/// Obtained from [`DmaBuf::export_sync_file`](crate::DmaBuf::export_sync_file), or from any fd
/// through [`SyncFile::try_from`], which checks that the fd really is a sync_file.
#[derive(Debug)]
pub struct SyncFile(OwnedFd);

impl SyncFile {
    /// Wraps `fd` without checking it: only for an fd that the kernel has just returned from
    /// a sync_file export (`DMA_BUF_IOCTL_EXPORT_SYNC_FILE`). Any other fd goes through
    /// [`SyncFile::try_from`]. Not an `unsafe fn`: a wrong fd breaks no memory safety, only
    /// the meaning of [`SyncFile::wait`].
    pub(crate) fn from_fd(fd: OwnedFd) -> SyncFile {
        SyncFile(fd)
    }

    /// Whether the fence has signalled (a zero-timeout `poll`).
    ///
    /// # Errors
    /// [`Error::Os`] if `poll` fails.
    pub fn is_signalled(&self) -> Result<bool> {
        self.poll_for(Duration::ZERO)
    }

    /// Waits until the fence signals, for at most `timeout`. A timeout too long to be a
    /// deadline (e.g. [`Duration::MAX`]) waits without one.
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
        // `Instant + Duration` panics on overflow; a deadline past what `Instant` can hold is
        // no deadline.
        let deadline = Instant::now().checked_add(timeout);
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, poll_timeout(left)) {
                Ok(0) if left.is_some_and(|l| l.is_zero()) => return Ok(false),
                Ok(0) => continue,
                Ok(_) => return Ok(true),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(Error::os(
                        Op::WaitSyncFile,
                        format!("sync_file fd {}", self.0.as_raw_fd()),
                        e.into(),
                    ));
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

impl TryFrom<OwnedFd> for SyncFile {
    type Error = Error;

    /// Checks that `fd` is a sync_file: `readlink("/proc/thread-self/fd/<fd>")` (this thread's fd table, also after `unshare(CLONE_FILES)`) must read
    /// `anon_inode:sync_file`.
    ///
    /// Why this check: the link names the anonymous inode's class, which only the kernel sets
    /// (every file with a path reads as an absolute path, so no file name can forge it), and
    /// reading it has no side effects. The alternatives are weaker: a sync_file's fdinfo has
    /// no fields of its own (no `show_fdinfo`), so it reads like any anonymous inode's; and
    /// `SYNC_IOC_FILE_INFO` would send an ioctl number that is unique only within the sync_file
    /// driver to an fd of unknown kind, where another driver may take it for one of its own
    /// commands.
    ///
    /// # Errors
    /// [`Error::NotSyncFile`] for any other kind of fd (regular file, dma-buf, eventfd...);
    /// [`Error::Os`] if `/proc/self/fd` cannot be read.
    fn try_from(fd: OwnedFd) -> Result<SyncFile> {
        let raw = fd.as_raw_fd();
        let link = std::fs::read_link(format!("/proc/thread-self/fd/{raw}"))
            .map_err(|e| Error::os(Op::InspectSyncFile, format!("fd {raw}"), e))?;
        if link.as_os_str() == SYNC_FILE_LINK {
            return Ok(SyncFile(fd));
        }
        Err(Error::NotSyncFile {
            fd: raw,
            what: format!(
                "it refers to {}; sync_files come from DMA_BUF_IOCTL_EXPORT_SYNC_FILE or a \
                 driver's fence export",
                link.display()
            ),
        })
    }
}

/// `poll`'s timeout for `left`: `None` (no deadline) is an infinite wait; otherwise whole
/// milliseconds rounded up, so that a sub-millisecond rest sleeps rather than spins, and
/// clamped to `i32::MAX` ms (about 24.8 days; the caller polls again after that).
fn poll_timeout(left: Option<Duration>) -> PollTimeout {
    match left {
        None => PollTimeout::NONE,
        Some(left) => {
            PollTimeout::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(PollTimeout::MAX)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    /// A pollable fd that is already readable, standing in for a signalled fence.
    fn readable_fd() -> (OwnedFd, UnixStream) {
        let (a, mut b) = UnixStream::pair().unwrap();
        b.write_all(b"x").unwrap();
        (OwnedFd::from(a), b)
    }

    #[test]
    fn duration_max_waits_without_a_deadline() {
        let (fd, _peer) = readable_fd();
        let sf = SyncFile::from_fd(fd);
        sf.wait(Duration::MAX).expect("signalled");
        // Any timeout past what `Instant` can hold, not just the maximum.
        sf.wait(Duration::from_secs(u64::MAX / 2))
            .expect("signalled");
        assert!(sf.is_signalled().unwrap());
    }

    #[test]
    fn poll_timeouts_round_up_and_clamp() {
        assert_eq!(poll_timeout(None), PollTimeout::NONE);
        assert_eq!(poll_timeout(Some(Duration::ZERO)), PollTimeout::ZERO);
        assert_eq!(
            poll_timeout(Some(Duration::from_nanos(1))),
            PollTimeout::from(1u8)
        );
        assert_eq!(
            poll_timeout(Some(Duration::from_micros(1500))),
            PollTimeout::from(2u8)
        );
        let big = Duration::from_millis(i32::MAX as u64 + 1);
        assert_eq!(poll_timeout(Some(big)), PollTimeout::MAX);
        assert_eq!(poll_timeout(Some(Duration::MAX)), PollTimeout::MAX);
    }

    #[test]
    fn a_regular_file_is_not_a_sync_file() {
        let f = std::fs::File::open("/proc/self/status").unwrap();
        let err = SyncFile::try_from(OwnedFd::from(f)).unwrap_err();
        assert!(matches!(err, Error::NotSyncFile { .. }), "{err}");
        assert!(err.to_string().contains("/proc/"), "{err}");
    }
}
