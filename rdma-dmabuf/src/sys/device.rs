//! Devices and their contexts (`ibv_get_device_list`, `ibv_open_device`, the queries).

use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// A device of the list: its name and node GUID (network byte order, as the verbs give it).
pub(crate) struct ListedDevice {
    pub(crate) name: String,
    pub(crate) guid_be: u64,
}

/// The devices `ibv_get_device_list` lists.
pub(crate) fn list() -> Result<Vec<ListedDevice>> {
    with_device_list(|list| {
        Ok(list
            .iter()
            .map(|&d| ListedDevice {
                // SAFETY: `d` is a live entry of the device list (see with_device_list).
                name: unsafe { device_name(d) },
                // SAFETY: as above.
                guid_be: unsafe { ffi::ibv_get_device_guid(d) },
            })
            .collect())
    })
}

/// Calls `f` with the device list, freeing it afterwards.
fn with_device_list<T>(f: impl FnOnce(&[*mut ffi::ibv_device]) -> Result<T>) -> Result<T> {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; the returned array is freed below.
    let list = unsafe { ffi::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(Error::last_os(Op::ListDevices, "this host"));
    }
    // SAFETY: libibverbs returns `n` valid device pointers, alive until the list is freed.
    let slice = unsafe { std::slice::from_raw_parts(list, n.max(0) as usize) };
    let out = f(slice);
    // SAFETY: `list` came from ibv_get_device_list and is freed once; contexts opened from
    // its entries stay valid after the free (libibverbs documents this).
    unsafe { ffi::ibv_free_device_list(list) };
    out
}

