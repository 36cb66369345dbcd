//! RDMA devices and their contexts: listing, opening, ports and GIDs.

use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::ffi::CStr;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

/// A device as `ibv_get_device_list` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel name, e.g. `mlx5_0`, `rxe0`.
    pub name: String,
    /// Node GUID, host byte order.
    pub guid: u64,
}

/// The RDMA devices of this host.
///
/// # Errors
/// [`Error::Verbs`] if the list cannot be read (no `ib_uverbs` module, say).
pub fn devices() -> Result<Vec<DeviceInfo>> {
    with_device_list(|list| {
        Ok(list
            .iter()
            .map(|&d| DeviceInfo {
                // SAFETY: `d` is a live entry of the device list (see with_device_list).
                name: unsafe { device_name(d) },
                guid: {
                    // SAFETY: `d` is a live entry of the device list (see with_device_list).
                    u64::from_be(unsafe { ffi::ibv_get_device_guid(d) })
                },
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

    /// Opens the first device of the list.
    ///
    /// # Errors
    /// `ENODEV` if there is none.
    pub fn open_first() -> Result<Arc<Context>> {
        let first = devices()?
            .into_iter()
            .next()
            .ok_or_else(|| Error::from_errno(Op::OpenDevice, "any device", libc::ENODEV))?;
        Context::open(&first.name)
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
    pub(crate) unsafe fn borrowed(ctx: NonNull<ffi::ibv_context>) -> Result<Arc<Context>> {
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

    pub(crate) fn as_ptr(&self) -> *mut ffi::ibv_context {
        self.ctx.as_ptr()
    }

    /// `ibv_query_device_ex` (falling back to `ibv_query_device` where the provider lacks
    /// the extended query): the device's limits and capabilities, which the crate's checks
    /// use instead of guesses.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub fn query_device(&self) -> Result<DeviceAttr> {
        // SAFETY: ibv_device_attr_ex is a plain C struct for which all-zero is a valid value
        // (the fallback path fills only `orig_attr`, so the rest must start zeroed).
        let mut ex: ffi::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open; a null input asks for no extended input; `ex` is a
        // valid out-pointer of the type whose size the call passes.
        let rc = unsafe { ffi::ibv_query_device_ex(self.as_ptr(), std::ptr::null(), &mut ex) };
        if rc != 0 {
            return Err(Error::from_errno(Op::QueryDevice, &self.name, rc));
        }
        let attr = &ex.orig_attr;
        let count = |v: i32| u32::try_from(v).unwrap_or(0);
        let odp = ffi::ibv_odp_general_caps::IBV_ODP_SUPPORT.0;
        Ok(DeviceAttr {
            max_qp: count(attr.max_qp),
            max_qp_wr: count(attr.max_qp_wr),
            max_sge: count(attr.max_sge),
            max_cqe: count(attr.max_cqe),
            phys_port_cnt: attr.phys_port_cnt,
            max_mr_size: attr.max_mr_size,
            max_sge_rd: count(attr.max_sge_rd),
            max_qp_rd_atom: count(attr.max_qp_rd_atom),
            atomics: match attr.atomic_cap {
                ffi::ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCap::Device,
                ffi::ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCap::Global,
                _ => AtomicCap::None,
            },
            max_srq: count(attr.max_srq),
            max_srq_wr: count(attr.max_srq_wr),
            max_srq_sge: count(attr.max_srq_sge),
            odp: u64::from(odp) & ex.odp_caps.general_caps != 0,
            max_dm_size: ex.max_dm_size,
            vendor_id: attr.vendor_id,
        })
    }

    /// `ibv_query_port`.
    ///
    /// # Errors
    /// [`Error::Verbs`] (`EINVAL` for a port the device lacks).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        // SAFETY: ibv_port_attr is a plain C struct for which all-zero is a valid value.
        let mut attr: ffi::ibv_port_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and `attr` is a valid out-pointer of the right type.
        let rc = unsafe { ffi::___ibv_query_port(self.as_ptr(), port, &mut attr) };
        if rc != 0 {
            return Err(Error::from_errno(
                Op::QueryPort,
                format!("{} port {port}", self.name),
                rc,
            ));
        }
        Ok(PortAttr {
            state: PortState::from_raw(attr.state),
            active_mtu: Mtu::from_raw(attr.active_mtu).unwrap_or(Mtu::Mtu1024),
            lid: attr.lid,
            gid_table_len: attr.gid_tbl_len as u32,
            max_msg_size: attr.max_msg_sz,
        })
    }

    /// `ibv_query_gid`.
    ///
    /// # Errors
    /// [`Error::Verbs`] for an index outside the table.
    pub fn gid(&self, port: u8, index: u32) -> Result<Gid> {
        let target = || format!("{} port {port} index {index}", self.name);
        let idx = i32::try_from(index)
            .map_err(|_| Error::from_errno(Op::QueryGid, target(), libc::EINVAL))?;
        // SAFETY: ibv_gid is a 16-byte union of plain integers; zero is valid.
        let mut gid: ffi::ibv_gid = unsafe { std::mem::zeroed() };
        // SAFETY: open context, valid out-pointer.
        let rc = unsafe { ffi::ibv_query_gid(self.as_ptr(), port, idx, &mut gid) };
        if rc != 0 {
            return Err(Error::last_os(Op::QueryGid, target()));
        }
        // SAFETY: every bit pattern of the union is a valid `raw` byte array.
        Ok(Gid(unsafe { gid.raw }))
    }

    /// The type of GID `index` of `port` as the kernel's GID table names it
    /// (`/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>`: `RoCE v2`,
    /// `IB/RoCE v1`); `None` for an empty entry or where sysfs does not say.
    pub fn gid_type(&self, port: u8, index: u32) -> Option<String> {
        let ty = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            self.name
        ))
        .ok()?;
        let ty = ty.trim();
        (!ty.is_empty()).then(|| ty.to_string())
    }

    /// The index of the port's RoCEv2 GID with an IPv4-mapped address (`::ffff:a.b.c.d`), the
    /// one RoCE peers on an IPv4 network use. Read from the kernel's GID table in sysfs
    /// (`gid_attrs/types`), as `show_gids` does.
    ///
    /// # Errors
    /// [`Error::Verbs`] with `ENOENT` if the port has none (no IPv4 address on its netdev yet).
    pub fn roce_v2_ipv4_gid(&self, port: u8) -> Result<(u32, Gid)> {
        let len = self.query_port(port)?.gid_table_len;
        for index in 0..len {
            let Ok(gid) = self.gid(port, index) else {
                continue;
            };
            if gid.ipv4().is_none() {
                continue;
            }
            if self.gid_type(port, index).as_deref() == Some("RoCE v2") {
                return Ok((index, gid));
            }
        }
        Err(Error::Verbs {
            op: Op::QueryGid,
            target: format!("{} port {port}", self.name),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
            hint: Some(
                "no RoCEv2 GID with an IPv4 address: give the port's netdev an IPv4 address",
            ),
        })
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

/// A device's limits and capabilities (`ibv_device_attr_ex`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Queue pairs the device can hold.
    pub max_qp: u32,
    /// Work requests one send or receive queue can hold.
    pub max_qp_wr: u32,
    /// Scatter/gather entries per send or receive work request.
    pub max_sge: u32,
    /// Entries one completion queue can hold.
    pub max_cqe: u32,
    /// Physical ports (numbered from 1).
    pub phys_port_cnt: u8,
    /// The largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Scatter/gather entries per RDMA read.
    pub max_sge_rd: u32,
    /// RDMA reads and atomics a queue pair may have outstanding as responder.
    pub max_qp_rd_atom: u32,
    /// Whether and how the device does remote atomics.
    pub atomics: AtomicCap,
    /// Shared receive queues the device can hold (0: none).
    pub max_srq: u32,
    /// Work requests one shared receive queue can hold.
    pub max_srq_wr: u32,
    /// Scatter/gather entries per shared receive queue work request.
    pub max_srq_sge: u32,
    /// Whether the device supports on-demand paging.
    pub odp: bool,
    /// The most device memory (`ibv_alloc_dm`) the device has, in bytes (0: none).
    pub max_dm_size: u64,
    /// The IEEE vendor id (`vendor_id`; soft-RoCE reports `0xffffff`, siw `0x626d74`).
    pub vendor_id: u32,
}

impl DeviceAttr {
    /// Whether the device moves data with the CPU, through the kernel's mapping of each
    /// buffer (soft-RoCE `rxe`, `siw`), rather than by DMA: it then depends on the exporter's
    /// `vmap` being right (see [`drm_export::HUGE_PAGE_VMAP_BUG`]).
    pub fn moves_data_with_the_cpu(&self) -> bool {
        matches!(self.vendor_id, 0x00ff_ffff | 0x0062_6d74)
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

/// A port's attributes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortAttr {
    /// The logical state.
    pub state: PortState,
    /// The MTU in use.
    pub active_mtu: Mtu,
    /// The LID (0 on RoCE).
    pub lid: u16,
    /// Entries in the GID table.
    pub gid_table_len: u32,
    /// The largest message.
    pub max_msg_size: u32,
}

/// A port's logical state (`ibv_port_state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortState {
    /// `IBV_PORT_ACTIVE`: ready for traffic.
    Active,
    /// `IBV_PORT_DOWN`.
    Down,
    /// Any other state (INIT, ARMED, ...), with its code.
    Other(u32),
}

impl PortState {
    fn from_raw(s: ffi::ibv_port_state::Type) -> PortState {
        match s {
            ffi::ibv_port_state::IBV_PORT_ACTIVE => PortState::Active,
            ffi::ibv_port_state::IBV_PORT_DOWN => PortState::Down,
            other => PortState::Other(other),
        }
    }
}

/// Path MTU (`ibv_mtu`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// From the `ibv_mtu` code.
    pub fn from_raw(v: u32) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// Bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// A 16-byte GID.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn ipv4(&self) -> Option<std::net::Ipv4Addr> {
        std::net::Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", std::net::Ipv6Addr::from(self.0))
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_codes_and_sizes() {
        assert_eq!(Mtu::from_raw(3), Some(Mtu::Mtu1024));
        assert_eq!(Mtu::Mtu4096.bytes(), 4096);
        assert_eq!(Mtu::Mtu256.bytes(), 256);
        assert_eq!(Mtu::from_raw(9), None);
    }

    #[test]
    fn ipv4_mapped_gids_are_recognised() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[169, 254, 20, 1]);
        assert_eq!(Gid(g).ipv4(), Some("169.254.20.1".parse().unwrap()));
        assert_eq!(Gid(g).to_string(), "::ffff:169.254.20.1");
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        assert_eq!(Gid(ll).ipv4(), None);
    }
}
