//! The agent's RDMA devices, as the engine opens them: those named, or every device whose
//! port 1 is `ACTIVE`; each one's port 1 (the port the engine uses); the address a card gives
//! for a listener bound to `0.0.0.0` (the IPv4 address of a device's RoCE v2 GID); and the
//! NICs of tier 0 for each GPU among them.

use crate::topology::{override_refused, ranked_choices};
use crate::{problems, Check, Status};
use gpu_rdma_topology::{endpoint, gpus, rank, Endpoint, Near, NicOverride, NICS_ENV};
use rdma_dmabuf::{Context, PortState};
use std::net::Ipv4Addr;
use std::path::Path;

const SECTION: &str = "devices";
const NICS: &str = "nics";

/// What [`inspect`] found.
#[derive(Debug, Default)]
pub(super) struct Found {
    /// The findings.
    pub checks: Vec<Check>,
    /// The devices the agent would use, in its order.
    pub used: Vec<String>,
    /// Of those, in order, each one whose GID (the RoCE v2 IPv4 one, else index 0, as the
    /// engine picks it) carries an IPv4 address, with that address.
    pub card_ips: Vec<(String, Ipv4Addr)>,
}

/// The devices `named` (all when `None`): each exists, and its port 1 is `ACTIVE`.
pub(super) fn inspect(sysfs: &Path, named: Option<&[String]>) -> Found {
    let mut out = Found::default();
    let present: Vec<String> = match rdma_dmabuf::devices() {
        Ok(l) => l.into_iter().map(|d| d.name).collect(),
        Err(e) => {
            let found = format!("{e}: the agent cannot open any device");
            out.checks.push(crate::rdma::no_device_list(SECTION, found));
            return out;
        }
    };
    let targets: Vec<String> = named.map_or_else(|| present.clone(), <[String]>::to_vec);
    if named.is_none() && present.is_empty() {
        out.checks.push(Check::problem(
            SECTION,
            "RDMA devices",
            Status::Fail,
            "there is no RDMA device: the agent refuses to start",
            &problems::NO_RDMA_DEVICE,
        ));
        return out;
    }
    for name in &targets {
        device(sysfs, name, named.is_some(), &present, &mut out);
    }
    if named.is_none() && out.used.is_empty() {
        out.checks.push(Check::problem(
            SECTION,
            "agent's devices",
            Status::Fail,
            format!(
                "no device has an ACTIVE port 1 ({}): the agent refuses to start",
                present.join(", ")
            ),
            &problems::PORT_DOWN,
        ));
    }
    out
}

/// One device: whether it exists, can be opened, and its port 1 is active; `named`: the
/// settings name it (a port that is not active fails), rather than the engine picking it
/// (it is left out, a warning).
fn device(sysfs: &Path, name: &str, named: bool, present: &[String], out: &mut Found) {
    if !present.iter().any(|p| p == name) {
        let has = if present.is_empty() {
            "none".to_string()
        } else {
            present.join(", ")
        };
        out.checks.push(
            Check::problem(
                SECTION,
                name,
                Status::Fail,
                format!("no such RDMA device (this machine has {has})"),
                &problems::NO_RDMA_DEVICE,
            )
            .with_detail("name a device of this machine in --devices (Settings::devices)"),
        );
        return;
    }
    let ctx = match Context::open(name) {
        Ok(c) => c,
        Err(e) => {
            let found = format!("cannot open: {e}");
            out.checks
                .push(crate::rdma::cannot_open(SECTION, name, found));
            return;
        }
    };
    let mut port = crate::rdma::port_check(sysfs, &ctx, 1);
    port.section = SECTION;
    let active = ctx
        .query_port(1)
        .is_ok_and(|p| p.state == PortState::Active);
    if active {
        out.used.push(name.to_string());
        let gid = match ctx.roce_v2_ipv4_gid(1) {
            Ok((_, g)) => Some(g),
            Err(_) => ctx.gid(1, 0).ok(),
        };
        if let Some(ip) = gid.and_then(|g| g.ipv4()).filter(|ip| !ip.is_unspecified()) {
            out.card_ips.push((name.to_string(), ip));
        }
    } else if named {
        port.status = Status::Fail;
        port.found
            .push_str(": the agent would use it, and every transfer over it would fail");
    } else {
        port.status = Status::Warn;
        port.found
            .push_str(": the agent leaves it out (it takes every device whose port 1 is ACTIVE)");
    }
    out.checks.push(port);
}

/// The NICs of tier 0 for each GPU on PCI among the agent's devices `used`, after the
/// override (`given`, else `GPU_RDMA_NICS`, which the agent refuses to start with when it
/// does not parse); with no GPU on PCI, those of memory whose place is unknown.
pub(super) fn nic_checks(sysfs: &Path, used: &[String], given: Option<&NicOverride>) -> Vec<Check> {
    let mut out = Vec::new();
    let from_env;
    let (over, by) = match given {
        Some(o) => (Some(o), "--nics"),
        None => match NicOverride::from_environment() {
            Ok(o) => {
                from_env = o;
                (from_env.as_ref(), NICS_ENV)
            }
            Err(e) => {
                out.push(override_refused(Status::Fail, &e));
                (None, NICS_ENV)
            }
        },
    };
    let places: Vec<Endpoint> = used
        .iter()
        .map(|n| endpoint(sysfs, "infiniband", n))
        .collect();
    if !places.is_empty() {
        let gpus = gpus(sysfs);
        if gpus.iter().any(|g| g.address().is_some()) {
            out.extend(ranked_choices(sysfs, &gpus, &places, over, by));
        } else {
            let ranking = rank(sysfs, &Near::Unknown, &places, over);
            let tier0: Vec<&str> = ranking
                .iter()
                .filter(|r| r.tier == 0)
                .map(|r| r.reason.as_str())
                .collect();
            let off_pci: Vec<String> = gpus.iter().map(Endpoint::label).collect();
            out.push(Check::ok(
                NICS,
                "GPU NICs",
                format!(
                    "no GPU on PCI{}: memory whose place is unknown uses {}",
                    if off_pci.is_empty() {
                        String::new()
                    } else {
                        format!(" ({} is not)", off_pci.join(", "))
                    },
                    tier0.join("; ")
                ),
            ));
        }
    }
    for c in &mut out {
        c.section = NICS;
    }
    out
}
