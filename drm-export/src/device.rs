//! DRM devices: enumerating `/dev/dri`, opening card and render nodes, driver identity, and
//! the table of GEM handles each open device file owns.

use crate::error::{Error, Op, Result};
use drm::control::Device as _;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The DRM device folder.
pub const DRI_DIR: &str = "/dev/dri";

/// Which kind of node a DRM device file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeKind {
    /// `/dev/dri/cardN`: modesetting and dumb buffers (needs DRM master or the `video` group).
    Card,
    /// `/dev/dri/renderD128+N`: rendering, GEM, PRIME; no dumb buffers.
    Render,
}

/// The driver behind a DRM node (`DRM_IOCTL_VERSION`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    /// Short name, e.g. `i915`, `amdgpu`, `xe`, `vgem`.
    pub name: String,
    /// `(major, minor, patch)`.
    pub version: (i32, i32, i32),
    /// Human description.
    pub description: String,
}

/// What a DRM device can do with buffers (`DRM_IOCTL_GET_CAP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// `DRM_PRIME_CAP_IMPORT`: dma-bufs can be imported as GEM handles.
    pub prime_import: bool,
    /// `DRM_PRIME_CAP_EXPORT`: GEM handles can be exported as dma-bufs.
    pub prime_export: bool,
    /// `DRM_CAP_DUMB_BUFFER`: dumb buffers can be created (on the card node). `None` when the
    /// driver is not a modesetting driver: the kernel then answers `EOPNOTSUPP` for this
    /// capability, although such drivers (vgem) may still implement dumb buffers.
    pub dumb_buffers: Option<bool>,
}

/// An open DRM device node.
///
/// GEM handles are per open file, and the kernel hands out one handle per buffer and file:
/// `DRM_IOCTL_PRIME_FD_TO_HANDLE` of a dma-buf the file already has a handle for returns that
/// same handle. So the buffers of this crate ([`DumbBuffer`](crate::DumbBuffer),
/// [`GemBuffer`](crate::GemBuffer), [`PrimeImport`](crate::PrimeImport)) do not close their
/// handle themselves: the device keeps a count of owners per handle, and the last owner's drop
/// closes it (`DRM_IOCTL_GEM_CLOSE`). For that reason this type does not implement the `drm`
/// crate's traits (`drm::control::Device::close_buffer` would bypass the count and could close
/// a handle a buffer still owns); the crate calls them on a private view of the file. A program
/// that builds its own `drm` device over [`AsFd::as_fd`] and closes handles itself steps
/// outside this guarantee (no memory error follows: the kernel keeps every buffer alive while
/// a mapping or a dma-buf refers to it, but a later close can then hit another buffer's handle).
#[derive(Debug)]
pub struct DrmDevice {
    file: File,
    path: PathBuf,
    kind: NodeKind,
    driver: DriverInfo,
    /// Owners per GEM handle of this file. Its lock is held across every ioctl that yields a
    /// handle and every close, so a handle is never closed between the kernel returning it and
    /// its count going up.
    handles: Mutex<HashMap<u32, usize>>,
}

impl AsFd for DrmDevice {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

// The proof `sys` asks of a DRM file: `open`, the only constructor, got the driver's name
// from `DRM_IOCTL_VERSION` on it.
impl crate::sys::DrmFile for DrmDevice {
    fn driver_name(&self) -> &str {
        &self.driver.name
    }
}

impl DrmDevice {
    /// The file as the `drm` crate's device traits see it (crate-private: see the type's docs).
    pub(crate) fn ops(&self) -> FileRef<'_> {
        FileRef(&self.file)
    }