/// The name of device `d`.
///
/// # Safety
/// `d` is a live device: an entry of a device list not yet freed, or the `device` of an open
/// context.
unsafe fn device_name(d: *mut ffi::ibv_device) -> String {
    // SAFETY: `d` is a live device (this function's contract).
    let name = unsafe { ffi::ibv_get_device_name(d) };
    // SAFETY: the name is a NUL-terminated string owned by the device, alive with it.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// An open device (`ibv_context`). Closed when the last [`Arc`] to it (held by every child
/// object) goes.
///
/// A context that a connection manager object returned ([`CmListener::context`],
/// [`CmConnector::context`]) is librdmacm's own: this value then holds librdmacm's device
/// list (`rdma_get_devices`), which keeps librdmacm from closing the context while anything
/// made from it lives, even after the device was removed (`rdma link delete`, a hot unplug).
/// The list is freed (`rdma_free_devices`) when the last [`Arc`] goes; if the device was
/// removed meanwhile, librdmacm closes its context then, and the kernel's removal of the
/// device can complete. (Getting the list also makes librdmacm open every device it lists,
/// as it opens those it routes through; it keeps a device it opened open until a check of
/// its device list finds the device removed and unreferenced: see
/// [`release_removed_devices`].)
///
/// [`release_removed_devices`]: crate::cm::release_removed_devices
/// [`CmListener::context`]: crate::CmListener::context
/// [`CmConnector::context`]: crate::CmConnector::context
pub struct Context {
    ctx: NonNull<ffi::ibv_context>,
    name: String,
    /// Who closes the context.
    owner: Owner,
}

/// Who closes a [`Context`]'s `ibv_context`.
enum Owner {
    /// [`Context::open`] opened it: closed on drop.
    Opened,
    /// librdmacm's: the device list from `rdma_get_devices` (NULL-terminated, the context
    /// among its entries), which holds a reference on each listed device in librdmacm
    /// (`cma_device.refcnt`); librdmacm closes a removed device's context only once no
    /// reference is left. Freed with `rdma_free_devices` on drop.
    Rdmacm(NonNull<*mut ffi::ibv_context>),
}

// SAFETY: libibverbs contexts are thread-safe: every verb on a context may be called from any
// thread (the library serialises internally where the provider needs it); librdmacm's device
// list is freed under librdmacm's own lock, from whichever thread drops the last Arc.
unsafe impl Send for Context {}
// SAFETY: as above.
unsafe impl Sync for Context {}

impl fmt::Debug for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

impl Context {
    /// `ibv_open_device` on the device called `name`.
    ///
    /// # Errors
    /// `ENODEV` with a hint if there is no such device.
    pub fn open(name: &str) -> Result<Arc<Context>> {
        with_device_list(|list| {
            let dev = list
                .iter()
                .copied()
                // SAFETY: `d` is a live entry of the device list (see with_device_list).
                .find(|&d| unsafe { device_name(d) } == name)
                .ok_or_else(|| {
                    let known: Vec<String> = list
                        .iter()
                        // SAFETY: as above.
                        .map(|&d| unsafe { device_name(d) })
                        .collect();
                    Error::from_errno(
                        Op::OpenDevice,
                        format!(
                            "{name} (devices: {})",
                            if known.is_empty() {
                                "none".into()
                            } else {
                                known.join(", ")
                            }
                        ),
                        libc::ENODEV,
                    )
                })?;
            // SAFETY: `dev` is a live entry of the list.
            let ctx = unsafe { ffi::ibv_open_device(dev) };
            let ctx = NonNull::new(ctx).ok_or_else(|| Error::last_os(Op::OpenDevice, name))?;
            Ok(Arc::new(Context {
                ctx,
                name: name.to_string(),
                owner: Owner::Opened,
            }))
        })
    }

    /// Wraps a context librdmacm opened (a `rdma_cm_id`'s `verbs`), without taking it over,
    /// and keeps it open: holds librdmacm's device list (`rdma_get_devices`), which counts a
    /// reference on every device it lists, until the returned value drops.
    ///
    /// librdmacm does not keep its contexts for the life of the process: a check of its device
    /// list (run by `rdma_get_devices`, and by `rdma_bind_addr` / `rdma_resolve_addr` when
    /// they land on a device it has not seen) closes the context of a device that has gone
    /// and that nothing references, or marks it dead and closes it when the last reference
    /// (a cm id, a device list) goes. The list held here is such a reference.
    ///
    /// # Errors
    /// `ENODEV` if librdmacm no longer lists the context (its device was removed and a
    /// check of the device list has marked it dead), or the error of `rdma_get_devices`.
    ///
    /// # Safety
    /// `ctx` is a context librdmacm opened (an `rdma_cm_id`'s `verbs`) and is open for the
    /// duration of this call: the cm id it came from is alive (its reference keeps it open).
    pub(in crate::sys) unsafe fn borrowed(ctx: NonNull<ffi::ibv_context>) -> Result<Arc<Context>> {
        let mut n = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below or in Drop.
        let list = unsafe { ffi::rdma_get_devices(&mut n) };
        let list = NonNull::new(list).ok_or_else(|| Error::last_os(Op::Cm, "rdma_get_devices"))?;
        // SAFETY: librdmacm returns an array of `n` live contexts (plus a NULL terminator),
        // valid until it is freed.
        let entries = unsafe { std::slice::from_raw_parts(list.as_ptr(), n.max(0) as usize) };
        if !entries.contains(&ctx.as_ptr()) {
            // SAFETY: the list came from rdma_get_devices and is freed once; nothing of ours
            // uses its entries.
            unsafe { ffi::rdma_free_devices(list.as_ptr()) };
            return Err(Error::from_errno(
                Op::Cm,
                "the id's device (librdmacm no longer lists it: it was removed)",
                libc::ENODEV,
            ));
        }
        // The list now holds a reference on the context, so it stays open while this value
        // lives.
        let owner = Owner::Rdmacm(list);
        // SAFETY: the context is open (the list references it), so its `device` is live.
        let dev = unsafe { ctx.as_ref() }.device;
        Ok(Arc::new(Context {
            ctx,
            // SAFETY: the device of an open context is live while the context is open.
            name: unsafe { device_name(dev) },
            owner,
        }))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The context's address, as a value that identifies it (in the list of queue pairs
    /// fatal events flush).
    pub(crate) fn id(&self) -> usize {
        self.ctx.as_ptr() as usize
    }

    /// The `ibv_context`, for the calls of this layer that take it.
    pub(in crate::sys) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ctx.as_ptr()
    }

    /// `ibv_query_device_ex` into a zeroed struct (the fallback to `ibv_query_device`, for
    /// providers without the extended query, fills only `orig_attr`).
    ///
    /// # Errors
    /// The errno the call returned.
    pub(crate) fn query_device_ex(
        &self,
    ) -> std::result::Result<(ffi::ibv_device_attr_ex, bool), i32> {
        let mut ex: ffi::ibv_device_attr_ex = super::zeroed();
        // SAFETY: the context is open.
        let rc = match unsafe { super::ctx_ops::ctx_op!(self.as_ptr(), query_device_ex) } {
            // SAFETY: the provider's `query_device_ex` of this open context; a null input
            // asks for no extended input; `ex` is a valid out-pointer of the size passed.
            Some(query) => unsafe {
                query(
                    self.as_ptr(),
                    std::ptr::null(),
                    &mut ex,
                    std::mem::size_of::<ffi::ibv_device_attr_ex>(),
                )
            },
            None => libc::EOPNOTSUPP,
        };
        if rc == libc::EOPNOTSUPP || rc == libc::ENOSYS {
            // As libibverbs' inline function: the basic query, the rest zero.
            ex = super::zeroed();
            // SAFETY: the context is open and `orig_attr` a valid out-pointer of its type.
            let rc = unsafe { ffi::ibv_query_device(self.as_ptr(), &mut ex.orig_attr) };
            if rc != 0 {
                return Err(rc);
            }
            return Ok((ex, false));
        }
        if rc != 0 {
            return Err(rc);
        }
        Ok((ex, true))
    }

    /// `ibv_query_port`.
    ///
    /// # Errors
    /// The errno the call returned.
    pub(crate) fn query_port_raw(&self, port: u8) -> std::result::Result<ffi::ibv_port_attr, i32> {
        let mut attr: ffi::ibv_port_attr = super::zeroed();
        // As libibverbs' inline `ibv_query_port`: the provider's extended query when it has
        // one, else the exported one, which fills the older, shorter struct (the rest stays
        // zero).
        // SAFETY: the context is open.
        let rc = match unsafe { super::ctx_ops::ctx_op!(self.as_ptr(), query_port) } {
            // SAFETY: the provider's `query_port` of this open context; `attr` is a valid
            // out-pointer of the size passed.
            Some(query) => unsafe {
                query(
                    self.as_ptr(),
                    port,
                    &mut attr,
                    std::mem::size_of::<ffi::ibv_port_attr>(),
                )
            },
            // SAFETY: the context is open; the compatible struct is the start of `attr`.
            None => unsafe {
                ffi::ibv_query_port(
                    self.as_ptr(),
                    port,
                    (&mut attr as *mut ffi::ibv_port_attr).cast(),
                )
            },
        };
        if rc != 0 {
            return Err(rc);
        }
        Ok(attr)
    }

    /// `ibv_query_gid`: the GID's 16 bytes.
    ///
    /// # Errors
    /// The OS error the call left.
    pub(crate) fn query_gid(&self, port: u8, index: i32) -> std::io::Result<[u8; 16]> {
        let mut gid: ffi::ibv_gid = super::zeroed();
        // SAFETY: open context, valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.as_ptr(), port, index, &mut gid) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: every bit pattern of the union is a valid `raw` byte array.
        Ok(unsafe { gid.raw })
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        match self.owner {
            Owner::Opened => {
                // SAFETY: every child object holds an Arc to this context, so none is left;
                // the context is closed once.
                let rc = unsafe { ffi::ibv_close_device(self.as_ptr()) };
                if rc != 0 {
                    crate::diag::warn(format_args!("ibv_close_device({}) failed: {rc}", self.name));
                }
            }
            Owner::Rdmacm(list) => {
                // SAFETY: the list came from rdma_get_devices and is freed once, here; every
                // child object holds an Arc to this context, so none is left to use it if
                // librdmacm now closes it (a removed device's last reference).
                unsafe { ffi::rdma_free_devices(list.as_ptr()) };
            }
        }
    }
}

/// A device's remote atomic capability (`ibv_atomic_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicCap {
    /// No remote atomics.
    None,
    /// Atomic among the device's own operations (`IBV_ATOMIC_HCA`).
    Device,
    /// Atomic also against the CPU and other devices (`IBV_ATOMIC_GLOB`).
    Global,
}
