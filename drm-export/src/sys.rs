//! The raw layer: `repr(C)` uapi structs and ioctl wrappers. The only module with `unsafe`.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

/// `struct udmabuf_create` (include/uapi/linux/udmabuf.h).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct UdmabufCreate {
    pub memfd: u32,
    pub flags: u32,
    pub offset: u64,
    pub size: u64,
}

/// `UDMABUF_FLAGS_CLOEXEC`.
pub const UDMABUF_FLAGS_CLOEXEC: u32 = 0x01;

nix::ioctl_write_ptr!(udmabuf_create_ioctl, b'u', 0x42, UdmabufCreate);

/// `UDMABUF_CREATE` on `dev` (an open `/dev/udmabuf`): returns the new dma-buf.
pub fn udmabuf_create(dev: BorrowedFd<'_>, arg: &UdmabufCreate) -> io::Result<OwnedFd> {
    // SAFETY: UDMABUF_CREATE is _IOW('u', 0x42, struct udmabuf_create); `arg` points to a live
    // `repr(C)` struct of exactly that layout (checked by the layout test below), which the
    // kernel only reads.
    let fd = unsafe { udmabuf_create_ioctl(std::os::fd::AsRawFd::as_raw_fd(&dev), arg) }
        .map_err(io::Error::from)?;
    // SAFETY: on success the ioctl returns a new file descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod layout {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets from include/uapi/linux/udmabuf.h.
    #[test]
    fn udmabuf_create_matches_uapi() {
        assert_eq!(size_of::<UdmabufCreate>(), 24);
        assert_eq!(offset_of!(UdmabufCreate, memfd), 0);
        assert_eq!(offset_of!(UdmabufCreate, flags), 4);
        assert_eq!(offset_of!(UdmabufCreate, offset), 8);
        assert_eq!(offset_of!(UdmabufCreate, size), 16);
        // _IOW('u', 0x42, 24 bytes)
        assert_eq!(nix::request_code_write!(b'u', 0x42, 24), 0x4018_7542);
    }
}
