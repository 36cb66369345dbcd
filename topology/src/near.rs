//! [`Near`]: where some memory is.

use std::fmt;

/// Where memory is, as far as its owner knows.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Near {
    /// Device memory of the PCI function at this address (`0000:21:00.0`): a GPU's.
    Pci(String),
    /// Host memory on this NUMA node.
    Numa(u32),
    /// Not known (a dma-buf whose exporter was not named): every NIC is as near.
    Unknown,
}

impl fmt::Display for Near {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Near::Pci(a) => f.write_str(a),
            Near::Numa(n) => write!(f, "NUMA node {n}"),
            Near::Unknown => f.write_str("an unknown place"),
        }
    }
}
