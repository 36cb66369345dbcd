//! Where two devices' paths meet, and the bridges between each of them and that point.

use crate::pci::{self, Acs};
use crate::place::Endpoint;
use std::path::{Path, PathBuf};

/// Where two PCI devices meet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Meeting {
    /// How many elements their chains share from the host bridge down: 0 under different
    /// host bridges, 1 only at the host bridge (different root ports), 2 or more below one
    /// bridge (a PCIe switch, or a root port above a switch); the chains' whole length for the
    /// same function.
    pub shared: usize,
    /// The deepest bridge above both, when they meet below the host bridge.
    pub common_bridge: Option<String>,
    /// The bridges between each of them and the meeting point (the devices themselves left
    /// out), each once, with its ACS.
    pub bridges: Vec<(String, Acs)>,
}

/// Where `a` and `b` (both on PCI) meet, reading each bridge's ACS from its `config` file
/// under `sysfs`.
pub fn pair(sysfs: &Path, a: &Endpoint, b: &Endpoint) -> Meeting {
    let shared = a
        .chain
        .iter()
        .zip(&b.chain)
        .take_while(|(x, y)| x == y)
        .count();
    let mut bridges = Vec::new();
    for e in [a, b] {
        let below = shared.max(1);
        for (i, bridge) in e
            .chain
            .iter()
            .enumerate()
            .take(e.chain.len().saturating_sub(1))
            .skip(below)
        {
            let dir = sysfs.join(e.dir.iter().take(dir_depth(e, i)).collect::<PathBuf>());
            let acs = std::fs::read(dir.join("config"))
                .map(|c| pci::acs(&c))
                .unwrap_or(Acs::Unknown);
            if !bridges.iter().any(|(n, _)| n == bridge) {
                bridges.push((bridge.clone(), acs));
            }
        }
    }
    let common_bridge = (shared >= 2).then(|| a.chain[shared - 1].clone());
    Meeting {
        shared,
        common_bridge,
        bridges,
    }
}

/// How many components of `e.dir` lead to its chain's element `i`.
fn dir_depth(e: &Endpoint, i: usize) -> usize {
    let total = e.dir.iter().count();
    total - (e.chain.len() - 1 - i)
}
