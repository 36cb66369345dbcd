//! udmabuf: host memory (a sealed memfd) exported as a dma-buf through `/dev/udmabuf`.
//!
//! The memfd is ordinary shared memory ([`MemfdPages::Shmem`]) or 2 MiB hugetlb pages
//! ([`MemfdPages::Hugetlb2M`]); the dma-buf may start at any page-aligned offset of it, inside a
//! huge page or across several ([`Udmabuf::with_pages`]).

use crate::dmabuf::DmaBuf;
use crate::error::{Error, Op, Result};
use crate::sys::{self, page_size, UDMABUF_DEVICE};
use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// The memory behind a udmabuf's memfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemfdPages {
    /// Shared memory in CPU pages (a plain `memfd_create`).
    Shmem,
    /// hugetlbfs pages of 2 MiB (`MFD_HUGETLB | MFD_HUGE_2MB`), taken from the huge page pool
    /// (`vm.nr_hugepages`, or `hugepages=` on the kernel command line) when the udmabuf is
    /// created.
    Hugetlb2M,
}

impl MemfdPages {
    /// The unit of the memfd's size: the CPU page size, or 2 MiB.
    pub fn page_size(self) -> u64 {
        match self {
            MemfdPages::Shmem => page_size(),
            MemfdPages::Hugetlb2M => 2 << 20,
        }
    }

    fn flags(self) -> MFdFlags {
        let base = MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_CLOEXEC;
        match self {
            MemfdPages::Shmem => base,
            MemfdPages::Hugetlb2M => base | MFdFlags::MFD_HUGETLB | MFdFlags::MFD_HUGE_2MB,
        }
    }
}

/// A memfd that udmabuf accepts: `memfd_create` (`MFD_ALLOW_SEALING`, plus the hugetlb flags
/// of `pages`), `ftruncate` to `size`, `F_ADD_SEALS(F_SEAL_SHRINK)`.
///
/// Its pages are allocated when they are first used; for [`MemfdPages::Hugetlb2M`] that is when
/// a udmabuf is created over them, which fails with `ENOMEM` if the huge page pool has too few
/// free pages.
///
/// # Errors
/// [`Error::InvalidArgument`] if `size` is 0 or not a multiple of [`MemfdPages::page_size`];
/// [`Error::Os`] ([`Op::PrepareMemfd`]) if the kernel refuses, e.g. `EINVAL` from
/// `memfd_create` on a kernel without hugetlbfs.
pub fn sealed_memfd(pages: MemfdPages, size: u64) -> Result<OwnedFd> {
    let unit = pages.page_size();
    if size == 0 || !size.is_multiple_of(unit) {
        return Err(Error::invalid(
            Op::PrepareMemfd,
            format!("memfd size {size} must be a non-zero multiple of {unit} ({pages:?})"),
        ));
    }
    let target = format!("{pages:?} memfd");
    let memfd = memfd_create(c"drm-export-udmabuf", pages.flags())
        .map_err(|e| Error::os(Op::PrepareMemfd, &target, e.into()))?;
    let len = i64::try_from(size)
        .map_err(|_| Error::invalid(Op::PrepareMemfd, format!("memfd size {size} is too large")))?;
    nix::unistd::ftruncate(&memfd, len)
        .map_err(|e| Error::os(Op::PrepareMemfd, &target, e.into()))?;
    fcntl(&memfd, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_SHRINK))
        .map_err(|e| Error::os(Op::PrepareMemfd, &target, e.into()))?;
    Ok(memfd)
}

