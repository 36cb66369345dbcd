//! The PCIe path between each GPU and each RDMA NIC, read from sysfs: where the two meet (a
//! common upstream bridge, i.e. one PCIe switch, or only the root complex), ACS on the
//! bridges in between, the NIC the transfer engine would choose for each GPU and why, the
//! IOMMU mode, and the GPU's BAR sizes.
//!
//! The places themselves come from [`gpu_rdma_topology`], which the engine ranks its NICs
//! with (one copy): everything is read below a sysfs root (`/sys`, or a recorded tree in the
//! tests), where the `device` links of `class/drm/card*` and `class/infiniband/*` resolve to
//! `devices/pci<domain>:<bus>/<root port>/.../<device>`, whose path is the chain of bridges
//! (an `rxe` through its `parent` netdev).

use crate::pci::{self, Acs};
use crate::{problems, Check, Status};
use gpu_rdma_topology::{class_entries, rank, Near, NicOverride, Proximity, NICS_ENV};
pub use gpu_rdma_topology::{endpoint, gpus, nics, Endpoint};
use std::path::Path;

const SECTION: &str = "topology";

/// How one GPU and one NIC are connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PairVerdict {
    /// The GPU.
    pub gpu: String,
    /// The NIC.
    pub nic: String,
    /// The deepest bridge above both, when they meet below the root complex.
    pub common_bridge: Option<String>,
    /// The bridges between each of them and the common point, with their ACS.
    pub bridges: Vec<(String, Acs)>,
    /// The finding.
    pub check: Check,
}

