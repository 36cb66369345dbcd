//! The control channel's messages: length-prefixed frames over TCP, one reply per request.
//!
//! A frame is a u32 length (little-endian, at most [`MAX_FRAME`]) and that many bytes: a tag
//! and the message's fields.

use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use rdma_dmabuf::Endpoint;
use std::io::{Read, Write};

/// The largest frame either side accepts.
const MAX_FRAME: usize = 16 << 20;

/// What a peer asks of an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// The agent's descriptor ([`AgentDescriptor::to_bytes`](crate::AgentDescriptor)).
    Describe,
    /// The agent's incarnation.
    Check,
    /// A queue pair on the agent's device `device`, connected to `endpoint`.
    Connect { device: u16, endpoint: Endpoint },
    /// A notification for the agent's queue.
    Notify { from: String, message: Vec<u8> },
    /// Drop the agent's queue pairs of these numbers that were made over this connection
    /// (a rail that failed: its queue pairs are in the error state on both sides).
    Release { qpns: Vec<u32> },
}

/// The agent's answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Descriptor(Vec<u8>),
    Incarnation(u64),
    Connected(Endpoint),
    Noted,
    /// How many queue pairs a [`Request::Release`] dropped.
    Released(u32),
    Refused(String),
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Request::Describe => w.u8(1),
            Request::Check => w.u8(2),
            Request::Connect { device, endpoint } => w.u8(3).u16(*device).raw(&endpoint.to_bytes()),
            Request::Notify { from, message } => w.u8(4).str(from).bytes(message),
            Request::Release { qpns } => {
                w.u8(5).u32(qpns.len() as u32);
                for &q in qpns {
                    w.u32(q);
                }
                &mut w
            }
        };
        w.0
    }

    pub fn decode(b: &[u8]) -> Result<Request> {
        let mut r = Reader::new(b);
        let out = match r.u8()? {
            1 => Request::Describe,
            2 => Request::Check,
            3 => Request::Connect {
                device: r.u16()?,
                endpoint: endpoint(r.raw(Endpoint::WIRE_LEN)?)?,
            },
            4 => Request::Notify {
                from: r.str()?,
                message: r.bytes()?.to_vec(),
            },
            5 => {
                let n = r.u32()?;
                // Bounded by the frame (4 bytes each), so a forged count allocates nothing.
                let mut qpns = Vec::new();
                for _ in 0..n {
                    qpns.push(r.u32()?);
                }
                Request::Release { qpns }
            }
            t => return Err(Error::Protocol(format!("unknown request tag {t}"))),
        };
        r.end()?;
        Ok(out)
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Reply::Descriptor(d) => w.u8(1).bytes(d),
            Reply::Incarnation(i) => w.u8(2).u64(*i),
            Reply::Connected(e) => w.u8(3).raw(&e.to_bytes()),
            Reply::Noted => w.u8(4),
            Reply::Refused(why) => w.u8(5).str(why),
            Reply::Released(n) => w.u8(6).u32(*n),
        };
        w.0
    }

    pub fn decode(b: &[u8]) -> Result<Reply> {
        let mut r = Reader::new(b);
        let out = match r.u8()? {
            1 => Reply::Descriptor(r.bytes()?.to_vec()),
            2 => Reply::Incarnation(r.u64()?),
            3 => Reply::Connected(endpoint(r.raw(Endpoint::WIRE_LEN)?)?),
            4 => Reply::Noted,
            5 => Reply::Refused(r.str()?),
            6 => Reply::Released(r.u32()?),
            t => return Err(Error::Protocol(format!("unknown reply tag {t}"))),
        };
        r.end()?;
        Ok(out)
    }
}

fn endpoint(b: &[u8]) -> Result<Endpoint> {
    Endpoint::from_bytes(b).map_err(|e| Error::Protocol(e.to_string()))
}

/// Writes one frame.
pub(crate) fn write_frame(s: &mut impl Write, payload: &[u8]) -> std::io::Result<()> {
    let n = u32::try_from(payload.len()).expect("frames are below MAX_FRAME");
    let mut b = Vec::with_capacity(4 + payload.len());
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b)
}

/// Reads one frame (`UnexpectedEof` at a clean end of stream).
pub(crate) fn read_frame(s: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    s.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {n} bytes (at most {MAX_FRAME})"),
        ));
    }
    let mut b = vec![0; n];
    s.read_exact(&mut b)?;
    Ok(b)
}

/// Sends `req` on `s` and reads the reply (`addr` names the peer in errors).
pub(crate) fn call(
    s: &mut (impl Read + Write),
    addr: impl std::fmt::Display,
    req: &Request,
) -> Result<Reply> {
    write_frame(s, &req.encode()).map_err(|e| Error::io("send a request to", &addr, e))?;
    let b = read_frame(s).map_err(|e| Error::io("read the reply of", &addr, e))?;
    Reply::decode(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip_through_frames() {
        let reqs = [
            Request::Describe,
            Request::Check,
            Request::Notify {
                from: "a".into(),
                message: b"landed".to_vec(),
            },
            Request::Release {
                qpns: vec![0x11, 0xff_ffff],
            },
        ];
        for req in reqs {
            let mut buf = Vec::new();
            write_frame(&mut buf, &req.encode()).unwrap();
            let back = read_frame(&mut buf.as_slice()).unwrap();
            assert_eq!(Request::decode(&back).unwrap(), req);
        }
        for rep in [
            Reply::Incarnation(7),
            Reply::Noted,
            Reply::Released(2),
            Reply::Refused("no".into()),
        ] {
            assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        }
        assert!(Request::decode(&[9]).is_err());
        assert!(read_frame(&mut &u32::MAX.to_le_bytes()[..]).is_err());
    }
}
