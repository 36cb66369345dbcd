//! Where GPUs, RDMA NICs and host memory sit, read from sysfs, and which NICs are nearest to
//! some memory.
//!
//! Everything is read below a sysfs root (`/sys`, or a recorded tree in tests): the `device`
//! links of `class/drm/card*`, `class/infiniband/*` and `class/net/*` resolve to
//! `devices/pci<domain>:<bus>/<root port>/.../<function>`, whose path is the chain of
//! bridges above the function ([`Endpoint`]).
//!
//! * [`endpoint`], [`gpus`], [`nics`], [`pci_device`]: a device's place. A soft-RoCE device
//!   (`rxe`) has no `device` link: it is placed through its `parent` netdev, and a device
//!   whose link leads to a virtio device (`.../0000:00:03.0/virtio2`) at the PCI function
//!   above it.
//! * [`pair`]: where two devices meet (below one PCIe switch, or only at the root complex),
//!   with the ACS of each bridge in between ([`pci::Acs`]).
//! * [`Endpoint::numa_node`] and [`memory_numa_node`]: the NUMA node of a PCI device and of a
//!   page of host memory.
//! * [`rank`]: for memory at a [`Near`], every NIC with its tier (0 the nearest) and a
//!   reason a person can read, after an optional [`NicOverride`] (the environment variable
//!   [`NICS_ENV`], `GPU_RDMA_NICS`, for machines whose firmware misreports the topology).
//!
//! ```no_run
//! use gpu_rdma_topology::{nics, rank, Near, NicOverride};
//! use std::path::Path;
//!
//! let sysfs = Path::new("/sys");
//! let over = NicOverride::from_environment().expect("a valid GPU_RDMA_NICS");
//! for r in rank(sysfs, &Near::Pci("0000:21:00.0".into()), &nics(sysfs), over.as_ref()) {
//!     println!("tier {}: {}", r.tier, r.reason);
//! }
//! ```
#![deny(unsafe_code)]

mod near;
mod nic_override;
mod path;
pub mod pci;
mod place;
mod rank;
mod sys;

pub use near::Near;
pub use nic_override::{NicOverride, OverrideError, NICS_ENV};
pub use path::{pair, Meeting};
pub use place::{class_entries, endpoint, gpus, memory_numa_node, nics, pci_device, Endpoint};
pub use rank::{rank, Proximity, Ranked};

// The README's example is compiled as a doc test, so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
