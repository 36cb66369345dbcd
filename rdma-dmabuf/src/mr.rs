//! Memory regions typed by what backs them: [`MemoryRegion<HostBuffer>`] (`ibv_reg_mr`) and
//! [`MemoryRegion<DmaBuf>`] (`ibv_reg_dmabuf_mr`). A region owns its backing and deregisters
//! before releasing it.

use crate::error::{Error, Op, Result, DMABUF_HINT};
use crate::host::{page_size, HostBuffer};
use crate::remote::RemoteRegion;
use crate::sys::mr::{KernelReferenced, Registration};
use crate::sys::pd::ProtectionDomain;
use drm_export::DmaBuf;
use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

bitflags::bitflags! {
    /// What the NIC may do with a region (`ibv_access_flags`). Only the flags valid for both
    /// `ibv_reg_mr` and `ibv_reg_dmabuf_mr` are named here; any other bit (such as
    /// `IBV_ACCESS_ZERO_BASED`, made with `from_bits_retain`) is refused at registration
    /// with a typed error, as is remote write or atomic access without `LOCAL_WRITE`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct Access: u32 {
        /// The local NIC may write (receives, RDMA read targets). Required by every remote
        /// write or atomic access.
        const LOCAL_WRITE = 1;
        /// Peers may RDMA-write.
        const REMOTE_WRITE = 2;
        /// Peers may RDMA-read.
        const REMOTE_READ = 4;
        /// Peers may perform atomics.
        const REMOTE_ATOMIC = 8;
        /// The NIC may reorder writes to this region (PCIe relaxed ordering).
        const RELAXED_ORDERING = 1 << 20;
    }
}

impl Access {
    /// Whether a peer may change the region's bytes.
    pub fn remotely_writable(self) -> bool {
        self.intersects(Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
    }

    pub(crate) fn check(self, op: Op) -> Result<()> {
        let unknown = self.bits() & !Access::all().bits();
        if unknown != 0 {
            return Err(Error::invalid(
                op,
                format!(
                    "access bits {unknown:#x} are not flags of this crate's Access (named: {:?})",
                    Access::all()
                ),
            ));
        }
        if self.remotely_writable() && !self.contains(Access::LOCAL_WRITE) {
            return Err(Error::invalid(
                op,
                format!("{self:?}: remote write or atomic access requires LOCAL_WRITE"),
            ));
        }
        Ok(())
    }
}

/// Keeps [`Backing`] closed to the crate's own types (each `impl` states what `addr`/`len`
/// of a region of that type mean to the verbs).
// Unnameable on purpose: the sealed-trait pattern.
#[allow(unnameable_types)]
pub(crate) mod sealed {
    /// Implemented by the crate's backings only.
    pub trait Sealed {}
    impl Sealed for crate::HostBuffer {}
    impl Sealed for drm_export::DmaBuf {}
}

/// What can back a [`MemoryRegion`]: [`HostBuffer`], [`DmaBuf`] or
/// [`DeviceMemory`](crate::DeviceMemory) (whose impl lives in its own module). Each is
/// `Send + Sync`, so a region's [shards](crate::Shard) may go to other threads.
pub trait Backing: sealed::Sealed + fmt::Debug + Send + Sync + 'static {}
impl Backing for HostBuffer {}
impl Backing for DmaBuf {}

/// A registered memory region owning its backing `B`.
///
/// Its address space for work requests is [`MemoryRegion::addr`]: the virtual address for a
/// host buffer, the iova chosen at registration for a dma-buf (never the dma-buf offset).
pub struct MemoryRegion<B: Backing> {
    /// Behind one pointer: a region moves into every owned request and back out with its
    /// completion, through several frames each time, and a pointer is cheaper to move than
    /// the registration (docs/performance.md, "Instructions per write").
    reg: Box<Registration<B>>,
}

impl<B: Backing> fmt::Debug for MemoryRegion<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.reg.addr()))
            .field("len", &self.reg.len())
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.access())
            .finish()
    }
}

