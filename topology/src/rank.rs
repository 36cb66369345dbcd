//! The NICs ranked by how near each is to some memory.

use crate::near::Near;
use crate::nic_override::NicOverride;
use crate::path::pair;
use crate::place::{pci_device, Endpoint};
use std::fmt;
use std::path::Path;

/// How a NIC stands to the memory, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Proximity {
    /// Named for this memory by the [`NicOverride`].
    Listed,
    /// The memory's place is unknown.
    Unknown,
    /// Below one bridge under the host bridge with the memory's device: one PCIe switch
    /// (peer-to-peer traffic need not cross the root complex).
    Switch,
    /// Under the same host bridge (root complex), on another root port.
    HostBridge,
    /// Under another host bridge, on the memory's NUMA node.
    Numa,
    /// Anywhere else, or not known to be near (a NIC off PCI, NUMA nodes unknown).
    Other,
}

impl Proximity {
    /// `listed`, `unknown`, `switch`, `host-bridge`, `numa`, `other`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proximity::Listed => "listed",
            Proximity::Unknown => "unknown",
            Proximity::Switch => "switch",
            Proximity::HostBridge => "host-bridge",
            Proximity::Numa => "numa",
            Proximity::Other => "other",
        }
    }
}

impl fmt::Display for Proximity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One NIC's place in a ranking.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranked {
    /// Its position in the list of NICs ranked.
    pub index: usize,
    /// Its name.
    pub nic: String,
    /// 0 for the nearest NICs, then 1, 2, ...: the rank of its [`Proximity`] among those of
    /// the NICs ranked (dense: with no NIC behind the memory's switch, those under its host
    /// bridge are tier 0). With an override, the NICs it lists are tier 0 and the others
    /// follow, one tier further than without it.
    pub tier: u8,
    /// How it stands to the memory.
    pub proximity: Proximity,
    /// Why, for a person: `rxe0: behind the same PCIe switch as 0000:21:00.0 (bridge
    /// 0000:20:00.0)`.
    pub reason: String,
}

/// The proximity of `nic` to the PCI function `mem`, with the reason.
fn to_device(
    sysfs: &Path,
    mem: &Endpoint,
    mem_numa: Option<u32>,
    nic: &Endpoint,
) -> (Proximity, String) {
    let (n, a) = (&nic.name, &mem.name);
    let Some(nic_bridge) = nic.host_bridge() else {
        return (
            Proximity::Other,
            format!("{n}: not on PCI, so not known to be near {a}"),
        );
    };
    let m = pair(sysfs, mem, nic);
    if m.shared == nic.chain.len() && m.shared == mem.chain.len() {
        return (
            Proximity::Switch,
            format!("{n}: the same PCI function as {a}"),
        );
    }
    if let Some(bridge) = &m.common_bridge {
        let what = if m.shared >= 3 {
            "behind the same PCIe switch as"
        } else {
            "below the same root port as"
        };
        return (
            Proximity::Switch,
            format!("{n}: {what} {a} (bridge {bridge})"),
        );
    }
    if m.shared == 1 {
        return (
            Proximity::HostBridge,
            format!("{n}: under the same host bridge as {a} ({nic_bridge}), on another root port"),
        );
    }
    let mem_bridge = mem.host_bridge().unwrap_or("?");
    let nic_numa = nic.numa_node(sysfs);
    match (nic_numa, mem_numa) {
        (Some(x), Some(y)) if x == y => (
            Proximity::Numa,
            format!("{n}: on NUMA node {x}, as {a}, under another host bridge ({nic_bridge}, not {mem_bridge})"),
        ),
        _ => (
            Proximity::Other,
            format!(
                "{n}: under another host bridge ({nic_bridge}, not {mem_bridge}) and {}",
                numa_text(nic_numa, mem_numa)
            ),
        ),
    }
}

fn numa_text(nic: Option<u32>, mem: Option<u32>) -> String {
    match (nic, mem) {
        (Some(x), Some(y)) => format!("on NUMA node {x}, the memory on {y}"),
        (None, Some(y)) => format!("its NUMA node unknown, the memory on {y}"),
        (None, None) => "its NUMA node unknown".into(),
        (_, None) => "the memory's NUMA node unknown".into(),
    }
}