/// The verdict for one pair (both on PCI).
pub fn pair(sysfs: &Path, gpu: &Endpoint, nic: &Endpoint) -> PairVerdict {
    let m = gpu_rdma_topology::pair(sysfs, gpu, nic);
    let (common, bridges) = (m.shared, m.bridges);
    let name = format!("{} <-> {}", gpu.name, nic.name);
    let acs_text = if bridges.is_empty() {
        "no bridge in between".to_string()
    } else {
        bridges
            .iter()
            .map(|(b, a)| format!("{b}: {a}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let common_bridge = m.common_bridge;
    let check = match (common, &common_bridge) {
        (0, _) => Check::problem(
            SECTION,
            name,
            Status::Warn,
            format!(
                "{} and {} are under different PCI host bridges ({} and {}): no common root \
                 complex, likely different CPU sockets",
                gpu.label(),
                nic.label(),
                gpu.chain[0],
                nic.chain[0]
            ),
            &problems::P2P_ROOT_COMPLEX,
        ),
        (1, _) => Check::problem(
            SECTION,
            name,
            Status::Warn,
            format!(
                "{} and {} meet only at the root complex {} (different root ports; {acs_text})",
                gpu.label(),
                nic.label(),
                gpu.chain[0]
            ),
            &problems::P2P_ROOT_COMPLEX,
        ),
        (_, Some(bridge)) => {
            let found = format!(
                "{} and {} share the upstream bridge {bridge} ({acs_text})",
                gpu.label(),
                nic.label()
            );
            match bridges.iter().find(|(_, a)| a.redirects()) {
                Some((b, _)) => {
                    Check::problem(SECTION, name, Status::Warn, found, &problems::ACS_REDIRECT)
                        .with_detail(format!("bridge {b}"))
                }
                None => Check::ok(SECTION, name, format!("{found}: peer-to-peer capable")),
            }
        }
        _ => Check::ok(SECTION, name, "same device"),
    };
    PairVerdict {
        gpu: gpu.name.clone(),
        nic: nic.name.clone(),
        common_bridge,
        bridges,
        check,
    }
}

/// The GPU's BARs: a largest memory BAR of 256 MiB or less limits peer-to-peer.
pub fn bar_check(sysfs: &Path, gpu: &Endpoint) -> Option<Check> {
    let text = std::fs::read_to_string(sysfs.join(&gpu.dir).join("resource")).ok()?;
    let bars = pci::bars(&text);
    let largest = bars.iter().max_by_key(|b| b.size)?;
    let list = bars
        .iter()
        .map(|b| format!("BAR{} {}", b.index, pci::size_text(b.size)))
        .collect::<Vec<_>>()
        .join(", ");
    let name = format!("{} BARs", gpu.name);
    Some(if largest.size <= 256 << 20 {
        Check::problem(
            SECTION,
            name,
            Status::Warn,
            format!(
                "{list}: the largest is {}, so only that much GPU memory is reachable \
                 peer-to-peer",
                pci::size_text(largest.size)
            ),
            &problems::SMALL_BAR,
        )
    } else {
        Check::ok(SECTION, name, list)
    })
}

/// The IOMMU: units in `class/iommu`, the kernel command line's `iommu` options, and the
/// domain type of each device's group (`identity` is passthrough; `DMA`, `DMA-FQ` translate).
pub fn iommu_check(sysfs: &Path, cmdline: &str, devices: &[&Endpoint]) -> Check {
    let units = class_entries(sysfs, "iommu");
    let options: Vec<&str> = cmdline
        .split_whitespace()
        .filter(|w| w.starts_with("iommu") || w.contains("_iommu"))
        .collect();
    let mut translated = Vec::new();
    let mut types = Vec::new();
    for d in devices {
        let ty = std::fs::read_to_string(sysfs.join(&d.dir).join("iommu_group").join("type"));
        if let Ok(ty) = ty {
            let ty = ty.trim().to_string();
            if ty.starts_with("DMA") {
                translated.push(d.name.clone());
            }
            types.push(format!("{}: {ty}", d.name));
        }
    }
    let found = format!(
        "{}; command line: {}{}",
        if units.is_empty() {
            "no IOMMU".to_string()
        } else {
            format!("IOMMU units {}", units.join(", "))
        },
        if options.is_empty() {
            "no iommu option".to_string()
        } else {
            options.join(" ")
        },
        if types.is_empty() {
            String::new()
        } else {
            format!("; groups: {}", types.join(", "))
        }
    );
    if translated.is_empty() {
        Check::ok(SECTION, "IOMMU", found)
    } else {
        Check::problem(
            SECTION,
            "IOMMU",
            Status::Warn,
            found,
            &problems::IOMMU_TRANSLATED,
        )
        .with_detail(format!("translated: {}", translated.join(", ")))
    }
}

/// The NIC the transfer engine would choose for each GPU on PCI, and why: its ranking of
/// `nics` for memory of that GPU ([`gpu_rdma_topology::rank`]), after the override in the
/// environment variable `GPU_RDMA_NICS`, as the engine applies it when its settings carry
/// none. Tier 0 is what the engine stripes a GPU segment's transfers over. An override that
/// does not parse is a warning (the engine refuses to start with it).
pub fn nic_choices(sysfs: &Path, gpus: &[Endpoint], nics: &[Endpoint]) -> Vec<Check> {
    let mut out = Vec::new();
    let over = match NicOverride::from_environment() {
        Ok(o) => o,
        Err(e) => {
            out.push(override_refused(Status::Warn, &e));
            None
        }
    };
    out.extend(ranked_choices(sysfs, gpus, nics, over.as_ref(), NICS_ENV));
    out
}

/// The finding for a `GPU_RDMA_NICS` that does not parse: `status` (warn for the machine,
/// fail for an agent's settings, which the engine refuses to start with).
pub fn override_refused(status: Status, e: &gpu_rdma_topology::OverrideError) -> Check {
    Check {
        section: SECTION,
        name: "NIC override".into(),
        status,
        found: format!("{NICS_ENV} is not a NIC override: {e}"),
        fix: Some(format!(
            "fix or unset {NICS_ENV} (the transfer engine refuses to start with it; syntax in \
             docs/engine.md, \"Topology\")"
        )),
        problem: None,
    }
}

/// As [`nic_choices`], with the override `over` given (`by` names where it came from:
/// `GPU_RDMA_NICS`, `--nics`): one ok finding per GPU on PCI naming its tier-0 NICs among
/// `nics` and why, then the further tiers.
pub fn ranked_choices(
    sysfs: &Path,
    gpus: &[Endpoint],
    nics: &[Endpoint],
    over: Option<&NicOverride>,
    by: &str,
) -> Vec<Check> {
    let mut out = Vec::new();
    if nics.is_empty() {
        return out;
    }
    for g in gpus {
        let Some(address) = g.address() else {
            continue;
        };
        let ranking = rank(sysfs, &Near::Pci(address.into()), nics, over);
        let chosen: Vec<String> = ranking
            .iter()
            .filter(|r| r.tier == 0)
            .map(|r| r.reason.clone())
            .collect();
        let names: Vec<&str> = ranking
            .iter()
            .filter(|r| r.tier == 0)
            .map(|r| r.nic.as_str())
            .collect();
        let rest: Vec<String> = ranking
            .iter()
            .filter(|r| r.tier > 0)
            .map(|r| format!("{} tier {} ({})", r.nic, r.tier, r.proximity))
            .collect();
        let overridden = ranking.iter().any(|r| r.proximity == Proximity::Listed);
        out.push(Check::ok(
            SECTION,
            format!("{} NIC", g.name),
            format!(
                "the transfer engine would use {} for {} memory{}: {}{}",
                names.join(" and "),
                g.label(),
                if overridden {
                    format!(" (set by {by})")
                } else {
                    String::new()
                },
                chosen.join("; "),
                if rest.is_empty() {
                    String::new()
                } else {
                    format!("; then {}", rest.join(", "))
                }
            ),
        ));
    }
    out
}

/// Every topology check: per PCI GPU its BARs, per GPU x NIC pair on PCI the path verdict,
/// the NIC the engine would choose for each GPU, and the IOMMU.
pub fn checks(sysfs: &Path, cmdline: &str) -> Vec<Check> {
    let gpus = gpus(sysfs);
    let nics = nics(sysfs);
    let mut out = Vec::new();
    let off_pci: Vec<String> = gpus
        .iter()
        .chain(&nics)
        .filter(|e| e.address().is_none())
        .map(|e| e.label())
        .collect();
    if !off_pci.is_empty() {
        out.push(Check::ok(
            SECTION,
            "devices off PCI",
            format!(
                "{}: software or platform devices, no PCIe path to check",
                off_pci.join(", ")
            ),
        ));
    }
    let pci_gpus: Vec<&Endpoint> = gpus.iter().filter(|e| e.address().is_some()).collect();
    let pci_nics: Vec<&Endpoint> = nics.iter().filter(|e| e.address().is_some()).collect();
    for g in &pci_gpus {
        out.extend(bar_check(sysfs, g));
    }
    for g in &pci_gpus {
        for n in &pci_nics {
            out.push(pair(sysfs, g, n).check);
        }
    }
    out.extend(nic_choices(sysfs, &gpus, &nics));
    let all: Vec<&Endpoint> = pci_gpus.iter().chain(&pci_nics).copied().collect();
    out.push(iommu_check(sysfs, cmdline, &all));
    out
}
