//! Memory registrations (`ibv_reg_mr`, `ibv_reg_dmabuf_mr`, `ibv_reg_dm_mr`,
//! `ibv_dereg_mr`): an MR together with what it covers.
//!
//! A [`Registration`] owns the memory it registered (its backing) and deregisters before
//! the backing drops, so the NIC can never reach memory that was freed. Host memory is
//! registered by address, which is sound only for memory whose address the owner keeps for
//! its whole life: the [`HostMemory`] types of this layer. A dma-buf or device memory is
//! registered by handle: the kernel holds its own reference to what it pins.

use super::dm::DeviceMemory;
use super::host::{HostBuffer, SharedHostBuffer};
use super::pd::ProtectionDomain;
use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;

/// Host memory at an address that stays mapped, and the same, for the owner's whole life,
/// wherever the owner moves; reachable mutably only through slices (never by swapping the
/// owner's mapping for another).
///
/// # Safety
/// [`HostMemory::mapping`] returns the same buffer for the whole life of the value, and the
/// value keeps it mapped.
pub(crate) unsafe trait HostMemory {
    /// The buffer the memory is.
    fn mapping(&self) -> &HostBuffer;
}

// SAFETY: a buffer's memory is its own mapping, unmapped only by its drop, or another owner's,
// kept allocated at its address until the buffer drops (`HostBuffer::from_foreign`'s
// contract).
unsafe impl HostMemory for HostBuffer {
    fn mapping(&self) -> &HostBuffer {
        self
    }
}

// SAFETY: the Arc's buffer cannot be replaced (no `&mut` through an Arc) and lives while the
// handle does.
unsafe impl HostMemory for SharedHostBuffer {
    fn mapping(&self) -> &HostBuffer {
        &self.0
    }
}

/// Backings whose registration the kernel keeps valid by its own reference, so that handing
/// out `&mut` to them (which could swap one for another) cannot leave the MR over freed
/// memory.
///
/// # Safety
/// The registered object is referenced by the kernel's MR, not by an address in this
/// process.
pub(crate) unsafe trait KernelReferenced {}

// SAFETY: `ibv_reg_dm_mr` registers the device memory object; the kernel refuses to free it
// (EBUSY) while an MR uses it.
unsafe impl KernelReferenced for DeviceMemory {}

// SAFETY: `ibv_reg_dmabuf_mr` registers the dma-buf through the kernel's own reference to
// its file (the MR's attachment pins its pages), whatever this process does with its fd.
unsafe impl KernelReferenced for drm_export::DmaBuf {}

/// A live MR over the memory `B` owns, in a protection domain it keeps alive.
pub(crate) struct Registration<B> {
    mr: NonNull<ffi::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    backing: ManuallyDrop<B>,
    addr: u64,
    len: u64,
    access: u32,
    /// The MR's keys, read once at registration (they never change while it is registered).
    lkey: u32,
    rkey: u32,
}

// SAFETY: the MR handle is used only through thread-safe verbs (dereg) and plain reads of its
// keys; the backing is Send.
unsafe impl<B: Send> Send for Registration<B> {}
// SAFETY: `&Registration` exposes only the keys, and shared access to the backing.
unsafe impl<B: Sync> Sync for Registration<B> {}

impl<B> Registration<B> {
    /// Takes ownership of `mr`, just returned (non-null) by a registration over `backing`
    /// in `pd`.
    fn new(
        mr: NonNull<ffi::ibv_mr>,
        pd: &Arc<ProtectionDomain>,
        backing: B,
        addr: u64,
        len: u64,
        access: u32,
    ) -> Self {
        // SAFETY: `mr` was just returned by the library and is live until `dereg`; its keys
        // are plain fields.
        let (lkey, rkey) = unsafe {
            let m = mr.as_ref();
            (m.lkey, m.rkey)
        };
        Registration {
            mr,
            pd: pd.clone(),
            backing: ManuallyDrop::new(backing),
            addr,
            len,
            access,
            lkey,
            rkey,
        }
    }

