//! [`RemoteRegion`]: what a peer is told about a region it may read or write.

use crate::error::{Error, Op, Result};

/// A peer's region: address (the iova for dma-buf regions), length and rkey.
///
/// The fields are public so that a program can carry them in its own wire format; every post
/// that names a remote region checks it ([`RemoteRegion::holds`]: the request fits, and the
/// range does not wrap) and refuses a bad one with [`Error::InvalidArgument`] before anything
/// reaches the NIC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    /// The first byte's address in the peer's region address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// The peer region's rkey.
    pub rkey: u32,
}

impl RemoteRegion {
    /// Bytes on the wire: magic `RR`, version 1, then addr, len (u64) and rkey (u32), little
    /// endian.
    pub const WIRE_LEN: usize = 3 + 8 + 8 + 4;

    /// Serialises for the out-of-band exchange.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..3].copy_from_slice(b"RR\x01");
        b[3..11].copy_from_slice(&self.addr.to_le_bytes());
        b[11..19].copy_from_slice(&self.len.to_le_bytes());
        b[19..].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Parses what [`RemoteRegion::to_bytes`] wrote.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a wrong length, magic or version, a zero length, or an
    /// address range that wraps.
    pub fn from_bytes(b: &[u8]) -> Result<RemoteRegion> {
        let bad = |what: String| Err(Error::invalid(Op::Parse, format!("remote region: {what}")));
        if b.len() != Self::WIRE_LEN {
            return bad(format!("{} bytes, expected {}", b.len(), Self::WIRE_LEN));
        }
        if &b[..3] != b"RR\x01" {
            return bad("bad magic or version".into());
        }
        let word =
            |r: std::ops::Range<usize>| u64::from_le_bytes(b[r].try_into().expect("8 bytes"));
        let r = RemoteRegion {
            addr: word(3..11),
            len: word(11..19),
            rkey: u32::from_le_bytes(b[19..23].try_into().expect("4 bytes")),
        };
        if r.len == 0 || r.addr.checked_add(r.len).is_none() {
            return bad(format!("empty or wrapping range {:#x}+{}", r.addr, r.len));
        }
        Ok(r)
    }

    /// Whether a request of `len` bytes may name this region: `len` fits in it and its address
    /// range does not wrap past the end of the address space. Every post checks it, so a
    /// region whose public fields were set by hand is refused before anything reaches the
    /// NIC.
    #[inline]
    pub fn holds(&self, len: u64) -> bool {
        len <= self.len && self.len <= u64::MAX - self.addr
    }

    /// Why [`RemoteRegion::holds`] refused a request of `len` bytes, in words.
    #[cold]
    pub(crate) fn refusal(&self, what: impl std::fmt::Display, len: u64) -> String {
        if self.len > u64::MAX - self.addr {
            format!(
                "{what} to a remote region of {} bytes at {:#x}, whose range wraps past the end \
                 of the address space (a RemoteRegion built by hand?)",
                self.len, self.addr
            )
        } else {
            format!("{what} of {len} bytes to a remote region of {}", self.len)
        }
    }

    /// The part `[offset, offset + len)` of this region.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if it is empty, reaches past the end, or its address range
    /// wraps around (a region whose fields were set by hand).
    pub fn slice(&self, offset: u64, len: u64) -> Result<RemoteRegion> {
        let addr = self.addr.checked_add(offset);
        let in_range = offset.checked_add(len).is_some_and(|end| end <= self.len);
        let Some(addr) = addr.filter(|a| len != 0 && in_range && a.checked_add(len).is_some())
        else {
            return Err(Error::invalid(
                Op::PostSend,
                format!(
                    "remote slice {offset}+{len} outside the peer's {} bytes at {:#x} (or \
                     wrapping)",
                    self.len, self.addr
                ),
            ));
        };
        Ok(RemoteRegion {
            addr,
            len,
            rkey: self.rkey,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_validates() {
        let r = RemoteRegion {
            addr: 0x1000,
            len: 4096,
            rkey: 0xabcd,
        };
        assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(RemoteRegion::from_bytes(&r.to_bytes()[..10]).is_err());
        let mut bad = r.to_bytes();
        bad[0] = b'X';
        assert!(RemoteRegion::from_bytes(&bad).is_err());
        let wrap = RemoteRegion {
            addr: u64::MAX,
            len: 2,
            rkey: 1,
        };
        assert!(RemoteRegion::from_bytes(&wrap.to_bytes()).is_err());
    }

    #[test]
    fn slices_stay_inside() {
        let r = RemoteRegion {
            addr: 0x1000,
            len: 100,
            rkey: 7,
        };
        assert_eq!(r.slice(10, 90).unwrap().addr, 0x100a);
        assert!(r.slice(10, 91).is_err());
        assert!(r.slice(0, 0).is_err());
    }

    #[test]
    fn holds_refuses_short_and_wrapping_regions() {
        let r = RemoteRegion {
            addr: 0x1000,
            len: 100,
            rkey: 7,
        };
        assert!(r.holds(100) && r.holds(1) && !r.holds(101));
        let end = RemoteRegion {
            addr: u64::MAX - 100,
            len: 100,
            rkey: 7,
        };
        assert!(
            end.holds(100),
            "a range ending just below 2^64 - 1 does not wrap"
        );
        assert_eq!(RemoteRegion::from_bytes(&end.to_bytes()).unwrap(), end);
        let wrap = RemoteRegion {
            addr: u64::MAX - 10,
            len: 100,
            rkey: 7,
        };
        assert!(!wrap.holds(8));
        assert!(wrap.refusal("RDMA write", 8).contains("wraps"));
        assert!(r.refusal("RDMA write", 101).contains("of 101 bytes"));
    }
}
