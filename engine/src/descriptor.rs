//! Descriptors: what a peer needs to reach an agent's segments, and their versioned wire
//! form.

use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};

/// The descriptor format this engine writes and the only one it reads.
pub const FORMAT_VERSION: u16 = 3;

/// The first bytes of an encoded [`AgentDescriptor`]; the format version follows.
const MAGIC: &[u8; 4] = b"GRE\0";

/// The flag of a segment's access byte that says a base address follows.
const BASE: u8 = 4;

fn base_bit(base: Option<u64>) -> u8 {
    if base.is_some() {
        BASE
    } else {
        0
    }
}

/// A segment's registration on one of its agent's devices.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceRegion {
    /// The device's index in its agent's device list.
    pub device: u16,
    /// The device's name (`rxe0`, `mlx5_0`).
    pub device_name: String,
    /// The GID the agent's queue pairs on this device send from.
    pub gid: [u8; 16],
    /// The address peers use (the region's iova).
    pub addr: u64,
    /// The remote key.
    pub rkey: u32,
    /// How near the device is to the segment's memory, 0 the nearest (its agent's ranking:
    /// same PCIe switch, then root complex, then NUMA node, then the rest; or its
    /// override). Transfers stripe over a segment's nearest tier and fall back to the
    /// others only when a rail of it fails.
    pub tier: u8,
}

/// A registered segment as peers see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentDescriptor {
    /// The segment's name, unique within its agent.
    pub name: String,
    /// Its length in bytes.
    pub len: u64,
    /// The address of its first byte in its agent's process, for memory that has one (host
    /// memory: its virtual address; CUDA memory: its device pointer), `None` for a dma-buf.
    /// Peers name memory by address with [`Batch::write_at`](crate::Batch::write_at) and
    /// [`Batch::read_at`](crate::Batch::read_at): an address resolves to the segment whose
    /// `[base, base + len)` holds the whole range.
    pub base: Option<u64>,
    /// Whether peers may RDMA-read it.
    pub remote_read: bool,
    /// Whether peers may RDMA-write it.
    pub remote_write: bool,
    /// Its registrations, one per device it is registered on.
    pub regions: Vec<DeviceRegion>,
}

impl SegmentDescriptor {
    /// Whether `[addr, addr + len)` lies inside the segment's `[base, base + len)` (never for
    /// a segment without a base address, a range of length 0 or one that wraps).
    pub fn holds(&self, addr: u64, len: u64) -> bool {
        let (Some(base), Some(end)) = (self.base, addr.checked_add(len)) else {
            return false;
        };
        len > 0 && addr >= base && end <= base.saturating_add(self.len)
    }
}

/// An agent and its segments: what the metadata service publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentDescriptor {
    /// The agent's name, unique in its metadata service.
    pub agent: String,
    /// Random per start of the agent: a restarted agent is a new incarnation, and keys of an
    /// old one are never used.
    pub incarnation: u64,
    /// Its segments.
    pub segments: Vec<SegmentDescriptor>,
}

impl AgentDescriptor {
    /// The segment of this name.
    pub fn segment(&self, name: &str) -> Option<&SegmentDescriptor> {
        self.segments.iter().find(|s| s.name == name)
    }

    /// The segment whose `[base, base + len)` holds all of `[addr, addr + len)`, if any.
    pub fn segment_at(&self, addr: u64, len: u64) -> Option<&SegmentDescriptor> {
        self.segments.iter().find(|s| s.holds(addr, len))
    }

