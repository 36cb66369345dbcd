//! [`DmaBuf`]: an owned dma-buf file descriptor with its size and exporter.

use crate::claim::{BufferId, Claim};
use crate::error::{Error, Op, Result};
use crate::sync_file::{FenceAccess, SyncFile};
use crate::sys;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// An owned dma-buf.
///
/// Obtained from an exporter of this crate, or from any fd through [`DmaBuf::try_from`], which
/// checks that the fd really is a dma-buf. Dropping it closes the fd; importers (a DRM device,
/// an RDMA memory region) hold their own references to the buffer.
///
/// A process has at most one live `DmaBuf` per buffer: making a second one over a buffer a
/// live `DmaBuf` already owns (a dup of its fd, the same GEM object exported again) is
/// refused with [`Error::AlreadyOwned`], so that the buffer cannot be mapped through one while
/// the other is lent to a device. Other processes holding the buffer's fd are outside this
/// (see docs/safety.md).
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    size: u64,
    exporter: String,
    /// This process's one claim on the buffer (dropped with the `DmaBuf`, or by `into_fd`).
    claim: Claim,
    /// For a udmabuf made by [`Udmabuf`](crate::Udmabuf): whether its pages are all small.
    udmabuf_small_pages: Option<bool>,
}

impl DmaBuf {
    /// The buffer's size in bytes: the `size:` line of `/proc/thread-self/fdinfo/<fd>`, read once
    /// by [`DmaBuf::try_from`] (a dma-buf's size is fixed when it is exported).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The exporting driver's name, from `/proc/thread-self/fdinfo` (`exp_name:`), e.g. `udmabuf`,
    /// `system` (a dma-heap), or `drm` for a buffer that a DRM driver exports through the DRM
    /// core's PRIME helpers (vgem's dumb buffers, for one).
    pub fn exporter(&self) -> &str {
        &self.exporter
    }

    /// Gives up the wrapper, returning the fd.
    pub fn into_fd(self) -> OwnedFd {
        // The claim drops here: the fd is the caller's, and a new `DmaBuf` may be made of it.
        self.fd
    }

    /// `DMA_BUF_IOCTL_EXPORT_SYNC_FILE`: a sync_file that signals once the fences an access of
    /// kind `access` would have to wait for have signalled (for [`FenceAccess::Read`]: the writers).
    ///
    /// # Errors
    /// [`Error::Os`] (`ENOTTY` before kernel 6.0).
    pub fn export_sync_file(&self, access: FenceAccess) -> Result<SyncFile> {
        sys::export_sync_file(self, access.flags())
            .map(SyncFile::from_fd)
            .map_err(|e| Error::os(Op::ExportSyncFile, self.describe(), e))
    }

    /// `DMA_BUF_IOCTL_IMPORT_SYNC_FILE`: adds `fence` to the buffer's implicit fences as an
    /// access of kind `access`, so later users of the buffer wait for it.
    ///
    /// # Errors
    /// [`Error::Os`] (`ENOTTY` before kernel 6.0).
    pub fn import_sync_file(&self, access: FenceAccess, fence: &SyncFile) -> Result<()> {
        sys::import_sync_file(self, access.flags(), fence.as_fd())
            .map_err(|e| Error::os(Op::ImportSyncFile, self.describe(), e))
    }

    /// For a udmabuf made by [`Udmabuf`](crate::Udmabuf): whether every one of its pages is
    /// a small page (`Some(false)`: some are parts of larger folios, hugetlb or transparent
    /// huge pages), read from the page frames when it was made (its pages are pinned from then
    /// on). `None` for any other `DmaBuf`, or when the frames could not be read (that needs
    /// `CAP_SYS_ADMIN`). Devices that move data with the CPU cannot use udmabufs with large
    /// pages on kernels with [`HUGE_PAGE_VMAP_BUG`](crate::udmabuf::HUGE_PAGE_VMAP_BUG).
    pub fn udmabuf_small_pages(&self) -> Option<bool> {
        self.udmabuf_small_pages
    }

    /// For a udmabuf made elsewhere (received from another process, exported by another
    /// library: a `DmaBuf` from [`DmaBuf::try_from`]), records that every one of its pages is
    /// a small page, as [`DmaBuf::udmabuf_small_pages`] then reports. Its pages cannot be
    /// looked at from here: a udmabuf's own mapping is a raw page-frame mapping, which
    /// `/proc/self/pagemap` does not show. Without this, a region over such a udmabuf on a
    /// device that moves data with the CPU is refused on kernels with
    /// [`HUGE_PAGE_VMAP_BUG`](crate::udmabuf::HUGE_PAGE_VMAP_BUG).
    ///
    /// # Safety
    /// Every page the udmabuf pins is a small page (its maker checked the page frames, as
    /// [`Udmabuf`](crate::Udmabuf) does, or its memfd cannot have large pages: not hugetlbfs,
    /// and shmem transparent huge pages disabled when its pages were allocated). Otherwise a
    /// soft-RoCE device would read and write pages outside the buffer.
    #[allow(unsafe_code)] // a promise the caller makes; no unsafe operation inside
    pub unsafe fn assume_udmabuf_small_pages(&mut self) {
        if self.exporter == "udmabuf" {
            self.udmabuf_small_pages = Some(true);
        }
    }