    /// `ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access)` of the dma-buf `fd_of` finds
    /// in `backing` (the one it is, or holds). The kernel pins and maps the buffer's pages
    /// itself and holds its own reference to the buffer, so no address of this process is
    /// registered.
    ///
    /// # Errors
    /// The OS error of the call, with the backing dropped.
    pub(crate) fn dmabuf(
        pd: &Arc<ProtectionDomain>,
        backing: B,
        fd_of: impl for<'a> FnOnce(&'a B) -> BorrowedFd<'a>,
        offset: u64,
        len: u64,
        iova: u64,
        access: u32,
    ) -> std::result::Result<Self, std::io::Error> {
        let fd = fd_of(&backing).as_raw_fd();
        // SAFETY: `fd` is a live file (`backing`, which holds it, is owned here for the
        // call); the kernel checks it is a dma-buf and references it itself; no user memory
        // is referenced.
        let mr = unsafe {
            ffi::ibv_reg_dmabuf_mr(pd.as_ptr(), offset, len as usize, iova, fd, access as i32)
        };
        let mr = NonNull::new(mr).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Registration::new(mr, pd, backing, iova, len, access))
    }

    /// The MR's address in work requests (host address or iova).
    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        self.addr
    }

    /// Its length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// The access flags it was registered with.
    #[inline]
    pub(crate) fn access(&self) -> u32 {
        self.access
    }

    /// The local key.
    #[inline]
    pub(crate) fn lkey(&self) -> u32 {
        self.lkey
    }

    /// The remote key.
    #[inline]
    pub(crate) fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The protection domain.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The backing, shared.
    pub(crate) fn backing(&self) -> &B {
        &self.backing
    }

    /// The backing, exclusively: only for those the kernel references by handle.
    pub(crate) fn backing_mut(&mut self) -> &mut B
    where
        B: KernelReferenced,
    {
        &mut self.backing
    }

    /// `ibv_dereg_mr`, then the backing back: from here no NIC or peer can reach it.
    ///
    /// # Errors
    /// If deregistration fails, the backing is leaked on purpose (the NIC may still reach
    /// it).
    pub(crate) fn deregister(self) -> Result<B> {
        let mut this = ManuallyDrop::new(self);
        let rc = this.dereg();
        // SAFETY: `this` is never used or dropped again, so reading the field out moves it
        // (once).
        let pd = unsafe { std::ptr::read(&this.pd) };
        // SAFETY: as above, for the backing.
        let backing = unsafe { std::ptr::read(&this.backing) };
        match rc {
            Ok(()) => {
                drop(pd);
                Ok(ManuallyDrop::into_inner(backing))
            }
            Err(e) => {
                // The MR is still live: its PD must not be deallocated under it either.
                std::mem::forget(pd);
                Err(e)
            }
        }
    }

    fn dereg(&mut self) -> Result<()> {
        // SAFETY: `mr` is registered and deregistered exactly once (Drop or deregister).
        let rc = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if rc != 0 {
            return Err(Error::from_errno(
                Op::DeregMr,
                format!("{} region at {:#x}", self.pd.context().name(), self.addr),
                rc,
            ));
        }
        Ok(())
    }
}

impl<B: HostMemory> Registration<B> {
    /// `ibv_reg_mr` over the whole of the host memory `backing` owns.
    ///
    /// # Errors
    /// The OS error of the call, with the backing dropped.
    pub(crate) fn host(
        pd: &Arc<ProtectionDomain>,
        backing: B,
        access: u32,
    ) -> std::result::Result<Self, std::io::Error> {
        let buf = backing.mapping();
        let (addr, len) = (buf.addr(), buf.len());
        // SAFETY: `addr..addr+len` is the mapping `backing` keeps, at that address, for its
        // whole life (`HostMemory`); the registration owns `backing` and deregisters before
        // dropping it.
        let mr = unsafe { ffi::ibv_reg_mr(pd.as_ptr(), addr.cast(), len, access as i32) };
        let mr = NonNull::new(mr).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Registration::new(
            mr,
            pd,
            backing,
            addr as u64,
            len as u64,
            access,
        ))
    }
}

impl Registration<HostBuffer> {
    /// The bytes, writable: `&mut self` is the only way to the buffer.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        self.backing.as_mut_slice()
    }
}

impl Registration<DeviceMemory> {
    /// `ibv_reg_dm_mr` over the whole device memory, zero-based (`IBV_ACCESS_ZERO_BASED` is
    /// added here): work requests address it from 0.
    ///
    /// # Errors
    /// The OS error of the call, with the memory dropped.
    pub(crate) fn device_memory(
        pd: &Arc<ProtectionDomain>,
        dm: DeviceMemory,
        access: u32,
    ) -> std::result::Result<Self, std::io::Error> {
        /// `IBV_ACCESS_ZERO_BASED`, which `ibv_reg_dm_mr` requires.
        const ZERO_BASED: u32 = 1 << 5;
        let len = dm.len();
        // SAFETY: the PD's context is open.
        let reg_dm_mr = unsafe { super::ctx_ops::ctx_op!(pd.context().as_ptr(), reg_dm_mr) }
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))?;
        // SAFETY: the provider's `reg_dm_mr` of the PD's context; live PD and device memory;
        // the registration keeps `dm` until deregistered.
        let mr = unsafe {
            reg_dm_mr(
                pd.as_ptr(),
                dm.as_ptr(),
                0,
                len as usize,
                access | ZERO_BASED,
            )
        };
        let mr = NonNull::new(mr).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Registration::new(mr, pd, dm, 0, len, access))
    }
}

impl<B> Drop for Registration<B> {
    fn drop(&mut self) {
        match self.dereg() {
            // SAFETY: deregistered: the NIC can no longer reach the backing; dropped once.
            Ok(()) => unsafe { ManuallyDrop::drop(&mut self.backing) },
            // The NIC may still reach the memory: leak it rather than free it, and keep the
            // PD the live MR belongs to (one more reference, never dropped).
            Err(e) => {
                std::mem::forget(Arc::clone(&self.pd));
                crate::diag::warn(format_args!(
                    "{e}; leaking the region's memory and its protection domain"
                ))
            }
        }
    }
}

/// The errno of the zero-length dma-buf probe `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)`, or
/// 0 if a region came back (deregistered at once).
pub(crate) fn dmabuf_probe_errno(pd: &ProtectionDomain) -> i32 {
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
