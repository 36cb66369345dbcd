//! The etcd backend's values: the agent record, a segment's value, typed errors.

use crate::codec::{Reader, Writer};
use crate::descriptor::{AgentDescriptor, SegmentDescriptor, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::names::check_agent_name;
use std::net::SocketAddr;

/// The first bytes of an agent record; [`FORMAT_VERSION`] follows.
pub(super) const RECORD_MAGIC: &[u8; 4] = b"GRA\0";

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) agent: String,
    pub(super) incarnation: u64,
    pub(super) control: SocketAddr,
}

impl Record {
    pub(super) fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.raw(RECORD_MAGIC).u16(FORMAT_VERSION);
        w.str(&self.agent)
            .u64(self.incarnation)
            .str(&self.control.to_string());
        w.0
    }

    pub(super) fn from_bytes(b: &[u8]) -> Result<Record> {
        let mut r = Reader::new(b);
        r.header(RECORD_MAGIC, FORMAT_VERSION, "an agent record")?;
        let agent = r.str()?;
        let incarnation = r.u64()?;
        let control = r
            .str()?
            .parse()
            .map_err(|e| Error::Protocol(format!("agent record's control address: {e}")))?;
        r.end()?;
        Ok(Record {
            agent,
            incarnation,
            control,
        })
    }
}

/// An etcd failure as the engine's typed error.
pub(super) fn metadata(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Metadata {
        op,
        detail: e.to_string(),
    }
}

/// How a request to etcd failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// etcd answered and refused the request itself (too large, invalid, not permitted, out
    /// of space): the connection and the lease are fine, nothing of the request was applied,
    /// and it would be refused again as it is.
    Refused(Error),
    /// No answer in time, a broken connection, or a lease etcd no longer knows: etcd is
    /// lost, and the renewal task publishes again once it answers.
    Lost,
}

/// The gRPC status codes (numbered by gRPC's specification) with which etcd refuses a
/// request itself: `INVALID_ARGUMENT` (3: "etcdserver: request is too large", past
/// `--max-request-bytes`), `ALREADY_EXISTS` (6), `PERMISSION_DENIED` (7),
/// `RESOURCE_EXHAUSTED` (8: a message past the server's gRPC limit, "database space
/// exceeded", "too many requests"), `FAILED_PRECONDITION` (9), `OUT_OF_RANGE` (11),
/// `UNIMPLEMENTED` (12), `UNAUTHENTICATED` (16). The others (`CANCELLED`, `UNKNOWN`,
/// `DEADLINE_EXCEEDED`, `NOT_FOUND`: the lease is gone, `ABORTED`, `INTERNAL`,
/// `UNAVAILABLE`, `DATA_LOSS`) and every transport error are a loss of etcd.
const REFUSALS: [i32; 8] = [3, 6, 7, 8, 9, 11, 12, 16];

/// `e`, met during `op`, as a refusal or a loss ([`Failure`]).
pub(super) fn failure(op: &'static str, e: &etcd_client::Error) -> Failure {
    match e {
        etcd_client::Error::GRpcStatus(s) if REFUSALS.contains(&i32::from(s.code())) => {
            Failure::Refused(Error::MetadataRefused {
                op,
                detail: format!("etcd refused the request (not retried): {e}"),
            })
        }
        _ => Failure::Lost,
    }
}

/// Refuses an agent name that no agent can have ([`check_agent_name`]: empty, control
/// characters, too long) or that would not stay inside its own prefix (a '/').
pub(super) fn check_name(agent: &str) -> Result<()> {
    check_agent_name(agent)?;
    if agent.contains('/') {
        return Err(Error::Settings(format!(
            "agent name {agent:?}: the etcd backend needs a name without '/'"
        )));
    }
    Ok(())
}

/// A segment's value: an agent descriptor holding that segment alone.
pub(super) fn one_segment(agent: &str, incarnation: u64, s: &SegmentDescriptor) -> Vec<u8> {
    AgentDescriptor {
        agent: agent.into(),
        incarnation,
        segments: vec![s.clone()],
    }
    .to_bytes()
}