    pub(crate) fn set_udmabuf_small_pages(&mut self, small: Option<bool>) {
        self.udmabuf_small_pages = small;
    }

    /// The buffer's identity: `st_dev` and `st_ino` of its dma-buf file.
    pub fn buffer_id(&self) -> BufferId {
        self.claim.id()
    }

    pub(crate) fn describe(&self) -> String {
        format!("dma-buf fd {} ({})", self.fd.as_raw_fd(), self.exporter)
    }
}

impl AsFd for DmaBuf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

// The proof `sys` asks of a dma-buf's file: `try_from`, the only constructor, checked it.
impl sys::DmaBufFile for DmaBuf {
    fn size(&self) -> u64 {
        self.size
    }
}

impl TryFrom<OwnedFd> for DmaBuf {
    type Error = Error;

    /// Checks that `fd` is a dma-buf, reads its size and exporter, and claims the buffer for
    /// this `DmaBuf`.
    ///
    /// # Errors
    /// [`Error::NotDmaBuf`] for any other kind of fd (regular file, memfd, DRM device...);
    /// [`Error::AlreadyOwned`] if a live `DmaBuf` of this process already owns the buffer
    /// (`fd` is then closed; the other `DmaBuf` is untouched).
    fn try_from(fd: OwnedFd) -> Result<DmaBuf> {
        let raw = fd.as_raw_fd();
        let st = nix::sys::stat::fstat(&fd)
            .map_err(|e| Error::os(Op::InspectDmaBuf, format!("fd {raw}"), e.into()))?;
        // Both are u64 on Linux x86_64 and aarch64; `as` keeps other layouts compiling.
        #[allow(clippy::unnecessary_cast)]
        let id = BufferId {
            dev: st.st_dev as u64,
            ino: st.st_ino as u64,
        };
        // `thread-self`, not `self`: a thread that unshared its fd table
        // (`unshare(CLONE_FILES)`) would read the thread-group leader's fd `raw` there,
        // which may be another file.
        let info = std::fs::read_to_string(format!("/proc/thread-self/fdinfo/{raw}"))
            .map_err(|e| Error::os(Op::InspectDmaBuf, format!("fd {raw}"), e))?;
        // And the fdinfo must be this fd's: its inode is the one fstat saw.
        if fdinfo_field(&info, "ino").is_some_and(|i| i.parse::<u64>().ok() != Some(id.ino)) {
            return Err(Error::NotDmaBuf {
                fd: raw,
                what: "its fdinfo describes another file (inode differs from fstat's)".into(),
            });
        }
        let Some(exporter) = fdinfo_field(&info, "exp_name") else {
            return Err(Error::NotDmaBuf {
                fd: raw,
                what: describe_non_dmabuf(raw),
            });
        };
        let exporter = exporter.to_string();
        let size = fdinfo_field(&info, "size")
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::NotDmaBuf {
                fd: raw,
                what: "its fdinfo has no size".into(),
            })?;
        let Some(claim) = Claim::take(id) else {
            return Err(Error::AlreadyOwned {
                fd: raw,
                inode: id.ino,
                exporter,
            });
        };
        Ok(DmaBuf {
            fd,
            size,
            exporter,
            claim,
            udmabuf_small_pages: None,
        })
    }
}

/// The value of `key:` in an fdinfo text.
fn fdinfo_field<'a>(info: &'a str, key: &str) -> Option<&'a str> {
    info.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

fn describe_non_dmabuf(raw: i32) -> String {
    match std::fs::read_link(format!("/proc/thread-self/fd/{raw}")) {
        Ok(target) => format!("it refers to {}", target.display()),
        Err(_) => "it is not an open file descriptor".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    #[test]
    fn regular_file_is_refused() {
        let f = File::open("/proc/self/status").unwrap();
        let err = DmaBuf::try_from(OwnedFd::from(f)).unwrap_err();
        assert!(matches!(err, Error::NotDmaBuf { .. }), "{err}");
        assert!(err.to_string().contains("status"), "{err}");
    }

    #[test]
    fn fdinfo_fields_parse() {
        let info = "pos:\t0\nflags:\t02\nsize:\t4096\ncount:\t1\nexp_name:\tudmabuf\n";
        assert_eq!(fdinfo_field(info, "exp_name"), Some("udmabuf"));
        assert_eq!(fdinfo_field(info, "size"), Some("4096"));
        assert_eq!(fdinfo_field(info, "name"), None);
    }
}
