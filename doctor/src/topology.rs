//! The PCIe path between each GPU and each RDMA NIC, read from sysfs: where the two meet (a
//! common upstream bridge, i.e. one PCIe switch, or only the root complex), ACS on the
//! bridges in between, the IOMMU mode, and the GPU's BAR sizes.
//!
//! Everything is read below a sysfs root (`/sys`, or a recorded tree in the tests): the
//! `device` links of `class/drm/card*` and `class/infiniband/*` resolve to
//! `devices/pci<domain>:<bus>/<root port>/.../<device>`, whose path is the chain of bridges.

use crate::pci::{self, Acs};
use crate::{problems, Check, Status};
use std::path::{Path, PathBuf};

const SECTION: &str = "topology";

/// A GPU or NIC and its place on the PCI bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `card0`, `mlx5_0`.
    pub name: String,
    /// The kernel driver bound to its PCI function (`amdgpu`, `mlx5_core`), if any.
    pub driver: Option<String>,
    /// The device folder under the sysfs root (`devices/pci0000:00/0000:00:01.0/...`).
    pub dir: PathBuf,
    /// The path from the host bridge down: `pci0000:00`, then each bridge's and finally the
    /// device's own PCI address. Empty for a device that is not on PCI (vgem, rxe).
    pub chain: Vec<String>,
}

impl Endpoint {
    /// The device's PCI address, if on PCI.
    pub fn address(&self) -> Option<&str> {
        self.chain
            .last()
            .map(String::as_str)
            .filter(|a| pci::is_address(a))
    }

    fn label(&self) -> String {
        match (&self.driver, self.address()) {
            (Some(d), Some(a)) => format!("{} ({d}, {a})", self.name),
            (None, Some(a)) => format!("{} ({a})", self.name),
            (Some(d), None) => format!("{} ({d})", self.name),
            (None, None) => self.name.clone(),
        }
    }
}

/// The endpoint behind `class/<class>/<name>` under `sysfs`.
pub fn endpoint(sysfs: &Path, class: &str, name: &str) -> Endpoint {
    let link = sysfs.join("class").join(class).join(name).join("device");
    let root = sysfs.canonicalize().unwrap_or_else(|_| sysfs.to_path_buf());
    let (dir, chain) = match link.canonicalize() {
        Ok(real) => {
            let rel = real.strip_prefix(&root).unwrap_or(&real).to_path_buf();
            let chain = rel
                .components()
                .filter_map(|c| c.as_os_str().to_str())
                .skip_while(|c| !c.starts_with("pci"))
                .map(str::to_string)
                .collect::<Vec<_>>();
            let on_pci = chain.len() > 1 && chain[1..].iter().all(|c| pci::is_address(c));
            (rel, if on_pci { chain } else { Vec::new() })
        }
        Err(_) => (PathBuf::new(), Vec::new()),
    };
    let driver = std::fs::read_link(link.join("driver"))
        .ok()
        .and_then(|d| Some(d.file_name()?.to_str()?.to_string()));
    Endpoint {
        name: name.to_string(),
        driver,
        dir,
        chain,
    }
}

/// The entries of `class/<class>` whose names `keep` accepts, sorted.
fn class_entries(sysfs: &Path, class: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(sysfs.join("class").join(class))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The GPUs: `class/drm/cardN` (connectors such as `card0-DP-1` left out).
pub fn gpus(sysfs: &Path) -> Vec<Endpoint> {
    class_entries(sysfs, "drm", |n| {
        n.strip_prefix("card")
            .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
    })
    .iter()
    .map(|n| endpoint(sysfs, "drm", n))
    .collect()
}

/// The RDMA devices: `class/infiniband/*`.
pub fn nics(sysfs: &Path) -> Vec<Endpoint> {
    class_entries(sysfs, "infiniband", |_| true)
        .iter()
        .map(|n| endpoint(sysfs, "infiniband", n))
        .collect()
}

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
    let common = gpu
        .chain
        .iter()
        .zip(&nic.chain)
        .take_while(|(a, b)| a == b)
        .count();
    let name = format!("{} <-> {}", gpu.name, nic.name);
    // The bridges below the meeting point on each side (the devices themselves left out).
    let mut bridges = Vec::new();
    for e in [gpu, nic] {
        let below = common.max(1);
        for (i, b) in e
            .chain
            .iter()
            .enumerate()
            .take(e.chain.len() - 1)
            .skip(below)
        {
            let dir = sysfs.join(e.dir.iter().take(dir_depth(e, i)).collect::<PathBuf>());
            let acs = std::fs::read(dir.join("config"))
                .map(|c| pci::acs(&c))
                .unwrap_or(Acs::Unknown);
            if !bridges.iter().any(|(n, _)| n == b) {
                bridges.push((b.clone(), acs));
            }
        }
    }
    let acs_text = if bridges.is_empty() {
        "no bridge in between".to_string()
    } else {
        bridges
            .iter()
            .map(|(b, a)| format!("{b}: {a}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let common_bridge = (common >= 2).then(|| gpu.chain[common - 1].clone());
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

/// How many components of `e.dir` lead to its chain's element `i`.
fn dir_depth(e: &Endpoint, i: usize) -> usize {
    let total = e.dir.iter().count();
    total - (e.chain.len() - 1 - i)
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
    let units = class_entries(sysfs, "iommu", |_| true);
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

/// Every topology check: per PCI GPU its BARs, per GPU x NIC pair on PCI the path verdict,
/// and the IOMMU.
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
    let all: Vec<&Endpoint> = pci_gpus.iter().chain(&pci_nics).copied().collect();
    out.push(iommu_check(sysfs, cmdline, &all));
    out
}