/// A udmabuf and the memfd whose pages back it.
///
/// The memfd stays open so that the CPU can reach the same pages through it (e.g. to fill the
/// buffer); the dma-buf holds its own reference to the pages either way.
#[derive(Debug)]
pub struct Udmabuf {
    memfd: OwnedFd,
    offset: u64,
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
        Self::with_pages(MemfdPages::Shmem, size, 0, size)
    }

    /// Allocates a sealed memfd of `memfd_size` bytes backed by `pages` ([`sealed_memfd`])
    /// and exports `size` bytes of it at `offset` as a dma-buf (`UDMABUF_CREATE`).
    ///
    /// `offset` and `size` need only be multiples of the CPU page size, also with huge pages:
    /// the dma-buf may start inside a huge page and span several.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `offset` or `size` is not page-aligned, `size` is 0 or
    /// over `udmabuf.size_limit_mb`, `memfd_size` is not a multiple of
    /// [`MemfdPages::page_size`], or the range ends past `memfd_size`; [`Error::Os`] if the
    /// kernel refuses (`ENOMEM` with a hint when the huge page pool is short).
    pub fn with_pages(
        pages: MemfdPages,
        memfd_size: u64,
        offset: u64,
        size: u64,
    ) -> Result<Udmabuf> {
        check_range(offset, size)?;
        if offset.checked_add(size).is_none_or(|end| end > memfd_size) {
            return Err(Error::invalid(
                Op::CreateUdmabuf,
                format!("range [{offset}, +{size}) ends past the memfd's {memfd_size} bytes"),
            ));
        }
        let memfd = sealed_memfd(pages, memfd_size)?;
        let dmabuf = Self::export(&memfd, offset, size)?;
        Ok(Udmabuf {
            memfd,
            offset,
            dmabuf,
        })
    }

    /// Exports `size` bytes at `offset` of an existing memfd (which must carry
    /// `F_SEAL_SHRINK` and must not carry `F_SEAL_WRITE`).
    ///
    /// # Errors
    /// As [`Udmabuf::new`]; `EINVAL` with a hint when the memfd lacks the seal.
    pub fn export(memfd: impl AsFd, offset: u64, size: u64) -> Result<DmaBuf> {
        check_range(offset, size)?;
        let dev = open_device()?;
        let memfd = memfd.as_fd();
        let (fd, small) =
            sys::udmabuf_create(&dev, memfd, sys::UDMABUF_FLAGS_CLOEXEC, offset, size).map_err(
                |e| {
                    Error::os(
                        Op::CreateUdmabuf,
                        format!("memfd fd {} [{offset}, +{size})", memfd.as_raw_fd()),
                        e,
                    )
                },
            )?;
        let mut buf = DmaBuf::try_from(fd)?;
        buf.set_udmabuf_small_pages(small);
        Ok(buf)
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
            check_range(offset, size)?;
        }
        let dev = open_device()?;
        let (fd, small) = sys::udmabuf_create_list(&dev, memfd, sys::UDMABUF_FLAGS_CLOEXEC, ranges)
            .map_err(|e| {
                Error::os(
                    Op::CreateUdmabuf,
                    format!("memfd fd {} ({} ranges)", memfd.as_raw_fd(), ranges.len()),
                    e,
                )
            })?;
        let mut buf = DmaBuf::try_from(fd)?;
        buf.set_udmabuf_small_pages(small);
        Ok(buf)
    }

    /// The dma-buf.
    pub fn dmabuf(&self) -> &DmaBuf {
        &self.dmabuf
    }

    /// The dma-buf, exclusively (to map it: [`DmaBuf::map`]).
    pub fn dmabuf_mut(&mut self) -> &mut DmaBuf {
        &mut self.dmabuf
    }

    /// Where the dma-buf's first byte lies in [`Udmabuf::memfd`].
    pub fn offset(&self) -> u64 {
        self.offset
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

/// The udmabuf bug that makes devices which move data with the CPU (soft-RoCE `rxe`, `siw`)
/// read and write the wrong bytes of a udmabuf over huge pages.
pub const HUGE_PAGE_VMAP_BUG: &str = "udmabuf's kernel mapping (vmap) on Linux 6.10 to 6.16 \
    shows the first 4 KiB page of each large page in place of every page of it (fixed by \
    \"udmabuf: fix vmap missed offset page\": Linux 6.17, and 6.16.y stable from August 2025; \
    6.12.y has no fix as of 6.12.117), so a device that moves data through that mapping \
    (soft-RoCE rxe, siw) would move the wrong bytes, and reach pages outside the region; \
    user mappings and DMA by a hardware NIC are right. This udmabuf has large pages (a \
    hugetlbfs memfd, or shmem that transparent huge pages backed when its pages were \
    allocated). Use a udmabuf over an ordinary memfd (MemfdPages::Shmem) filled while shmem \
    transparent huge pages were off, or a kernel with the fix";

/// Why a udmabuf whose pages could not be looked at is refused where
/// [`HUGE_PAGE_VMAP_BUG`] applies.
pub const UNKNOWN_UDMABUF_PAGES: &str = "whether this udmabuf's pages are large cannot be told \
    (it was not made by drm_export::Udmabuf in this process, or its page frames could not be \
    read from /proc/self/pagemap and /proc/kpageflags, which needs CAP_SYS_ADMIN), and on this kernel udmabuf's vmap misplaces large pages (Linux 6.10 to \
    6.16; see drm_export::HUGE_PAGE_VMAP_BUG): a device that moves data through that \
    mapping (soft-RoCE rxe, siw) might move the wrong bytes. Make it with Udmabuf::export from \
    its memfd, as root, or use a kernel with \"udmabuf: fix vmap missed offset page\"";

/// Whether the kernel `release` (`uname -r`, e.g. `6.12.117+deb12-amd64`) may have
/// [`HUGE_PAGE_VMAP_BUG`]: 6.10 (when udmabuf took huge pages as folios again) up to 6.16.
/// 6.16 counts as affected although its later stable releases have the fix, since which one
/// first did cannot be told from the release string alone.
pub fn vmap_misplaces_huge_pages(release: &str) -> bool {
    let mut parts = release.split(['.', '-', '+']).map(str::parse::<u32>);
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (6, 10) <= (major, minor) && (major, minor) < (6, 17),
        // Unknown: say affected (a refusal, rather than wrong bytes reported as success).
        _ => true,
    }
}