impl MemoryRegion<HostBuffer> {
    /// `ibv_reg_mr` over the whole buffer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for remote write without local write; [`Error::Verbs`]
    /// (`ENOMEM` with a hint on the pinned-memory limit).
    pub fn register(
        pd: &Arc<ProtectionDomain>,
        buffer: HostBuffer,
        access: Access,
    ) -> Result<Self> {
        access.check(Op::RegMr)?;
        let target = host_target(pd, &buffer);
        let reg = Registration::host(pd, buffer, access.bits())
            .map_err(|e| Error::from_errno(Op::RegMr, target, errno_of(&e)))?;
        Ok(MemoryRegion::from_registration(reg))
    }

    /// The bytes, for the CPU.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region: they could change it while
    /// it is read. Use [`MemoryRegion::into_inner`] (after which no peer can) or
    /// [`MemoryRegion::bytes_unchecked`].
    pub fn bytes(&self) -> Result<&[u8]> {
        self.cpu_access()?;
        Ok(self.reg.backing().as_slice())
    }

    /// The bytes, writable by the CPU.
    ///
    /// # Errors
    /// As [`MemoryRegion::bytes`].
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.cpu_access()?;
        Ok(self.reg.bytes_mut())
    }

    /// The bytes of a remotely writable region.
    ///
    /// # Safety
    /// No peer may write the region (RDMA write or atomic with its rkey) while the returned
    /// slice lives: the caller knows so from its protocol (e.g. the peer signalled completion
    /// and writes nothing more).
    #[allow(unsafe_code)] // a promise the caller makes; no unsafe operation inside
    pub unsafe fn bytes_unchecked(&self) -> &[u8] {
        self.reg.backing().as_slice()
    }
}

impl MemoryRegion<DmaBuf> {
    /// `ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)`: registers `len` bytes of
    /// `dmabuf` from `offset`. `iova` is the address work requests (local SGEs and peers'
    /// remote addresses) use for the region's first byte; it defaults to `offset` and must have
    /// the same offset within a page as `offset`. The kernel holds its own reference to the
    /// buffer; the region also keeps the fd, and gives it back from `into_inner`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] with a hint when the provider or kernel has no dma-buf MRs
    /// (`EOPNOTSUPP`; `EPROTONOSUPPORT` before kernel 5.12); [`Error::InvalidArgument`] for
    /// values checked here (length 0, range past the buffer, an iova range that wraps,
    /// iova/offset page offsets differ);
    /// [`Error::Verbs`] for the kernel's refusals.
    pub fn register_dmabuf(
        pd: &Arc<ProtectionDomain>,
        dmabuf: DmaBuf,
        offset: u64,
        len: u64,
        iova: Option<u64>,
        access: Access,
    ) -> Result<Self> {
        let reg = reg_dmabuf(pd, dmabuf, |d| d, offset, len, iova, access)?;
        Ok(MemoryRegion::from_registration(reg))
    }

    /// Maps the dma-buf for the CPU ([`DmaBuf::map`]: sync guards, volatile copies in and out,
    /// never a slice over the shared memory).
    ///
    /// It takes the region exclusively, so the compiler refuses it while the region is posted
    /// (moved into an owned request) or borrowed by a scope's post, for reading as for
    /// writing: the CPU cannot touch what the NIC may be reading or writing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region (they could change it at any
    /// time; [`MemoryRegion::into_inner`] gives the dma-buf back after deregistration);
    /// [`Error::Map`] if the exporter refuses the mapping.
    pub fn map(&mut self) -> Result<drm_export::Mapping<'_>> {
        self.cpu_access()?;
        self.reg
            .backing_mut()
            .map()
            .map_err(|e| Error::Map(Box::new(e)))
    }
}

/// Where a host registration was made, for its errors.
fn host_target(pd: &ProtectionDomain, buffer: &HostBuffer) -> String {
    format!(
        "{} ({} bytes at {:p})",
        pd.context().name(),
        buffer.len(),
        buffer.addr()
    )
}

/// The errno of an OS error (`EIO` if it has none).
fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

/// `ibv_reg_dmabuf_mr` with [`MemoryRegion::register_dmabuf`]'s checks, of the dma-buf `view`
/// finds in `backing`. The kernel holds its own reference to the buffer; the registration
/// keeps the backing all the same, to give it back after deregistration.
pub(crate) fn reg_dmabuf<B>(
    pd: &Arc<ProtectionDomain>,
    backing: B,
    view: impl for<'a> Fn(&'a B) -> &'a DmaBuf,
    offset: u64,
    len: u64,
    iova: Option<u64>,
    access: Access,
) -> Result<Registration<B>> {
    let target = check_dmabuf(pd, view(&backing), offset, len, iova, access)?;
    let iova = iova.unwrap_or(offset);
    Registration::dmabuf(
        pd,
        backing,
        |b| view(b).as_fd(),
        offset,
        len,
        iova,
        access.bits(),
    )
    .map_err(|e| dmabuf_error(pd, e, target))
}

