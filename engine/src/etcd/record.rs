//! The etcd backend's values: the agent record, a segment's value, typed errors.

use crate::codec::{Reader, Writer};
use crate::descriptor::{AgentDescriptor, SegmentDescriptor, FORMAT_VERSION};
use crate::error::{Error, Result};
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

/// Refuses an agent name that would not stay inside its own prefix.
pub(super) fn check_name(agent: &str) -> Result<()> {
    if agent.is_empty() || agent.contains('/') {
        return Err(Error::Settings(format!(
            "agent name {agent:?}: the etcd backend needs a non-empty name without '/'"
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