    /// The wire form: magic `GRE\0`, [`FORMAT_VERSION`] (u16), then the fields,
    /// little-endian, strings and lists with a u32 length; a segment's base address (a u64)
    /// follows its access byte when that byte's bit 2 is set.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.raw(MAGIC).u16(FORMAT_VERSION);
        w.str(&self.agent).u64(self.incarnation);
        w.u32(self.segments.len() as u32);
        for s in &self.segments {
            w.str(&s.name).u64(s.len);
            w.u8(u8::from(s.remote_read) | u8::from(s.remote_write) << 1 | base_bit(s.base));
            if let Some(b) = s.base {
                w.u64(b);
            }
            w.u32(s.regions.len() as u32);
            for r in &s.regions {
                w.u16(r.device).str(&r.device_name).raw(&r.gid);
                w.u64(r.addr).u32(r.rkey).u8(r.tier);
            }
        }
        w.0
    }

    /// Parses what [`AgentDescriptor::to_bytes`] wrote.
    ///
    /// # Errors
    /// [`Error::IncompatibleVersion`] for another format version (checked before anything
    /// else is read); [`Error::Protocol`] for a wrong magic, a short or long message,
    /// unknown access bits, a segment that lists a device twice, or a segment whose range
    /// on some device (its address plus its length) passes the end of the address space.
    pub fn from_bytes(b: &[u8]) -> Result<AgentDescriptor> {
        let mut r = Reader::new(b);
        r.header(MAGIC, FORMAT_VERSION, "an agent descriptor")?;
        let agent = r.str()?;
        let incarnation = r.u64()?;
        let n = r.u32()?;
        let mut segments = Vec::new();
        for _ in 0..n {
            let name = r.str()?;
            let len = r.u64()?;
            let access = r.u8()?;
            if access > 7 {
                return Err(Error::Protocol(format!("access bits {access:#x}")));
            }
            let base = if access & BASE != 0 {
                let b = r.u64()?;
                if b.checked_add(len).is_none() {
                    return Err(Error::Protocol(format!(
                        "segment {name:?}: {len} bytes at base {b:#x} end past the end of the \
                         address space"
                    )));
                }
                Some(b)
            } else {
                None
            };
            let m = r.u32()?;
            let mut regions = Vec::new();
            for _ in 0..m {
                regions.push(DeviceRegion {
                    device: r.u16()?,
                    device_name: r.str()?,
                    gid: r.raw(16)?.try_into().expect("16 bytes"),
                    addr: r.u64()?,
                    rkey: r.u32()?,
                    tier: r.u8()?,
                });
            }
            // Sorted, not compared pairwise: a frame may list many regions.
            let mut devices: Vec<u16> = regions.iter().map(|r| r.device).collect();
            devices.sort_unstable();
            if devices.windows(2).any(|w| w[0] == w[1]) {
                return Err(Error::Protocol(format!(
                    "segment {name:?}: a device listed twice"
                )));
            }
            if let Some(r) = regions.iter().find(|r| r.addr.checked_add(len).is_none()) {
                return Err(Error::Protocol(format!(
                    "segment {name:?}: {len} bytes at {:#x} on device {} end past the end of \
                     the address space",
                    r.addr, r.device
                )));
            }
            segments.push(SegmentDescriptor {
                name,
                len,
                base,
                remote_read: access & 1 != 0,
                remote_write: access & 2 != 0,
                regions,
            });
        }
        r.end()?;
        Ok(AgentDescriptor {
            agent,
            incarnation,
            segments,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> AgentDescriptor {
        AgentDescriptor {
            agent: "prefill-0".into(),
            incarnation: 0x1234_5678_9abc_def0,
            segments: vec![SegmentDescriptor {
                name: "kv".into(),
                len: 1 << 20,
                base: Some(0x7f00_0000_0000),
                remote_read: true,
                remote_write: false,
                regions: vec![DeviceRegion {
                    device: 1,
                    device_name: "rxe1".into(),
                    gid: [7; 16],
                    addr: 0x1000,
                    rkey: 42,
                    tier: 1,
                }],
            }],
        }
    }

    #[test]
    fn round_trips() {
        let d = sample();
        assert_eq!(AgentDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
    }

    #[test]
    fn another_version_is_refused_typed() {
        let mut b = sample().to_bytes();
        b[4] = 1;
        assert_eq!(
            AgentDescriptor::from_bytes(&b),
            Err(Error::IncompatibleVersion {
                found: 1,
                supported: FORMAT_VERSION
            })
        );
    }

    #[test]
    fn truncated_long_and_foreign_bytes_are_refused() {
        let b = sample().to_bytes();
        for cut in 0..b.len() {
            assert!(
                AgentDescriptor::from_bytes(&b[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut long = b.clone();
        long.push(0);
        assert!(matches!(
            AgentDescriptor::from_bytes(&long),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            AgentDescriptor::from_bytes(b"HTTP/1.1"),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn a_segment_ending_past_the_address_space_is_refused() {
        for (addr, len) in [(u64::MAX, 1), (u64::MAX - 4095, 4097), (1, u64::MAX)] {
            let mut d = sample();
            d.segments[0].len = len;
            d.segments[0].regions[0].addr = addr;
            assert!(
                matches!(
                    AgentDescriptor::from_bytes(&d.to_bytes()),
                    Err(Error::Protocol(m)) if m.contains("address space")
                ),
                "{addr:#x} + {len}"
            );
        }
        // Ending at the last byte is fine.
        let mut d = sample();
        d.segments[0].len = 4096;
        d.segments[0].regions[0].addr = u64::MAX - 4096;
        assert_eq!(AgentDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
    }

    #[test]
    fn a_base_address_round_trips_and_holds_only_whole_ranges() {
        let mut d = sample();
        let s = &d.segments[0];
        let base = 0x7f00_0000_0000;
        assert!(s.holds(base, 1 << 20));
        assert!(s.holds(base + 10, 100));
        assert!(!s.holds(base - 1, 2), "starts before");
        assert!(!s.holds(base + (1 << 20) - 1, 2), "ends after");
        assert!(!s.holds(base, 0), "length 0");
        assert!(!s.holds(u64::MAX - 1, 4), "wraps");
        assert_eq!(
            d.segment_at(base + 4096, 4096).map(|s| &*s.name),
            Some("kv")
        );
        d.segments[0].base = None;
        assert!(!d.segments[0].holds(base, 1));
        assert_eq!(AgentDescriptor::from_bytes(&d.to_bytes()).unwrap(), d);
        let mut far = sample();
        far.segments[0].base = Some(u64::MAX - 10);
        assert!(matches!(
            AgentDescriptor::from_bytes(&far.to_bytes()),
            Err(Error::Protocol(m)) if m.contains("base")
        ));
    }

    #[test]
    fn a_segment_listing_a_device_twice_is_refused() {
        let mut d = sample();
        let twice = d.segments[0].regions[0].clone();
        d.segments[0].regions.push(twice);
        assert!(matches!(
            AgentDescriptor::from_bytes(&d.to_bytes()),
            Err(Error::Protocol(m)) if m.contains("twice")
        ));
    }
}