/// [`reg_dmabuf`]'s checks; the target its errors name.
fn check_dmabuf(
    pd: &Arc<ProtectionDomain>,
    dmabuf: &DmaBuf,
    offset: u64,
    len: u64,
    iova: Option<u64>,
    access: Access,
) -> Result<String> {
    access.check(Op::RegDmabufMr)?;
    let iova = iova.unwrap_or(offset);
    let page = page_size() as u64;
    let bad = |what: String| Err(Error::invalid(Op::RegDmabufMr, what));
    if len == 0 {
        return bad("length 0".into());
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > dmabuf.size())
    {
        return bad(format!(
            "offset {offset} + length {len} exceeds the dma-buf's {} bytes",
            dmabuf.size()
        ));
    }
    if iova.checked_add(len).is_none() {
        return bad(format!(
            "iova {iova:#x} + length {len} wraps around the address space"
        ));
    }
    if iova % page != offset % page {
        return bad(format!(
            "iova {iova:#x} and offset {offset:#x} differ in their offset within a page"
        ));
    }
    refuse_misplaced_huge_pages(pd, dmabuf)?;
    let fd = dmabuf.as_fd().as_raw_fd();
    let target = || {
        format!(
            "{} (dma-buf fd {fd} from {}, offset {offset}, length {len}, iova {iova:#x})",
            pd.context().name(),
            dmabuf.exporter()
        )
    };
    Ok(target())
}

/// Why a dma-buf registration failed with `errno`, if that errno means "not supported here".
fn dmabuf_unsupported(errno: i32) -> Option<&'static str> {
    match errno {
        libc::EOPNOTSUPP | crate::error::ENOTSUPP => Some(DMABUF_HINT),
        libc::EPROTONOSUPPORT => Some("the kernel is older than 5.12 and has no dma-buf MRs"),
        _ => None,
    }
}

/// Refuses a udmabuf with large pages on a device that moves data with the CPU when the
/// running kernel's udmabuf maps such pages wrongly: the transfer would report success with
/// the wrong bytes, and reach pages outside the region (drm_export::HUGE_PAGE_VMAP_BUG).
/// The udmabuf's own page frames decide, read when it was made (its pages are pinned from
/// then on); one whose frames are not known is refused too.
///
/// The frames are looked at first: a udmabuf known to have only small pages (the common case)
/// is never refused, so its registration makes no system call here. The kernel and the
/// device are asked (`uname`, `/proc`, `ibv_query_device_ex`: tens of microseconds in the
/// testbed) only for the others.
fn refuse_misplaced_huge_pages(pd: &ProtectionDomain, dmabuf: &DmaBuf) -> Result<()> {
    use drm_export::{HUGE_PAGE_VMAP_BUG, UNKNOWN_UDMABUF_PAGES};
    if dmabuf.exporter() != "udmabuf" {
        return Ok(());
    }
    let why = match dmabuf.udmabuf_small_pages() {
        Some(true) => return Ok(()),
        Some(false) => HUGE_PAGE_VMAP_BUG,
        None => UNKNOWN_UDMABUF_PAGES,
    };
    if !drm_export::running_kernel_misplaces_huge_pages()
        || !pd.context().query_device()?.moves_data_with_the_cpu()
    {
        return Ok(());
    }
    Err(Error::Unsupported {
        op: Op::RegDmabufMr,
        device: pd.context().name().to_string(),
        errno: libc::EOPNOTSUPP,
        why,
    })
}

fn dmabuf_error(pd: &ProtectionDomain, e: std::io::Error, target: String) -> Error {
    let errno = e.raw_os_error().unwrap_or(libc::EIO);
    match dmabuf_unsupported(errno) {
        Some(why) => Error::Unsupported {
            op: Op::RegDmabufMr,
            device: pd.context().name().to_string(),
            errno,
            why,
        },
        None => Error::from_errno(Op::RegDmabufMr, target, errno),
    }
}