/// Every NIC of `nics` with its tier and reason, for memory at `near`, nearest first (NICs of
/// one tier in the order given; those an override lists, in its order), reading the places
/// below `sysfs`:
///
/// * memory of a PCI function (a GPU): NICs behind the same PCIe switch, then under the same
///   host bridge, then on the same NUMA node (both known), then the rest;
/// * host memory on a NUMA node: NICs on that node, then the rest;
/// * unknown memory (or a PCI address sysfs does not have): every NIC tier 0.
///
/// With `nic_override`, the NICs its rule for `near` lists (a rule for the address, else for
/// the memory's NUMA node, else `*`) come first, tier 0, in its order; the others keep their
/// order after them, one tier further. Names it lists that are not in `nics` are passed over.
pub fn rank(
    sysfs: &Path,
    near: &Near,
    nics: &[Endpoint],
    nic_override: Option<&NicOverride>,
) -> Vec<Ranked> {
    let mut numa = None;
    let found: Vec<(Proximity, String)> = match near {
        Near::Pci(address) => match pci_device(sysfs, address) {
            Some(mem) => {
                numa = mem.numa_node(sysfs);
                nics.iter()
                    .map(|n| to_device(sysfs, &mem, numa, n))
                    .collect()
            }
            None => nics
                .iter()
                .map(|n| {
                    let why = format!(
                        "{}: {address} is not a PCI function here, so every NIC is as near",
                        n.name
                    );
                    (Proximity::Unknown, why)
                })
                .collect(),
        },
        Near::Numa(node) => {
            numa = Some(*node);
            nics.iter()
                .map(|n| match n.numa_node(sysfs) {
                    _ if n.address().is_none() => (
                        Proximity::Other,
                        format!(
                            "{}: not on PCI, so not known to be on NUMA node {node}",
                            n.name
                        ),
                    ),
                    Some(x) if x == *node => (
                        Proximity::Numa,
                        format!("{}: on NUMA node {x}, as the memory", n.name),
                    ),
                    other => (
                        Proximity::Other,
                        format!("{}: {}", n.name, numa_text(other, Some(*node))),
                    ),
                })
                .collect()
        }
        Near::Unknown => nics
            .iter()
            .map(|n| {
                let why = format!(
                    "{}: the memory's place is unknown, so every NIC is as near",
                    n.name
                );
                (Proximity::Unknown, why)
            })
            .collect(),
    };
    let mut present: Vec<Proximity> = found.iter().map(|f| f.0).collect();
    present.sort();
    present.dedup();
    let dense = |p: Proximity| present.iter().position(|&q| q == p).unwrap_or(0) as u8;
    let mut ranked: Vec<Ranked> = nics
        .iter()
        .zip(found)
        .enumerate()
        .map(|(index, (nic, (proximity, reason)))| Ranked {
            index,
            nic: nic.name.clone(),
            tier: dense(proximity),
            proximity,
            reason,
        })
        .collect();
    ranked.sort_by_key(|r| r.tier);
    match nic_override.and_then(|o| o.rule_for(near, numa)) {
        Some((key, listed)) => apply(ranked, &key, listed),
        None => ranked,
    }
}

/// The override's list for `key` first, tier 0 in its order; the rest one tier further.
fn apply(ranked: Vec<Ranked>, key: &str, listed: &[String]) -> Vec<Ranked> {
    if !ranked.iter().any(|r| listed.contains(&r.nic)) {
        return ranked;
    }
    let mut first = Vec::new();
    for (position, name) in listed.iter().enumerate() {
        for r in ranked.iter().filter(|r| &r.nic == name) {
            first.push(Ranked {
                tier: 0,
                proximity: Proximity::Listed,
                reason: format!(
                    "{name}: listed {} for {key} by the NIC override (without it: {})",
                    ordinal(position + 1),
                    r.reason
                        .strip_prefix(&format!("{name}: "))
                        .unwrap_or(&r.reason)
                ),
                ..r.clone()
            });
        }
    }
    let rest: Vec<Ranked> = ranked
        .into_iter()
        .filter(|r| !listed.contains(&r.nic))
        .collect();
    let mut left: Vec<u8> = rest.iter().map(|r| r.tier).collect();
    left.dedup();
    first.extend(rest.into_iter().map(|r| Ranked {
        tier: left.iter().position(|&t| t == r.tier).unwrap_or(0) as u8 + 1,
        ..r
    }));
    first
}

fn ordinal(n: usize) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}
