//! PCI details read from sysfs files: BAR sizes (`resource`) and the ACS control of a bridge
//! (`config`, the device's configuration space; the kernel lets only root read past its
//! first 64 bytes, so the extended capabilities are unknown to other users).

/// `IORESOURCE_MEM` in a `resource` line's flags.
const IORESOURCE_MEM: u64 = 0x200;
/// `IORESOURCE_PREFETCH`.
const IORESOURCE_PREFETCH: u64 = 0x2000;
/// The PCIe extended capability ID of Access Control Services.
const EXT_CAP_ACS: u16 = 0x000d;

/// One memory BAR of a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bar {
    /// Its index (0 to 5).
    pub index: usize,
    /// Bytes.
    pub size: u64,
    /// Whether it is prefetchable (where GPUs put their memory window).
    pub prefetchable: bool,
}

/// The memory BARs of a `resource` file (`start end flags` per line, in hex; lines 0 to 5 are
/// the BARs, then the ROM and, for bridges, the windows). Unused BARs are left out.
pub fn bars(resource: &str) -> Vec<Bar> {
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    resource
        .lines()
        .take(6)
        .enumerate()
        .filter_map(|(index, line)| {
            let mut w = line.split_whitespace().map(hex);
            let (start, end, flags) = (w.next()??, w.next()??, w.next()??);
            (flags & IORESOURCE_MEM != 0 && end > start).then(|| Bar {
                index,
                size: end - start + 1,
                prefetchable: flags & IORESOURCE_PREFETCH != 0,
            })
        })
        .collect()
}

/// What a bridge's ACS says about peer-to-peer requests that cross it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acs {
    /// The configuration space past 64 bytes could not be read (not root).
    Unknown,
    /// The bridge has no ACS capability: peer-to-peer is routed directly.
    Absent,
    /// The ACS control register.
    Control {
        /// P2P Request Redirect: requests go up to the root complex.
        request_redirect: bool,
        /// P2P Completion Redirect.
        completion_redirect: bool,
        /// P2P Egress Control.
        egress_control: bool,
    },
}

impl Acs {
    /// Whether peer-to-peer traffic is sent up to the root complex at this bridge.
    pub fn redirects(self) -> bool {
        matches!(
            self,
            Acs::Control {
                request_redirect: true,
                ..
            } | Acs::Control {
                completion_redirect: true,
                ..
            } | Acs::Control {
                egress_control: true,
                ..
            }
        )
    }
}

impl std::fmt::Display for Acs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acs::Unknown => f.write_str("ACS unknown (its config space is readable by root only)"),
            Acs::Absent => f.write_str("no ACS"),
            Acs::Control {
                request_redirect,
                completion_redirect,
                egress_control,
            } => {
                let on: Vec<&str> = [
                    (*request_redirect, "request redirect"),
                    (*completion_redirect, "completion redirect"),
                    (*egress_control, "egress control"),
                ]
                .iter()
                .filter(|(b, _)| *b)
                .map(|(_, n)| *n)
                .collect();
                if on.is_empty() {
                    f.write_str("ACS without P2P redirect")
                } else {
                    write!(f, "ACS {}", on.join(", "))
                }
            }
        }
    }
}

fn u16_at(config: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes([*config.get(at)?, *config.get(at + 1)?]))
}

fn u32_at(config: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes([
        *config.get(at)?,
        *config.get(at + 1)?,
        *config.get(at + 2)?,
        *config.get(at + 3)?,
    ]))
}

/// The ACS control of a device from its configuration space (the bytes of its sysfs
/// `config` file): the extended capability list from offset 0x100 is walked for ACS (ID 0x0d),
/// whose control register sits 6 bytes in.
pub fn acs(config: &[u8]) -> Acs {
    if config.len() < 0x104 {
        return Acs::Unknown;
    }
    let mut at = 0x100usize;
    for _ in 0..64 {
        let Some(header) = u32_at(config, at) else {
            return Acs::Unknown;
        };
        if header == 0 || header == u32::MAX {
            return Acs::Absent;
        }
        if header as u16 == EXT_CAP_ACS {
            let Some(control) = u16_at(config, at + 6) else {
                return Acs::Unknown;
            };
            return Acs::Control {
                request_redirect: control & (1 << 2) != 0,
                completion_redirect: control & (1 << 3) != 0,
                egress_control: control & (1 << 5) != 0,
            };
        }
        let next = (header >> 20) as usize & !3;
        if next < 0x100 {
            return Acs::Absent;
        }
        at = next;
    }
    Acs::Absent
}

/// Whether `name` is a PCI address (`dddd:bb:dd.f`).
pub fn is_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| [4, 7, 10].contains(&i) || c.is_ascii_hexdigit())
}

/// Bytes as `256 MiB`, `32 GiB`.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes;
    let mut u = 0;
    while v >= 1024 && v.is_multiple_of(1024) && u + 1 < UNITS.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_acs(control: u16) -> Vec<u8> {
        let mut c = vec![0u8; 4096];
        // Extended capability 0x100: AER (ID 1), next at 0x148.
        c[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x148 << 20)).to_le_bytes());
        // 0x148: ACS (ID 0x0d), last.
        c[0x148..0x14c].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        c[0x14e..0x150].copy_from_slice(&control.to_le_bytes());
        c
    }

    #[test]
    fn acs_control_is_found_after_other_capabilities() {
        assert_eq!(
            acs(&config_with_acs(0b1_1101)),
            Acs::Control {
                request_redirect: true,
                completion_redirect: true,
                egress_control: false
            }
        );
        assert!(acs(&config_with_acs(0b1_1101)).redirects());
        assert!(!acs(&config_with_acs(0b1_0001)).redirects());
        assert_eq!(acs(&[0u8; 64]), Acs::Unknown);
        assert_eq!(acs(&[0u8; 4096]), Acs::Absent);
    }

    #[test]
    fn bars_are_read_from_the_resource_file() {
        let text = "0x0000006000000000 0x00000067ffffffff 0x000000000014220c\n\
                    0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                    0x00000000fb000000 0x00000000fbffffff 0x0000000000040200\n\
                    0x000000000000e000 0x000000000000e0ff 0x0000000000040101\n";
        let b = bars(text);
        assert_eq!(b.len(), 2);
        assert_eq!(
            (b[0].index, b[0].size, b[0].prefetchable),
            (0, 32 << 30, true)
        );
        assert_eq!(
            (b[1].index, b[1].size, b[1].prefetchable),
            (2, 16 << 20, false)
        );
        assert_eq!(size_text(256 << 20), "256 MiB");
        assert!(is_address("0000:03:00.0") && !is_address("pci0000:00"));
    }
}