    /// Opens a DRM node read-write and asks its driver's identity.
    ///
    /// # Errors
    /// [`Error::Os`] with a hint for `EACCES` (group membership) and `ENOENT`.
    pub fn open(path: impl AsRef<Path>) -> Result<DrmDevice> {
        let path = path.as_ref();
        let kind = node_kind(path).ok_or_else(|| {
            Error::invalid(
                Op::OpenDevice,
                format!("{} is not a DRM card or render node", path.display()),
            )
        })?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::os(Op::OpenDevice, path.display(), e))?;
        let d = drm::Device::get_driver(&FileRef(&file))
            .map_err(|e| Error::os(Op::QueryDriver, path.display(), e))?;
        let driver = DriverInfo {
            name: d.name().to_string_lossy().into_owned(),
            version: d.version,
            description: d.description().to_string_lossy().into_owned(),
        };
        Ok(DrmDevice {
            file,
            path: path.to_path_buf(),
            kind,
            driver,
            handles: Mutex::new(HashMap::new()),
        })
    }

    /// Opens the first node of `kind` whose driver is `driver` (e.g. `vgem`, `i915`).
    ///
    /// # Errors
    /// `ENOENT` with a hint when no such device exists.
    pub fn open_driver(driver: &str, kind: NodeKind) -> Result<DrmDevice> {
        for path in drm_nodes(kind)? {
            if let Ok(dev) = DrmDevice::open(&path) {
                if dev.driver.name == driver {
                    return Ok(dev);
                }
            }
        }
        Err(Error::os(
            Op::OpenDevice,
            format!("{DRI_DIR} ({driver} {kind:?} node)"),
            std::io::Error::from_raw_os_error(libc::ENOENT),
        ))
    }

    /// `DRM_IOCTL_GET_CAP` for PRIME and dumb buffers.
    ///
    /// # Errors
    /// [`Error::Os`] if the query fails.
    pub fn capabilities(&self) -> Result<Capabilities> {
        use drm::{Device as _, DriverCapability};
        let cap = |c| {
            self.ops()
                .get_driver_capability(c)
                .map_err(|e| Error::os(Op::QueryDriver, self.path.display(), e))
        };
        /// `DRM_PRIME_CAP_IMPORT` and `DRM_PRIME_CAP_EXPORT` (drm.h).
        const IMPORT: u64 = 1;
        const EXPORT: u64 = 2;
        let prime = cap(DriverCapability::Prime)?;
        Ok(Capabilities {
            prime_import: prime & IMPORT != 0,
            prime_export: prime & EXPORT != 0,
            dumb_buffers: match self
                .ops()
                .get_driver_capability(DriverCapability::DumbBuffer)
            {
                Ok(v) => Some(v != 0),
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => None,
                Err(e) => return Err(Error::os(Op::QueryDriver, self.path.display(), e)),
            },
        })
    }

    /// The node's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The PCI address of the device behind this node (`0000:00:02.0`), for placing its
    /// buffers near a NIC: the last PCI function on the path that
    /// `/sys/class/drm/<node>/device` leads to (a virtio-gpu's link leads to a `virtioN`
    /// device below its PCI function). `None` for a device that is not on PCI (vgem) or
    /// when sysfs does not say.
    pub fn pci_address(&self) -> Option<String> {
        let node = self.path.canonicalize().ok()?;
        let link = Path::new("/sys/class/drm")
            .join(node.file_name()?)
            .join("device");
        let real = link.canonicalize().ok()?;
        real.iter()
            .rev()
            .filter_map(|c| c.to_str())
            .find(|c| is_pci_address(c))
            .map(str::to_string)
    }

    /// Card or render node.
    pub fn kind(&self) -> NodeKind {
        self.kind
    }

    /// The driver's identity.
    pub fn driver(&self) -> &DriverInfo {
        &self.driver
    }

    /// Runs `produce`, an ioctl that yields a GEM handle of this file (a create, or a PRIME
    /// import, which yields the existing handle when this file already has one for the
    /// buffer), and counts one more owner of the handle that `handle_of` reads from its result.
    /// Every owner gives its reference back with [`DrmDevice::release_handle`] exactly once.
    ///
    /// The table's lock is held across `produce`: otherwise the last owner of a handle could
    /// close it after the kernel returned it to an import and before the count went up.
    pub(crate) fn acquire_handle<T, E>(
        &self,
        produce: impl FnOnce() -> std::result::Result<T, E>,
        handle_of: impl FnOnce(&T) -> drm::buffer::Handle,
    ) -> std::result::Result<T, E> {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        let out = produce()?;
        *handles.entry(u32::from(handle_of(&out))).or_insert(0) += 1;
        Ok(out)
    }

    /// Gives back one owner's reference to `handle`; the last one closes it
    /// (`DRM_IOCTL_GEM_CLOSE`). Called from `Drop`, so failures are logged, not returned.
    pub(crate) fn release_handle(&self, handle: drm::buffer::Handle) {
        let mut handles = self.handles.lock().unwrap_or_else(PoisonError::into_inner);
        let raw = u32::from(handle);
        let Some(count) = handles.get_mut(&raw) else {
            // Not ours to close: some other owner may still use whatever has this number now.
            crate::diag::warn(format_args!(
                "GEM handle {raw} of {} released but not in the handle table; \
                 left open",
                self.path.display()
            ));
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        handles.remove(&raw);
        // Closed with the lock held: an import of the same buffer on another thread cannot
        // get this handle back (and count it) between the removal and the close.
        if let Err(e) = self.ops().close_buffer(handle) {
            crate::diag::warn(format_args!(
                "{}",
                Error::os(
                    Op::GemClose,
                    format!("{} handle {raw}", self.path.display()),
                    e
                )
            ));
        }
    }
}

