//! RDMA devices and their contexts: listing, opening, ports and GIDs.

use crate::error::{Error, Op, Result};
use rdma_sys as ffi;
use std::fmt;
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
    Ok(crate::sys::device::list()?
        .into_iter()
        .map(|d| DeviceInfo {
            name: d.name,
            guid: u64::from_be(d.guid_be),
        })
        .collect())
}

pub use crate::sys::device::{AtomicCap, Context};

impl Context {
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

    /// `ibv_query_device_ex` (falling back to `ibv_query_device` where the provider lacks
    /// the extended query): the device's limits and capabilities, which the crate's checks
    /// use instead of guesses.
    ///
    /// # Errors
    /// [`Error::Verbs`].
    pub fn query_device(&self) -> Result<DeviceAttr> {
        let (ex, extended_query) = self
            .query_device_ex()
            .map_err(|rc| Error::from_errno(Op::QueryDevice, self.name(), rc))?;
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
            extended_query,
            vendor_id: attr.vendor_id,
        })
    }

    /// `ibv_query_port`.
    ///
    /// # Errors
    /// [`Error::Verbs`] (`EINVAL` for a port the device lacks).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let attr = self.query_port_raw(port).map_err(|rc| {
            Error::from_errno(Op::QueryPort, format!("{} port {port}", self.name()), rc)
        })?;
        Ok(PortAttr {
            state: PortState::from_raw(attr.state),
            active_mtu: Mtu::from_raw(attr.active_mtu).unwrap_or(Mtu::Mtu1024),
            lid: attr.lid,
            gid_table_len: attr.gid_tbl_len as u32,
            max_msg_size: attr.max_msg_sz,
            rate_mbps: link_rate_mbps(attr.active_speed, attr.active_width),
        })
    }

    /// `ibv_query_gid`.
    ///
    /// # Errors
    /// [`Error::Verbs`] for an index outside the table.
    pub fn gid(&self, port: u8, index: u32) -> Result<Gid> {
        let target = || format!("{} port {port} index {index}", self.name());
        let idx = i32::try_from(index)
            .map_err(|_| Error::from_errno(Op::QueryGid, target(), libc::EINVAL))?;
        let raw = self
            .query_gid(port, idx)
            .map_err(|_| Error::last_os(Op::QueryGid, target()))?;
        Ok(Gid(raw))
    }

    /// The type of GID `index` of `port` as the kernel's GID table names it
    /// (`/sys/class/infiniband/<dev>/ports/<port>/gid_attrs/types/<index>`: `RoCE v2`,
    /// `IB/RoCE v1`); `None` for an empty entry or where sysfs does not say.
    pub fn gid_type(&self, port: u8, index: u32) -> Option<String> {
        let ty = std::fs::read_to_string(format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            self.name()
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
            target: format!("{} port {port}", self.name()),
            source: std::io::Error::from_raw_os_error(libc::ENOENT),
            hint: Some(
                "no RoCEv2 GID with an IPv4 address: give the port's netdev an IPv4 address",
            ),
        })
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
    /// Whether the provider answered the extended query (`ibv_query_device_ex`). When it
    /// has none, only the basic attributes are known, and [`odp`](Self::odp) and
    /// [`max_dm_size`](Self::max_dm_size) read as absent.
    pub extended_query: bool,
}

impl DeviceAttr {
    /// Whether the device moves data with the CPU, through the kernel's mapping of each
    /// buffer (soft-RoCE `rxe`, `siw`), rather than by DMA: it then depends on the exporter's
    /// `vmap` being right (see [`drm_export::HUGE_PAGE_VMAP_BUG`]).
    pub fn moves_data_with_the_cpu(&self) -> bool {
        matches!(self.vendor_id, 0x00ff_ffff | 0x0062_6d74)
    }
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
    /// The link's rate in Mb/s (its active speed times its width, as the kernel's sysfs
    /// `rate` gives it: 25,000 for a 25 Gb/s 1X link); `None` for codes this crate does not
    /// know.
    pub rate_mbps: Option<u32>,
}

/// A port's rate in Mb/s from its `active_speed` and `active_width` codes (the kernel's
/// nominal lane rates: SDR 2.5 Gb/s to XDR 200 Gb/s per lane; widths 1X, 2X, 4X, 8X, 12X).
fn link_rate_mbps(speed: u8, width: u8) -> Option<u32> {
    let lane = match speed {
        1 => 2_500,
        2 => 5_000,
        4 | 8 => 10_000,
        16 => 14_000,
        32 => 25_000,
        64 => 50_000,
        128 => 100_000,
        _ => return None,
    };
    let lanes = match width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return None,
    };
    Some(lane * lanes)
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
