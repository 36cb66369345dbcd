//! The RDMA devices an `Agent` would open, checked before anything else is started: a host
//! without them (or without the devices named) is refused with `Unsupported` at once, before
//! a metadata service (etcd, an HTTP server) is connected to. The engine opens the devices
//! after its metadata service is built, so without this check a host with no RDMA device
//! and an etcd that is not up would fail on etcd first.

use crate::errors::{Failure, Result};
use rdma_dmabuf::{Context, PortState};

/// `ibv_get_device_list`: refuses with `Unsupported` (the engine's `NoDevice`, with its hint,
/// and the list's errno, ENODEV for a device the host lacks, and the device) when the host has
/// no RDMA device, when one of `names` is not among them, or, with no names, when no device's
/// port 1 is active (the engine's choice of devices, `Settings::devices`).
pub(crate) fn check(names: Option<&[String]>) -> Result<()> {
    let refuse = |why: String, errno: Option<i32>| {
        let mut f = Failure::engine("Agent", &gpu_rdma_engine::Error::NoDevice(why));
        f.message = format!("Agent: {}", f.message);
        f.errno = errno;
        f
    };
    let found: Vec<String> = match rdma_dmabuf::devices() {
        Ok(list) => list.into_iter().map(|d| d.name).collect(),
        Err(e) => return Err(refuse(format!("none to list: {e}"), e.errno())),
    };
    if found.is_empty() {
        return Err(refuse("this host has none".into(), Some(libc::ENODEV)));
    }
    match names {
        Some(names) => {
            let missing: Vec<&str> = names
                .iter()
                .filter(|n| !found.contains(n))
                .map(String::as_str)
                .collect();
            if let Some(first) = missing.first() {
                return Err(refuse(
                    format!("no device {missing:?} on this host (it has {found:?})"),
                    Some(libc::ENODEV),
                )
                .with_device(*first));
            }
        }
        None => {
            let active = found.iter().any(|n| {
                Context::open(n)
                    .and_then(|c| c.query_port(1))
                    .is_ok_and(|p| p.state == PortState::Active)
            });
            if !active {
                return Err(refuse(
                    format!("none of {found:?} has an active port"),
                    None,
                ));
            }
        }
    }
    Ok(())
}
