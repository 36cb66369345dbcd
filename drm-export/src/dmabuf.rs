//! [`DmaBuf`]: an owned dma-buf file descriptor with its size and exporter.

use crate::error::{Error, Op, Result};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// An owned dma-buf.
///
/// Obtained from an exporter of this crate, or from any fd through [`DmaBuf::try_from`], which
/// checks that the fd really is a dma-buf. Dropping it closes the fd; importers (a DRM device,
/// an RDMA memory region) hold their own references to the buffer.
#[derive(Debug)]
pub struct DmaBuf {
    fd: OwnedFd,
    size: u64,
    exporter: String,
}

impl DmaBuf {
    /// The buffer's size in bytes (`lseek(fd, 0, SEEK_END)`).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The exporting driver's name, from `/proc/self/fdinfo` (`exp_name:`), e.g. `udmabuf`,
    /// `vgem`, `system`.
    pub fn exporter(&self) -> &str {
        &self.exporter
    }

    /// Gives up the wrapper, returning the fd.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// A second owned fd for the same buffer (`F_DUPFD_CLOEXEC`).
    ///
    /// # Errors
    /// [`Error::Os`] if the process is out of descriptors.
    pub fn try_clone(&self) -> Result<DmaBuf> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|e| Error::os(Op::InspectDmaBuf, self.describe(), e))?;
        Ok(DmaBuf {
            fd,
            size: self.size,
            exporter: self.exporter.clone(),
        })
    }

    fn describe(&self) -> String {
        format!("dma-buf fd {} ({})", self.fd.as_raw_fd(), self.exporter)
    }
}

impl AsFd for DmaBuf {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl TryFrom<OwnedFd> for DmaBuf {
    type Error = Error;

    /// Checks that `fd` is a dma-buf and reads its size and exporter.
    ///
    /// # Errors
    /// [`Error::NotDmaBuf`] for any other kind of fd (regular file, memfd, DRM device...).
    fn try_from(fd: OwnedFd) -> Result<DmaBuf> {
        let raw = fd.as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}"))
            .map_err(|e| Error::os(Op::InspectDmaBuf, format!("fd {raw}"), e))?;
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
        Ok(DmaBuf { fd, size, exporter })
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
    match std::fs::read_link(format!("/proc/self/fd/{raw}")) {
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
