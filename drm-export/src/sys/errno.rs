//! Errors of failed system calls made through nix: restarting interrupted ioctls, and the
//! errno of a call kept when nix does not know it.

use nix::errno::Errno;
use std::ffi::c_int;
use std::io;

/// Repeats an ioctl that failed with `EINTR` (interrupted by a signal) or `EAGAIN`, as
/// libdrm's `drmIoctl` does.
pub(super) fn restart(mut call: impl FnMut() -> nix::Result<c_int>) -> io::Result<c_int> {
    loop {
        match call() {
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            other => return other.map_err(os_error),
        }
    }
}

/// The `io::Error` of a failed call's `Errno`, read right after the call. nix knows only the
/// errnos of the C library: a kernel-internal one that drivers leak to user space (`ENOTSUPP`,
/// 524, from NVIDIA's dma-buf `mmap`) becomes `UnknownErrno`, 0, which prints as "Success".
/// Then the thread's errno, which nothing has changed since the call, is the real one.
pub(super) fn os_error(e: Errno) -> io::Error {
    match e {
        Errno::UnknownErrno => io::Error::from_raw_os_error(Errno::last_raw()),
        e => io::Error::from(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A driver's kernel-internal errno (NVIDIA's dma-buf `mmap` returns `ENOTSUPP`, 524) keeps
    /// its number: nix alone makes it 0, "Success".
    #[test]
    fn a_kernel_internal_errno_keeps_its_number() {
        let e = restart(|| {
            Errno::set_raw(524);
            Err(Errno::from_raw(524))
        })
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(524), "{e}");
        let e = crate::Error::os(crate::error::Op::Map, "dma-buf fd 3 (nv_dmabuf)", e);
        assert!(e.to_string().contains("cuMemcpy"), "the hint: {e}");
    }
}
