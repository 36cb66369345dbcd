//! File descriptors from Python: numbers, duplicated into an `OwnedFd` at once.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// A duplicate (close-on-exec) of whatever fd number `fd` is open as in this process, owned
/// by the caller; `EBADF` for a number that is not open (a negative one included).
pub(crate) fn dup_cloexec(fd: RawFd) -> std::io::Result<OwnedFd> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) reads no memory; on an fd number that is not open it
    // fails with EBADF. It creates a new fd and touches no other.
    let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if dup < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dup` was just created by fcntl for this call and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}
