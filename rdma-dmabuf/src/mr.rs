//! Memory regions typed by what backs them: [`MemoryRegion<HostBuffer>`] (`ibv_reg_mr`) and
//! [`MemoryRegion<DmaBuf>`] (`ibv_reg_dmabuf_mr`). A region owns its backing and deregisters
//! before releasing it.

use crate::error::{Error, Op, Result, DMABUF_HINT};
use crate::host::{page_size, HostBuffer};
use crate::sys::pd::ProtectionDomain;
use crate::remote::RemoteRegion;
use drm_export::DmaBuf;
use rdma_sys as ffi;
use std::fmt;
use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;
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

/// What a [`MemoryRegion`] is: the MR, what keeps it valid, and its keys as registered.
struct Registration<B: Backing> {
    mr: NonNull<ffi::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    backing: ManuallyDrop<B>,
    addr: u64,
    len: u64,
    access: Access,
    /// The MR's keys, read once at registration (they never change while it is registered).
    lkey: u32,
    rkey: u32,
}

// SAFETY: the MR handle is used only through thread-safe verbs (dereg) and plain reads of its
// keys; the backing is Send.
unsafe impl<B: Backing> Send for MemoryRegion<B> {}
// SAFETY: `&MemoryRegion` exposes only the keys, and shared access to the backing where safe.
unsafe impl<B: Backing> Sync for MemoryRegion<B> {}

impl<B: Backing> fmt::Debug for MemoryRegion<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.reg.addr))
            .field("len", &self.reg.len)
            .field("lkey", &self.lkey())
            .field("rkey", &self.rkey())
            .field("access", &self.reg.access)
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
        let mr = reg_host_mr(pd, &buffer, access)?;
        let (addr, len) = (buffer.addr() as u64, buffer.len() as u64);
        // SAFETY: `mr` was just registered in `pd` over `buffer`'s mapping, which the region
        // keeps; nothing else has the MR.
        Ok(unsafe { MemoryRegion::from_parts(mr, pd, buffer, addr, len, access) })
    }

    /// The bytes, for the CPU.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if peers may write the region: they could change it while
    /// it is read. Use [`MemoryRegion::into_inner`] (after which no peer can) or
    /// [`MemoryRegion::bytes_unchecked`].
    pub fn bytes(&self) -> Result<&[u8]> {
        self.cpu_access()?;
        Ok(self.reg.backing.as_slice())
    }

    /// The bytes, writable by the CPU.
    ///
    /// # Errors
    /// As [`MemoryRegion::bytes`].
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.cpu_access()?;
        Ok(self.reg.backing.as_mut_slice())
    }

    /// The bytes of a remotely writable region.
    ///
    /// # Safety
    /// No peer may write the region (RDMA write or atomic with its rkey) while the returned
    /// slice lives: the caller knows so from its protocol (e.g. the peer signalled completion
    /// and writes nothing more).
    pub unsafe fn bytes_unchecked(&self) -> &[u8] {
        self.reg.backing.as_slice()
    }

    /// The buffer's first byte, for volatile reads (`watch`).
    pub(crate) fn host_ptr(&self) -> *const u8 {
        self.reg.backing.addr()
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
        let (mr, iova) = reg_dmabuf_mr(pd, &dmabuf, offset, len, iova, access)?;
        // SAFETY: `reg_dmabuf_mr` just registered `mr` in `pd` over `dmabuf`; nothing else has it.
        Ok(unsafe { MemoryRegion::from_parts(mr, pd, dmabuf, iova, len, access) })
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
        self.reg.backing.map().map_err(|e| Error::Map(Box::new(e)))
    }
}

/// `ibv_reg_dmabuf_mr` with [`MemoryRegion::register_dmabuf`]'s checks; the new MR and its
/// iova. The kernel holds its own reference to the buffer; the caller keeps the dma-buf with
/// the region all the same, to give it back after deregistration.
/// `ibv_reg_mr` over the whole of `buffer`. The caller keeps `buffer` (its mapping) alive
/// until the MR is deregistered: the region it builds owns it, or a handle of it.
pub(crate) fn reg_host_mr(
    pd: &ProtectionDomain,
    buffer: &HostBuffer,
    access: Access,
) -> Result<NonNull<ffi::ibv_mr>> {
    access.check(Op::RegMr)?;
    let addr = buffer.addr();
    // SAFETY: `addr..addr+len` is the anonymous mapping owned by `buffer` (moving a
    // HostBuffer moves only its pointer, never the mapping); the caller keeps it until
    // ibv_dereg_mr.
    let mr =
        unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.cast(), buffer.len(), access.bits() as i32) };
    NonNull::new(mr).ok_or_else(|| {
        Error::last_os(
            Op::RegMr,
            format!(
                "{} ({} bytes at {addr:p})",
                pd.context().name(),
                buffer.len()
            ),
        )
    })
}

