//! Taking a network interface down or up from this process, as a cut cable or a dead switch
//! port would (the rail benches and tests cut one link mid-transfer).
//!
//! This is `ip link set <netdev> down|up` done in-process with the `SIOCGIFFLAGS` /
//! `SIOCSIFFLAGS` ioctls, so that the cut takes effect when it is asked for: under the
//! testbed's emulator, with the guest's one vCPU busy moving RDMA traffic, starting the `ip`
//! program took 12 to 13 s (its pages read over the guest's 9p root file system, one fault at
//! a time), long enough for a transfer meant to be cut at half to have finished first.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Sets `netdev` administratively up (`up`) or down, like `ip link set`. Needs
/// `CAP_NET_ADMIN`; returns the kernel's error otherwise, or for a name that is not an
/// interface.
pub fn set_link(netdev: &str, up: bool) -> io::Result<()> {
    let name = CString::new(netdev).map_err(|_| invalid(netdev))?;
    let bytes = name.as_bytes_with_nul();
    if bytes.len() > libc::IFNAMSIZ {
        return Err(invalid(netdev));
    }
    // SAFETY: socket(2) takes no pointers; a negative return is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a descriptor socket(2) just returned and nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: `ifreq` is plain old data (a name array and a union of integers and
    // addresses), for which all zero bytes are a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, &src) in req.ifr_name.iter_mut().zip(bytes) {
        *dst = src as libc::c_char;
    }
    ioctl(&sock, libc::SIOCGIFFLAGS, &mut req, netdev)?;
    // SAFETY: SIOCGIFFLAGS filled the union's `ifru_flags` member, the one read here.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    let up_flag = libc::IFF_UP as libc::c_short;
    req.ifr_ifru.ifru_flags = if up {
        flags | up_flag
    } else {
        flags & !up_flag
    };
    ioctl(&sock, libc::SIOCSIFFLAGS, &mut req, netdev)
}

/// One interface ioctl on `sock` with `req`, its error naming the request and `netdev`.
fn ioctl(
    sock: &OwnedFd,
    request: libc::Ioctl,
    req: &mut libc::ifreq,
    netdev: &str,
) -> io::Result<()> {
    // SAFETY: `sock` is an open socket, and both SIOCGIFFLAGS and SIOCSIFFLAGS read or write
    // exactly one `struct ifreq`, which `req` is, borrowed mutably for the call.
    if unsafe { libc::ioctl(sock.as_raw_fd(), request, req as *mut libc::ifreq) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("interface flags ioctl {request:#x} on {netdev}: {e}"),
        ));
    }
    Ok(())
}

fn invalid(netdev: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{netdev:?} is not an interface name (at most 15 bytes, no NUL)"),
    )
}
