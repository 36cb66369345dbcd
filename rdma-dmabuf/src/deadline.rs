//! Deadlines and waits on file descriptors: saturating arithmetic (so that `Duration::MAX`
//! means "no deadline" instead of a panic) and `poll(2)` through nix.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

pub(crate) use crate::sys::fd::set_nonblocking;

/// The instant `timeout` from now; `None` (no deadline) when it lies past what [`Instant`]
/// can hold, as `Duration::MAX` does.
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

/// The time left until `deadline` (`Duration::MAX` without one).
pub(crate) fn time_left(deadline: Option<Instant>) -> Duration {
    deadline.map_or(Duration::MAX, |d| {
        d.saturating_duration_since(Instant::now())
    })
}

/// `timeout` as `poll(2)`'s milliseconds: rounded up (so a wait of less than a millisecond
/// sleeps rather than spins) and clamped to `i32::MAX` (about 24.8 days; callers loop).
pub(crate) fn poll_ms(timeout: Duration) -> i32 {
    i32::try_from(timeout.as_nanos().div_ceil(1_000_000)).unwrap_or(i32::MAX)
}

/// Waits until `fd` is readable or `timeout` passes (at least a millisecond, so a caller's
/// loop never spins); `Ok(true)` if it is readable. An interrupted wait counts as a timeout
/// (callers loop on their own deadline).
pub(crate) fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> nix::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let ms = PollTimeout::try_from(poll_ms(timeout).max(1)).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, ms) {
        Ok(n) => Ok(n > 0),
        Err(nix::errno::Errno::EINTR) => Ok(false),
        Err(e) => Err(e),
    }
}

/// A reactor error as the crate's error, naming `op` and `what`.
#[cfg(feature = "tokio")]
pub(crate) fn reactor_error(
    op: crate::error::Op,
    what: &str,
    e: &std::io::Error,
) -> crate::error::Error {
    crate::error::Error::from_errno(
        op,
        format!("{what}: the reactor"),
        e.raw_os_error().unwrap_or(libc::EIO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_and_clamp() {
        assert_eq!(poll_ms(Duration::ZERO), 0);
        assert_eq!(poll_ms(Duration::from_nanos(1)), 1);
        assert_eq!(poll_ms(Duration::from_micros(1500)), 2);
        assert_eq!(
            poll_ms(Duration::from_millis(i32::MAX as u64 + 1)),
            i32::MAX
        );
        assert_eq!(poll_ms(Duration::MAX), i32::MAX);
    }

    #[test]
    fn deadlines_saturate() {
        assert_eq!(deadline_after(Duration::MAX), None);
        assert_eq!(time_left(None), Duration::MAX);
        let d = deadline_after(Duration::from_secs(60));
        assert!(time_left(d) <= Duration::from_secs(60) && !time_left(d).is_zero());
        assert!(time_left(deadline_after(Duration::ZERO)).is_zero());
    }

    #[test]
    fn a_pipe_is_readable_once_written_and_nonblocking_when_asked() {
        use std::io::{Read, Write};
        use std::os::fd::AsFd;
        let (mut r, mut w) = std::io::pipe().unwrap();
        assert!(!wait_readable(r.as_fd(), Duration::from_millis(1)).unwrap());
        w.write_all(b"x").unwrap();
        assert!(wait_readable(r.as_fd(), Duration::MAX).unwrap());
        set_nonblocking(r.as_fd()).unwrap();
        let mut buf = [0u8; 2];
        assert_eq!(r.read(&mut buf).unwrap(), 1);
        let e = r.read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    }
}
