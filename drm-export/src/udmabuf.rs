//! udmabuf: host memory (a sealed memfd) exported as a dma-buf through `/dev/udmabuf`.

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys;
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// The udmabuf device node.
pub const DEVICE: &str = "/dev/udmabuf";

/// A udmabuf and the memfd whose pages back it.
///
/// The memfd stays open so that the CPU can reach the same pages through it (e.g. to fill the
/// buffer); the dma-buf holds its own reference to the pages either way.
#[derive(Debug)]
pub struct Udmabuf {
    memfd: OwnedFd,
    dmabuf: DmaBuf,
}

impl Udmabuf {
    /// Allocates `size` bytes of host memory as a memfd and exports it as a dma-buf.
    ///
    /// `memfd_create(MFD_ALLOW_SEALING)`, `ftruncate`, `F_ADD_SEALS(F_SEAL_SHRINK)`, then
    /// `UDMABUF_CREATE` with `UDMABUF_FLAGS_CLOEXEC`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `size` is 0 or not page-aligned, or over the driver's
    /// `size_limit_mb`; [`Error::Os`] if the kernel refuses.
    pub fn new(size: u64) -> Result<Udmabuf> {
        check_size(size)?;
        let memfd = memfd_create(
            c"drm-export-udmabuf",
            MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_CLOEXEC,
        )
        .map_err(|e| Error::os(Op::PrepareMemfd, "memfd", e.into()))?;
        nix::unistd::ftruncate(&memfd, size as i64)
            .map_err(|e| Error::os(Op::PrepareMemfd, "memfd", e.into()))?;
        fcntl(&memfd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK))
            .map_err(|e| Error::os(Op::PrepareMemfd, "memfd", e.into()))?;
        let dmabuf = Self::export(&memfd, 0, size)?;
        Ok(Udmabuf { memfd, dmabuf })
    }

    /// Exports `size` bytes at `offset` of an existing memfd (which must carry
    /// `F_SEAL_SHRINK` and must not carry `F_SEAL_WRITE`).
    ///
    /// # Errors
    /// As [`Udmabuf::new`]; `EINVAL` with a hint when the memfd lacks the seal.
    pub fn export(memfd: impl AsFd, offset: u64, size: u64) -> Result<DmaBuf> {
        check_size(size)?;
        if !offset.is_multiple_of(page_size()) {
            return Err(Error::invalid(
                Op::CreateUdmabuf,
                format!("offset {offset} is not a multiple of the page size"),
            ));
        }
        let dev = open_device()?;
        let memfd = memfd.as_fd();
        let fd = sys::udmabuf_create(&dev, memfd, sys::UDMABUF_FLAGS_CLOEXEC, offset, size)
            .map_err(|e| {
                Error::os(
                    Op::CreateUdmabuf,
                    format!("memfd fd {} [{offset}, +{size})", memfd.as_raw_fd()),
                    e,
                )
            })?;
        DmaBuf::try_from(fd)
    }

    /// `UDMABUF_CREATE_LIST`: one dma-buf over several page-aligned ranges of one memfd, in
    /// order.
    ///
    /// # Errors
    /// As [`Udmabuf::export`]; an empty list is an invalid argument.
    pub fn export_list(memfd: impl AsFd, ranges: &[(u64, u64)]) -> Result<DmaBuf> {
        if ranges.is_empty() {
            return Err(Error::invalid(Op::CreateUdmabuf, "empty range list"));
        }
        let memfd = memfd.as_fd();
        for &(offset, size) in ranges {
            check_size(size)?;
            if !offset.is_multiple_of(page_size()) {
                return Err(Error::invalid(
                    Op::CreateUdmabuf,
                    format!("offset {offset} is not a multiple of the page size"),
                ));
            }
        }
        let dev = open_device()?;
        let fd = sys::udmabuf_create_list(&dev, memfd, sys::UDMABUF_FLAGS_CLOEXEC, ranges)
            .map_err(|e| {
                Error::os(
                    Op::CreateUdmabuf,
                    format!("memfd fd {} ({} ranges)", memfd.as_raw_fd(), ranges.len()),
                    e,
                )
            })?;
        DmaBuf::try_from(fd)
    }

    /// The dma-buf.
    pub fn dmabuf(&self) -> &DmaBuf {
        &self.dmabuf
    }

    /// The dma-buf, exclusively (to map it: [`DmaBuf::map`]).
    pub fn dmabuf_mut(&mut self) -> &mut DmaBuf {
        &mut self.dmabuf
    }

    /// The memfd behind the buffer. Writes through it (`pwrite`, a second mapping) change the
    /// dma-buf's bytes; they cannot make this crate misbehave, since its mappings copy with
    /// volatile accesses and hold no slice.
    pub fn memfd(&self) -> &OwnedFd {
        &self.memfd
    }

    /// Splits into the memfd and the dma-buf.
    pub fn into_parts(self) -> (OwnedFd, DmaBuf) {
        (self.memfd, self.dmabuf)
    }
}

fn open_device() -> Result<sys::UdmabufDevice> {
    sys::UdmabufDevice::open().map_err(|e| Error::os(Op::CreateUdmabuf, DEVICE, e))
}

/// The udmabuf driver's per-buffer limit in bytes (`udmabuf.size_limit_mb`), if readable.
pub fn size_limit() -> Option<u64> {
    std::fs::read_to_string("/sys/module/udmabuf/parameters/size_limit_mb")
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|mb| mb << 20)
}

fn check_size(size: u64) -> Result<()> {
    let page = page_size();
    if size == 0 || !size.is_multiple_of(page) {
        return Err(Error::invalid(
            Op::CreateUdmabuf,
            format!("size {size} must be a non-zero multiple of the page size ({page})"),
        ));
    }
    if let Some(limit) = size_limit() {
        if size > limit {
            return Err(Error::invalid(
                Op::CreateUdmabuf,
                format!(
                    "size {size} exceeds udmabuf.size_limit_mb ({} MiB); raise it on the \
                     kernel command line or use several buffers",
                    limit >> 20
                ),
            ));
        }
    }
    Ok(())
}

/// The CPU page size.
pub fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_unaligned_sizes_are_refused_before_the_kernel() {
        for size in [0, 1, 4095, 4097] {
            let err = check_size(size).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        }
    }
}
