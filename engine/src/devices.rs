//! The RDMA devices an agent uses: each opened once, with one protection domain and one
//! registration cache.

use crate::error::{Error, Result};
use gpu_rdma_topology::{Endpoint, Near, NicOverride, Ranked};
use rdma_dmabuf::{CacheLimits, Context, PortState, ProtectionDomain, RegistrationCache};
use std::path::Path;
use std::sync::Arc;

/// Where devices and memory are read from.
const SYSFS: &str = "/sys";

/// One opened device.
pub(crate) struct Device {
    pub name: String,
    pub pd: Arc<ProtectionDomain>,
    /// The registrations of CUDA segments in `pd`, kept after they are unregistered.
    pub cache: RegistrationCache,
    /// The GID its queue pairs send from (the RoCEv2 IPv4 one where there is one).
    pub gid: [u8; 16],
    /// Its place: its PCI function and the bridges above it, read from sysfs once, at open
    /// (an `rxe` through its netdev); an empty chain off PCI.
    pub place: Endpoint,
    /// Port 1's link rate in Mb/s, if known: a batch's chunks are spread over rails in
    /// proportion to it.
    pub rate_mbps: Option<u32>,
}

/// Each device's weight in striping, by device index: its link rate, or 1 for every device
/// when any rate is unknown (the rates cannot be compared then).
pub(crate) fn weights(devices: &[Device]) -> Vec<u32> {
    match devices
        .iter()
        .map(|d| d.rate_mbps)
        .collect::<Option<Vec<u32>>>()
    {
        Some(rates) if rates.iter().all(|&r| r > 0) => rates,
        _ => vec![1; devices.len()],
    }
}

/// `devices` ranked for memory at `near` (after `nic_override`), nearest first; each
/// entry's `index` is the device's.
pub(crate) fn rank(
    devices: &[Device],
    near: &Near,
    nic_override: Option<&NicOverride>,
) -> Vec<Ranked> {
    let places: Vec<Endpoint> = devices.iter().map(|d| d.place.clone()).collect();
    gpu_rdma_topology::rank(Path::new(SYSFS), near, &places, nic_override)
}

/// Each device's tier for memory at `near`, by device index.
pub(crate) fn tiers(
    devices: &[Device],
    near: &Near,
    nic_override: Option<&NicOverride>,
) -> Vec<u8> {
    let mut tiers = vec![0; devices.len()];
    for r in rank(devices, near, nic_override) {
        tiers[r.index] = r.tier;
    }
    tiers
}

/// Opens `names`, or every device whose port 1 is active, each with a registration cache
/// bounded by `limits`.
pub(crate) fn open(names: Option<&[String]>, limits: CacheLimits) -> Result<Vec<Device>> {
    let names: Vec<String> = match names {
        Some(n) => n.to_vec(),
        None => rdma_dmabuf::devices()
            .map_err(|e| Error::NoDevice(e.to_string()))?
            .into_iter()
            .map(|d| d.name)
            .filter(|n| {
                Context::open(n)
                    .and_then(|c| c.query_port(1))
                    .is_ok_and(|p| p.state == PortState::Active)
            })
            .collect(),
    };
    if names.is_empty() {
        return Err(Error::NoDevice("no device with an active port".into()));
    }
    names
        .iter()
        .map(|name| {
            let fail = |e: rdma_dmabuf::Error| Error::NoDevice(format!("{name}: {e}"));
            let ctx = Context::open(name).map_err(fail)?;
            let gid = match ctx.roce_v2_ipv4_gid(1) {
                Ok((_, g)) => g.0,
                Err(_) => ctx.gid(1, 0).map_err(fail)?.0,
            };
            let pd = ProtectionDomain::new(&ctx).map_err(fail)?;
            let rate_mbps = ctx.query_port(1).ok().and_then(|p| p.rate_mbps);
            Ok(Device {
                rate_mbps,
                place: gpu_rdma_topology::endpoint(Path::new(SYSFS), "infiniband", name),
                name: name.clone(),
                cache: RegistrationCache::new(&pd, limits),
                pd,
                gid,
            })
        })
        .collect()
}
