//! Work requests and their completions.

use std::fmt;

/// What a work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkKind {
    /// `IBV_WR_SEND`.
    Send,
    /// A posted receive.
    Recv,
    /// `IBV_WR_RDMA_WRITE` (or `_WITH_IMM`).
    Write,
    /// `IBV_WR_RDMA_READ`.
    Read,
}

impl fmt::Display for WorkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkKind::Send => "send",
            WorkKind::Recv => "receive",
            WorkKind::Write => "RDMA write",
            WorkKind::Read => "RDMA read",
        })
    }
}

/// A successful work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The request's id.
    pub wr_id: u64,
    /// What it was.
    pub kind: WorkKind,
    /// Bytes received (receives) or moved.
    pub byte_len: u32,
    /// Immediate data (host byte order) of a send or write with immediate.
    pub imm: Option<u32>,
}