pub(crate) fn reg_dmabuf_mr(
    pd: &Arc<ProtectionDomain>,
    dmabuf: &DmaBuf,
    offset: u64,
    len: u64,
    iova: Option<u64>,
    access: Access,
) -> Result<(NonNull<ffi::ibv_mr>, u64)> {
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
    // SAFETY: `fd` is a live dma-buf (`dmabuf` is borrowed for the call); the kernel
    // pins and maps the buffer's pages itself, so no user memory is referenced.
    let mr = unsafe {
        ffi::ibv_reg_dmabuf_mr(
            pd.as_ptr(),
            offset,
            len as usize,
            iova,
            fd,
            access.bits() as i32,
        )
    };
    let mr = NonNull::new(mr)
        .ok_or_else(|| dmabuf_error(pd, std::io::Error::last_os_error(), target()))?;
    Ok((mr, iova))
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
    // SAFETY: fd -1 and length 0 reference no memory; a (never expected) MR is deregistered.
    let mr = unsafe { ffi::ibv_reg_dmabuf_mr(pd.as_ptr(), 0, 0, 0, -1, 0) };
    if !mr.is_null() {
        // SAFETY: `mr` was just returned and is deregistered once.
        unsafe { ffi::ibv_dereg_mr(mr) };
        return 0;
    }
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

impl<B: Backing> MemoryRegion<B> {
    /// The address of the region's first byte in work requests (host address or iova).
    pub fn addr(&self) -> u64 {
        self.reg.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.reg.len
    }

    /// Never empty (length 0 is refused at registration).
    pub fn is_empty(&self) -> bool {
        self.reg.len == 0
    }

    /// The local key, for SGEs.
    pub fn lkey(&self) -> u32 {
        self.reg.lkey
    }

    /// The remote key, for peers.
    pub fn rkey(&self) -> u32 {
        self.reg.rkey
    }

    /// The access granted.
    pub fn access(&self) -> Access {
        self.reg.access
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.reg.pd
    }

    /// What a peer needs to RDMA-read or -write this region: its address (the iova for a
    /// dma-buf), length and rkey. `None` if no remote access was granted.
    pub fn remote(&self) -> Option<RemoteRegion> {
        self.reg
            .access
            .intersects(Access::REMOTE_READ | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC)
            .then(|| RemoteRegion {
                addr: self.reg.addr,
                len: self.reg.len,
                rkey: self.rkey(),
            })
    }

    /// `ibv_dereg_mr`, then the backing back: from here no NIC or peer can reach it.
    ///
    /// # Errors
    /// [`Error::Verbs`] if deregistration fails; the backing is then leaked on purpose, since
    /// the NIC may still reach it.
    pub fn into_inner(self) -> Result<B> {
        let mut this = ManuallyDrop::new(self);
        let rc = this.dereg();
        // SAFETY: `this` is never used or dropped again, so reading the field out moves it.
        let reg = unsafe { std::ptr::read(&this.reg) };
        let Registration { pd, backing, .. } = *reg;
        drop(pd);
        match rc {
            Ok(()) => Ok(ManuallyDrop::into_inner(backing)),
            Err(e) => Err(e),
        }
    }

    fn dereg(&mut self) -> Result<()> {
        // SAFETY: `mr` is registered and deregistered exactly once (Drop or into_inner).
        let rc = unsafe { ffi::ibv_dereg_mr(self.reg.mr.as_ptr()) };
        if rc != 0 {
            return Err(Error::from_errno(
                Op::DeregMr,
                format!(
                    "{} region at {:#x}",
                    self.reg.pd.context().name(),
                    self.reg.addr
                ),
                rc,
            ));
        }
        Ok(())
    }

    /// The region of a registration just made: `mr` over `len` bytes of `backing` at `addr`
    /// (in work requests), in `pd`, with `access`.
    ///
    /// # Safety
    /// `mr` is a live MR of `pd`, registered over `backing`'s memory (which the region then
    /// keeps until after `ibv_dereg_mr`), and nothing else deregisters it: the region owns it.
    pub(crate) unsafe fn from_parts(
        mr: NonNull<ffi::ibv_mr>,
        pd: &Arc<ProtectionDomain>,
        backing: B,
        addr: u64,
        len: u64,
        access: Access,
    ) -> Self {
        // SAFETY: `mr` is live (this function's contract) until `dereg`; its keys are plain
        // fields.
        let (lkey, rkey) = unsafe {
            let m = mr.as_ref();
            (m.lkey, m.rkey)
        };
        MemoryRegion {
            reg: Box::new(Registration {
                mr,
                pd: pd.clone(),
                backing: ManuallyDrop::new(backing),
                addr,
                len,
                access,
                lkey,
                rkey,
            }),
        }
    }

    /// The backing, for operations that do not touch its bytes (exporting its fences).
    pub(crate) fn backing_unchecked(&self) -> &B {
        &self.reg.backing
    }

    pub(crate) fn backing_mut(&mut self) -> Result<&mut B> {
        self.cpu_access()?;
        Ok(&mut self.reg.backing)
    }

    fn cpu_access(&self) -> Result<()> {
        if self.reg.access.remotely_writable() {
            return Err(Error::invalid(
                Op::CpuAccess,
                "the region is remotely writable: a peer may change it at any time; take it \
                 back with into_inner() (deregisters) before reading it",
            ));
        }
        Ok(())
    }
}

impl<B: Backing> Drop for MemoryRegion<B> {
    fn drop(&mut self) {
        match self.dereg() {
            // SAFETY: deregistered: the NIC can no longer reach the backing; dropped once.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.reg.backing) },
            // The NIC may still reach the memory: leak it rather than free it.
            Err(e) => crate::diag::warn(format_args!("{e}; leaking the region's memory")),
        }
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
