//! Where a device sits: its PCI function and the chain of bridges above it.

use crate::pci;
use std::io;
use std::path::{Path, PathBuf};

/// A GPU, a NIC or any PCI function, and its place on the PCI bus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `card0`, `mlx5_0`, `rxe1`, or the PCI address for [`pci_device`].
    pub name: String,
    /// The kernel driver bound to its PCI function (`amdgpu`, `mlx5_core`, `virtio-pci`), if
    /// any; for a device off PCI, the driver of the device its link leads to.
    pub driver: Option<String>,
    /// The PCI function's folder under the sysfs root (`devices/pci0000:00/0000:00:01.0/...`);
    /// for a device off PCI, the folder its `device` link leads to (empty if none).
    pub dir: PathBuf,
    /// The path from the host bridge down: `pci0000:00`, then each bridge's and finally the
    /// function's own PCI address. Empty for a device that is not on PCI (vgem, an rxe over a
    /// netdev that is not).
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

    /// Its host bridge (`pci0000:00`), if on PCI.
    pub fn host_bridge(&self) -> Option<&str> {
        self.address().and(self.chain.first().map(String::as_str))
    }

    /// `name (driver, address)`, as far as known.
    pub fn label(&self) -> String {
        match (&self.driver, self.address()) {
            (Some(d), Some(a)) => format!("{} ({d}, {a})", self.name),
            (None, Some(a)) => format!("{} ({a})", self.name),
            (Some(d), None) => format!("{} ({d})", self.name),
            (None, None) => self.name.clone(),
        }
    }

    /// The NUMA node of its PCI function: the function's `numa_node` file under `sysfs`;
    /// `None` off PCI, without the file, or where it says -1 (no node known: a machine
    /// without NUMA, or firmware that does not tell).
    pub fn numa_node(&self, sysfs: &Path) -> Option<u32> {
        self.address()?;
        let text = std::fs::read_to_string(sysfs.join(&self.dir).join("numa_node")).ok()?;
        text.trim().parse::<i64>().ok()?.try_into().ok()
    }
}

/// The place of the device folder `real` (a canonical path) below the canonical sysfs root:
/// its folder, and the chain from the host bridge to the last PCI function on its path (a
/// trailing `virtioN`, `net/eth0` or the like is not part of it).
fn place(root: &Path, real: &Path) -> (PathBuf, Vec<String>) {
    let rel = real.strip_prefix(root).unwrap_or(real).to_path_buf();
    let parts: Vec<&str> = rel.iter().filter_map(|c| c.to_str()).collect();
    let Some(start) = parts
        .iter()
        .position(|c| c.starts_with("pci") && c.contains(':'))
    else {
        return (rel, Vec::new());
    };
    let functions = parts[start + 1..]
        .iter()
        .take_while(|c| pci::is_address(c))
        .count();
    if functions == 0 {
        return (rel, Vec::new());
    }
    let end = start + 1 + functions;
    let dir = parts[..end].iter().collect::<PathBuf>();
    (
        dir,
        parts[start..end].iter().map(|c| c.to_string()).collect(),
    )
}

/// The canonical sysfs root (as given if it cannot be resolved).
fn canonical_root(sysfs: &Path) -> PathBuf {
    sysfs.canonicalize().unwrap_or_else(|_| sysfs.to_path_buf())
}

/// The endpoint whose device folder the link or folder `link` resolves to, named `name`.
fn resolve(sysfs: &Path, name: &str, link: &Path) -> Endpoint {
    let (dir, chain) = match link.canonicalize() {
        Ok(real) => place(&canonical_root(sysfs), &real),
        Err(_) => (PathBuf::new(), Vec::new()),
    };
    let driver_link = if chain.is_empty() {
        link.join("driver")
    } else {
        sysfs.join(&dir).join("driver")
    };
    let driver = std::fs::read_link(driver_link)
        .ok()
        .and_then(|d| Some(d.file_name()?.to_str()?.to_string()));
    Endpoint {
        name: name.to_string(),
        driver,
        dir,
        chain,
    }
}