/// Whether the device behind `pd` can register dma-bufs: the zero-length probe that NCCL
/// uses, `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)`. `EBADF` (the fd was looked at) means yes;
/// `EOPNOTSUPP`, [`ENOTSUPP`](crate::error::ENOTSUPP) or `EPROTONOSUPPORT` mean no.
///
/// # Errors
/// [`Error::Verbs`] for any other answer.
pub fn supports_dmabuf(pd: &ProtectionDomain) -> Result<bool> {
    match dmabuf_probe_errno(pd) {
        0 | libc::EBADF => Ok(true),
        errno if dmabuf_unsupported(errno).is_some() => Ok(false),
        other => Err(Error::from_errno(
            Op::RegDmabufMr,
            format!("{} (capability probe)", pd.context().name()),
            other,
        )),
    }
}

/// The raw answer of [`supports_dmabuf`]'s probe: the errno of
/// `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)`, or 0 if a region came back (it is deregistered at
/// once). For tools that explain each answer (`EBADF`: the kernel looked at the fd, so the
/// provider and kernel register dma-bufs; `EOPNOTSUPP` or [`ENOTSUPP`](crate::error::ENOTSUPP):
/// the provider or kernel driver has no dma-buf MRs; `EPROTONOSUPPORT`: the kernel predates
/// 5.12).
pub fn dmabuf_probe_errno(pd: &ProtectionDomain) -> i32 {
    crate::sys::mr::dmabuf_probe_errno(pd)
}

impl<B: Backing> MemoryRegion<B> {
    /// The address of the region's first byte in work requests (host address or iova).
    pub fn addr(&self) -> u64 {
        self.reg.addr()
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.reg.len()
    }

    /// Never empty (length 0 is refused at registration).
    pub fn is_empty(&self) -> bool {
        self.reg.len() == 0
    }

    /// The local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.reg.lkey()
    }

    /// The remote key, for peers.
    pub fn rkey(&self) -> u32 {
        self.reg.rkey()
    }

    /// The access granted.
    pub fn access(&self) -> Access {
        Access::from_bits_retain(self.reg.access())
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        self.reg.pd()
    }

    /// What a peer needs to RDMA-read or -write this region: its address (the iova for a
    /// dma-buf), length and rkey. `None` if no remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        self.access()
            .intersects(Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            .then(|| RemoteRegion {
                addr: self.addr(),
                len: self.len(),
                rkey: self.rkey(),
            })
    }

    /// `ibv_dereg_mr`, then the backing back: from here no NIC or peer can reach it.
    ///
    /// # Errors
    /// [`Error::Verbs`] if deregistration fails; the backing is then leaked on purpose, since
    /// the NIC may still reach it.
    pub fn into_inner(self) -> Result<B> {
        (*self.reg).deregister()
    }

    /// The region of a registration just made.
    pub(crate) fn from_registration(reg: Registration<B>) -> Self {
        MemoryRegion { reg: Box::new(reg) }
    }

    /// The backing, for operations that do not touch its bytes (exporting its fences).
    pub(crate) fn backing_unchecked(&self) -> &B {
        self.reg.backing()
    }

    pub(crate) fn backing_mut(&mut self) -> Result<&mut B>
    where
        B: KernelReferenced,
    {
        self.cpu_access()?;
        Ok(self.reg.backing_mut())
    }

    fn cpu_access(&self) -> Result<()> {
        if self.access().remotely_writable() {
            return Err(Error::invalid(
                Op::CpuAccess,
                "the region is remotely writable: a peer may change it at any time; take it \
                 back with into_inner() (deregisters) before reading it",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_not_supported_errno_is_unsupported_with_a_hint() {
        assert_eq!(dmabuf_unsupported(libc::EOPNOTSUPP), Some(DMABUF_HINT));
        assert_eq!(
            dmabuf_unsupported(crate::error::ENOTSUPP),
            Some(DMABUF_HINT)
        );
        assert!(dmabuf_unsupported(libc::EPROTONOSUPPORT).is_some_and(|w| w.contains("5.12")));
        for errno in [libc::EINVAL, libc::EBADF, libc::ENOMEM, libc::EFAULT] {
            assert_eq!(dmabuf_unsupported(errno), None, "errno {errno}");
        }
    }
}