/// [`vmap_misplaces_huge_pages`] for the running kernel, as both `uname` and
/// `/proc/sys/kernel/osrelease` tell it: affected if either says so or cannot be read (a
/// process can make `uname` lie about itself with `personality(UNAME26)`).
pub fn running_kernel_misplaces_huge_pages() -> bool {
    let uname = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let proc = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    vmap_misplaces_huge_pages(uname.trim()) || vmap_misplaces_huge_pages(proc.trim())
}

fn open_device() -> Result<sys::UdmabufDevice> {
    sys::UdmabufDevice::open().map_err(|e| Error::os(Op::CreateUdmabuf, UDMABUF_DEVICE, e))
}

/// The udmabuf driver's per-buffer limit in bytes (`udmabuf.size_limit_mb`), if readable.
pub fn udmabuf_size_limit() -> Option<u64> {
    std::fs::read_to_string("/sys/module/udmabuf/parameters/size_limit_mb")
        .ok()?
        .trim()
        .parse::<u64>()
        .ok()
        .map(|mb| mb << 20)
}

/// A udmabuf range's checks: a page-aligned offset, and [`check_size`].
fn check_range(offset: u64, size: u64) -> Result<()> {
    check_size(size)?;
    if !offset.is_multiple_of(page_size()) {
        return Err(Error::invalid(
            Op::CreateUdmabuf,
            format!("offset {offset} is not a multiple of the page size"),
        ));
    }
    Ok(())
}

fn check_size(size: u64) -> Result<()> {
    let page = page_size();
    if size == 0 || !size.is_multiple_of(page) {
        return Err(Error::invalid(
            Op::CreateUdmabuf,
            format!("size {size} must be a non-zero multiple of the page size ({page})"),
        ));
    }
    if let Some(limit) = udmabuf_size_limit() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_huge_page_vmap_bug_is_told_by_release() {
        for (release, affected) in [
            ("6.12.117+deb12-amd64", true),
            ("6.10.0", true),
            ("6.16.3-arch1-1", true),
            ("6.9.12", false),
            ("6.17.0-rc1", false),
            ("7.0.1", false),
            ("6.1.0-37-amd64", false),
            ("garbage", true),
        ] {
            assert_eq!(vmap_misplaces_huge_pages(release), affected, "{release}");
        }
    }

    #[test]
    fn zero_and_unaligned_sizes_are_refused_before_the_kernel() {
        for size in [0, 1, 4095, 4097] {
            let err = check_size(size).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
        }
    }

    #[test]
    fn hugetlb_memfd_sizes_and_ranges_past_the_memfd_are_refused_before_the_kernel() {
        let huge = MemfdPages::Hugetlb2M.page_size();
        assert_eq!(huge, 2 << 20);
        for size in [0, 4096, huge + 4096] {
            let err = sealed_memfd(MemfdPages::Hugetlb2M, size).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidArgument {
                        op: Op::PrepareMemfd,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("multiple of 2097152"), "{err}");
        }
        let page = page_size();
        for (offset, size) in [(huge - page, 2 * page), (u64::MAX - page + 1, page)] {
            let err = Udmabuf::with_pages(MemfdPages::Hugetlb2M, huge, offset, size).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::InvalidArgument {
                        op: Op::CreateUdmabuf,
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("ends past"), "{err}");
        }
        let err = Udmabuf::with_pages(MemfdPages::Hugetlb2M, huge, 100, page).unwrap_err();
        assert!(err.to_string().contains("offset 100"), "{err}");
    }
}