/// The DRM nodes of `kind` in `/dev/dri`, sorted.
///
/// # Errors
/// [`Error::Os`] if `/dev/dri` cannot be read (an empty list if it does not exist).
pub fn drm_nodes(kind: NodeKind) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(DRI_DIR) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::os(Op::ListDevices, DRI_DIR, e)),
    };
    let mut out: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| node_kind(p) == Some(kind))
        .collect();
    out.sort();
    Ok(out)
}

/// Whether `name` is a PCI address (`dddd:bb:dd.f`, hex).
fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b':',
            10 => *c == b'.',
            _ => c.is_ascii_hexdigit(),
        })
}

fn node_kind(path: &Path) -> Option<NodeKind> {
    let name = path.file_name()?.to_str()?;
    if name.strip_prefix("card").is_some_and(is_number) {
        Some(NodeKind::Card)
    } else if name.strip_prefix("renderD").is_some_and(is_number) {
        Some(NodeKind::Render)
    } else {
        None
    }
}

fn is_number(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// The `drm` crate's calls need a type that implements its traits. This private view of a
/// device file is that type, so that the traits (among them `close_buffer`, which would bypass
/// the handle table) are reachable only from inside this crate.
pub(crate) struct FileRef<'a>(&'a File);
impl AsFd for FileRef<'_> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
impl drm::Device for FileRef<'_> {}
impl drm::control::Device for FileRef<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_classified() {
        assert_eq!(node_kind(Path::new("/dev/dri/card0")), Some(NodeKind::Card));
        assert_eq!(
            node_kind(Path::new("/dev/dri/renderD128")),
            Some(NodeKind::Render)
        );
        assert_eq!(node_kind(Path::new("/dev/dri/by-path")), None);
        assert_eq!(node_kind(Path::new("/dev/dri/card")), None);
    }

    #[test]
    fn pci_addresses_are_told_from_other_sysfs_names() {
        assert!(is_pci_address("0000:00:02.0") && is_pci_address("0000:af:1f.7"));
        for other in [
            "pci0000:00",
            "virtio3",
            "0000:00:02",
            "0000-00:02.0",
            "card0",
        ] {
            assert!(!is_pci_address(other), "{other}");
        }
    }

    #[test]
    fn a_non_drm_path_is_an_invalid_argument() {
        let err = DrmDevice::open("/dev/null").unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err}");
    }
}
