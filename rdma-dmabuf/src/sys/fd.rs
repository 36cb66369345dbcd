//! File descriptors of the verbs objects: their flags, and their registration with tokio's
//! reactor (whose contract, that a registered fd stays open, is kept here by lifetimes and
//! ownership where the types can say it).

use std::os::fd::BorrowedFd;

/// Sets `O_NONBLOCK` on `fd`, keeping its other status flags.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>) -> nix::Result<()> {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK)).map(drop)
}

#[cfg(feature = "tokio")]
pub(crate) use with_tokio::*;

#[cfg(feature = "tokio")]
mod with_tokio {
    use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    /// `inner`'s fd registered for readability with the current runtime's reactor.
    ///
    /// # Safety
    /// `inner.as_raw_fd()` is an open fd, stays open (the same file) until the returned value
    /// is dropped, and is the same on every call (tokio's contract for
    /// `register_with_interest`).
    unsafe fn register_readable<T: AsRawFd>(inner: T) -> std::io::Result<AsyncFd<T>> {
        // SAFETY: this function's contract is tokio's.
        unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }
            .map_err(|e| e.into_parts().1)
    }

    /// `fd` registered for readability with the current runtime's reactor (which must exist:
    /// callers check, or are async functions, which run inside one). The registration
    /// borrows `fd`, so it ends before the fd's owner can close it.
    pub(crate) fn register(fd: BorrowedFd<'_>) -> std::io::Result<AsyncFd<BorrowedFd<'_>>> {
        // SAFETY: a `BorrowedFd<'a>` is open, the same file, for all of `'a`, which the
        // returned value (holding it) cannot outlive; it returns the same fd on every call.
        unsafe { register_readable(fd) }
    }

    /// A duplicate of `fd` (the same open file, so the same readiness) registered for
    /// readability with the current runtime's reactor (which must exist), the registration
    /// owning it: for a registration kept beside the fd's owner, where no lifetime can say
    /// that it ends first. It needs no promise: the registration closes its own duplicate,
    /// whatever happens to `fd`.
    pub(crate) fn register_duplicate(fd: BorrowedFd<'_>) -> std::io::Result<AsyncFd<OwnedFd>> {
        register_owned(fd.try_clone_to_owned()?)
    }

    // SAFETY: an `OwnedFd` is open, the same file, for its whole life, and `as_raw_fd`
    // returns that fd on every call.
    unsafe impl StableFd for OwnedFd {}

    /// An owner of an fd that stays open, the same file, for the owner's whole life, and that
    /// its `as_raw_fd` returns on every call: [`register_owned`] may register it.
    ///
    /// # Safety
    /// As said: `as_raw_fd` always returns the same fd, open while `self` lives.
    pub(crate) unsafe trait StableFd: AsRawFd {}

    /// `owner`'s fd registered for readability with the current runtime's reactor (which must
    /// exist), the registration owning `owner`, and so its fd, until it drops.
    pub(crate) fn register_owned<T: StableFd>(owner: T) -> std::io::Result<AsyncFd<T>> {
        // SAFETY: `T: StableFd`: its fd is open, the same file, while `owner` lives, which the
        // returned value holds; `as_raw_fd` returns the same fd on every call.
        unsafe { register_readable(owner) }
    }
}