/// The endpoint behind `class/<class>/<name>` under `sysfs`: where its `device` link leads.
/// A device without one that names a `parent` netdev (soft-RoCE's `rxe`: `parent` holds
/// `eth1`) is placed where that netdev's `device` link leads; in both cases a virtio device
/// (`.../0000:00:03.0/virtio2`) is placed at the PCI function above it.
pub fn endpoint(sysfs: &Path, class: &str, name: &str) -> Endpoint {
    let folder = sysfs.join("class").join(class).join(name);
    let mut link = folder.join("device");
    if !link.exists() {
        if let Ok(parent) = std::fs::read_to_string(folder.join("parent")) {
            let parent = parent.trim();
            if !parent.is_empty() && !parent.contains('/') {
                link = sysfs.join("class/net").join(parent).join("device");
            }
        }
    }
    resolve(sysfs, name, &link)
}

/// The PCI function at `address` (`0000:21:00.0`; upper-case hex is read as lower-case):
/// where `bus/pci/devices/<address>` leads, named by its address. `None` when sysfs has no
/// such function.
pub fn pci_device(sysfs: &Path, address: &str) -> Option<Endpoint> {
    let address = address.to_ascii_lowercase();
    if !pci::is_address(&address) {
        return None;
    }
    let e = resolve(
        sysfs,
        &address,
        &sysfs.join("bus/pci/devices").join(&address),
    );
    (e.address() == Some(address.as_str())).then_some(e)
}

/// The entries of `class/<class>`, sorted.
pub fn class_entries(sysfs: &Path, class: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(sysfs.join("class").join(class))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The GPUs: `class/drm/cardN` (connectors such as `card0-DP-1` left out), sorted.
pub fn gpus(sysfs: &Path) -> Vec<Endpoint> {
    class_entries(sysfs, "drm")
        .iter()
        .filter(|n| {
            n.strip_prefix("card")
                .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|n| endpoint(sysfs, "drm", n))
        .collect()
}

/// The RDMA devices: `class/infiniband/*`, sorted.
pub fn nics(sysfs: &Path) -> Vec<Endpoint> {
    class_entries(sysfs, "infiniband")
        .iter()
        .map(|n| endpoint(sysfs, "infiniband", n))
        .collect()
}

/// The NUMA node of the page of this process's memory at `addr`
/// (`get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)`; a page not present yet is faulted in for
/// reading, as the kernel does for this call). `Ok(None)` on a kernel without NUMA support
/// (`ENOSYS`).
///
/// # Errors
/// The call's error: `EFAULT` for an address the process has not mapped.
pub fn memory_numa_node(addr: usize) -> io::Result<Option<u32>> {
    match crate::sys::page_node(addr) {
        Ok(n) => Ok(u32::try_from(n).ok()),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_stops_at_the_last_pci_function() {
        let root = Path::new("/s");
        let (dir, chain) = place(
            root,
            Path::new("/s/devices/pci0000:00/0000:00:02.0/0000:01:00.0/virtio3/net/eth1"),
        );
        assert_eq!(
            dir,
            Path::new("devices/pci0000:00/0000:00:02.0/0000:01:00.0")
        );
        assert_eq!(chain, ["pci0000:00", "0000:00:02.0", "0000:01:00.0"]);
        let (dir, chain) = place(root, Path::new("/s/devices/platform/vgem"));
        assert_eq!(
            (dir.as_path(), chain.len()),
            (Path::new("devices/platform/vgem"), 0)
        );
    }

    #[test]
    fn the_node_of_a_page_of_this_process_is_known_or_numa_is_absent() {
        let v = vec![1u8; 4096];
        let node = memory_numa_node(v.as_ptr() as usize).expect("get_mempolicy");
        assert!(node.is_none_or(|n| n < 1024), "{node:?}");
        assert!(memory_numa_node(8).is_err(), "page 0 is not mapped");
    }
}
