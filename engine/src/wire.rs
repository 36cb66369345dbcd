//! The control channel's messages, one reply per request, each a frame of the
//! [`Channel`]: a tag and the message's fields.

use crate::channel::{Channel, Waits};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Limit, Result};
use rdma_dmabuf::Endpoint;
use std::time::Duration;

/// The largest reply a client reads (a descriptor of many segments).
const MAX_REPLY: usize = 16 << 20;

/// What a peer asks of an agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Request {
    /// The agent's descriptor ([`AgentDescriptor::to_bytes`](crate::AgentDescriptor)).
    Describe,
    /// The agent's incarnation.
    Check,
    /// A queue pair on the agent's device `device`, connected to `endpoint`.
    Connect { device: u16, endpoint: Endpoint },
    /// A notification for the agent's queue, from the agent the connection authenticated.
    Notify { message: Vec<u8> },
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
    /// Refused at one of the agent's [`Limits`](crate::Limits).
    Limited {
        limit: Limit,
        detail: String,
    },
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Request::Describe => w.u8(1),
            Request::Check => w.u8(2),
            Request::Connect { device, endpoint } => w.u8(3).u16(*device).raw(&endpoint.to_bytes()),
            Request::Notify { message } => w.u8(4).bytes(message),
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
    /// This reply to a `Notify`: `Ok` when the peer queued it.
    pub fn noted(self) -> Result<()> {
        match self {
            Reply::Noted => Ok(()),
            Reply::Refused(why) => Err(Error::Protocol(format!("notification refused: {why}"))),
            other => Err(Error::Protocol(format!("{other:?} to Notify"))),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Reply::Descriptor(d) => w.u8(1).bytes(d),
            Reply::Incarnation(i) => w.u8(2).u64(*i),
            Reply::Connected(e) => w.u8(3).raw(&e.to_bytes()),
            Reply::Noted => w.u8(4),
            Reply::Refused(why) => w.u8(5).str(why),
            Reply::Released(n) => w.u8(6).u32(*n),
            Reply::Limited { limit, detail } => w.u8(7).u8(limit_code(*limit)).str(detail),
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
            7 => Reply::Limited {
                limit: limit_of(r.u8()?)?,
                detail: r.str()?,
            },
            t => return Err(Error::Protocol(format!("unknown reply tag {t}"))),
        };
        r.end()?;
        Ok(out)
    }
}

fn endpoint(b: &[u8]) -> Result<Endpoint> {
    Endpoint::from_bytes(b).map_err(|e| Error::Protocol(e.to_string()))
}

/// Each limit's code on the wire is its place here (new ones at the end).
const LIMITS: [Limit; 8] = [
    Limit::Connections,
    Limit::ConnectionsPerPeer,
    Limit::QueuePairsPerConnection,
    Limit::QueuePairsPerPeer,
    Limit::NotificationsPerSender,
    Limit::Notifications,
    Limit::RequestBytes,
    Limit::QueuePairs,
];

fn limit_code(l: Limit) -> u8 {
    LIMITS
        .iter()
        .position(|&x| x == l)
        .map_or(u8::MAX, |i| i as u8)
}

fn limit_of(code: u8) -> Result<Limit> {
    LIMITS
        .get(usize::from(code))
        .copied()
        .ok_or_else(|| Error::Protocol(format!("unknown limit {code}")))
}

/// Sends `req` on `ch` and reads the reply (`addr` names the peer in errors; `timeout`
/// bounds the wait for it). A refusal at one of the peer's limits is
/// [`Error::LimitReached`].
pub(crate) fn call(
    ch: &mut Channel,
    addr: impl std::fmt::Display,
    timeout: Duration,
    req: &Request,
) -> Result<Reply> {
    ch.send(&req.encode())
        .map_err(|e| Error::io("send a request to", &addr, e))?;
    let waits = Waits {
        idle: Some(timeout),
        frame: timeout,
        until: None,
    };
    let b = ch
        .recv(MAX_REPLY, waits)
        .map_err(|e| Error::io("read the reply of", &addr, e))?;
    match Reply::decode(&b)? {
        Reply::Limited { limit, detail } => Err(Error::LimitReached {
            peer: addr.to_string(),
            limit,
            detail,
        }),
        r => Ok(r),
    }
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
                message: b"landed".to_vec(),
            },
            Request::Release {
                qpns: vec![0x11, 0xff_ffff],
            },
        ];
        for req in reqs {
            assert_eq!(Request::decode(&req.encode()).unwrap(), req);
        }
        for rep in [
            Reply::Incarnation(7),
            Reply::Noted,
            Reply::Released(2),
            Reply::Refused("no".into()),
            Reply::Limited {
                limit: Limit::QueuePairsPerPeer,
                detail: "1024".into(),
            },
        ] {
            assert_eq!(Reply::decode(&rep.encode()).unwrap(), rep);
        }
        assert!(Request::decode(&[9]).is_err());
        assert!(Reply::decode(&[7, 200, 0, 0, 0, 0]).is_err());
    }
}
