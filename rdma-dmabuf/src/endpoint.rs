//! [`Endpoint`]: what two RC queue pairs exchange out of band to connect.

use crate::device::{Gid, Mtu};
use crate::error::{Error, Op, Result};

/// A queue pair's address: queue pair number, first packet sequence number, LID, GID, MTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// LID (0 on RoCE).
    pub lid: u16,
    /// The GID the queue pair sends from.
    pub gid: Gid,
    /// The port's active MTU.
    pub mtu: Mtu,
}

const MAGIC: &[u8; 3] = b"EP\x01";

impl Endpoint {
    /// Bytes on the wire: magic `EP`, version 1, qpn, psn (u32 LE), lid (u16 LE), gid (16),
    /// mtu code (1).
    pub const WIRE_LEN: usize = 3 + 4 + 4 + 2 + 16 + 1;

    /// Serialises for the out-of-band exchange.
    pub fn to_bytes(&self) -> [u8; Self::WIRE_LEN] {
        let mut b = [0u8; Self::WIRE_LEN];
        b[..3].copy_from_slice(MAGIC);
        b[3..7].copy_from_slice(&self.qpn.to_le_bytes());
        b[7..11].copy_from_slice(&self.psn.to_le_bytes());
        b[11..13].copy_from_slice(&self.lid.to_le_bytes());
        b[13..29].copy_from_slice(&self.gid.0);
        b[29] = self.mtu as u8;
        b
    }

    /// Parses and validates what [`Endpoint::to_bytes`] wrote.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a wrong length, magic or version, a qpn or psn wider
    /// than 24 bits, or an unknown MTU code.
    pub fn from_bytes(b: &[u8]) -> Result<Endpoint> {
        let bad = |what: String| Err(Error::invalid(Op::Parse, format!("endpoint: {what}")));
        if b.len() != Self::WIRE_LEN {
            return bad(format!("{} bytes, expected {}", b.len(), Self::WIRE_LEN));
        }
        if &b[..3] != MAGIC {
            return bad("bad magic or version".into());
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let (qpn, psn) = (u32_at(3), u32_at(7));
        if qpn == 0 || qpn >= 1 << 24 || psn >= 1 << 24 {
            return bad(format!("qpn {qpn:#x} or psn {psn:#x} out of range"));
        }
        let Some(mtu) = Mtu::from_raw(u32::from(b[29])) else {
            return bad(format!("unknown MTU code {}", b[29]));
        };
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[13..29]);
        Ok(Endpoint {
            qpn,
            psn,
            lid: u16::from_le_bytes([b[11], b[12]]),
            gid: Gid(gid),
            mtu,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Endpoint {
        Endpoint {
            qpn: 0x11,
            psn: 0xabcdef,
            lid: 0,
            gid: Gid([7; 16]),
            mtu: Mtu::Mtu1024,
        }
    }

    #[test]
    fn round_trips() {
        let e = sample();
        assert_eq!(Endpoint::from_bytes(&e.to_bytes()).unwrap(), e);
    }

    #[test]
    fn malformed_bytes_are_refused() {
        let b = sample().to_bytes();
        assert!(
            Endpoint::from_bytes(&b[..b.len() - 1]).is_err(),
            "truncated"
        );
        assert!(
            Endpoint::from_bytes(&[b.as_slice(), &[0]].concat()).is_err(),
            "too long"
        );
        let mut m = b;
        m[2] = 9;
        assert!(Endpoint::from_bytes(&m).is_err(), "version");
        let mut q = b;
        q[6] = 1; // qpn bit 24
        assert!(Endpoint::from_bytes(&q).is_err(), "qpn");
        let mut t = b;
        t[29] = 0;
        assert!(Endpoint::from_bytes(&t).is_err(), "mtu");
        let e = Endpoint::from_bytes(&b[..5]).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }));
    }
}
