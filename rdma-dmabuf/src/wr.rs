//! Work requests and their completions.

use std::fmt;

/// What a work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkKind {
    /// `IBV_WR_SEND`.
    Send,
    /// A posted receive.
    Recv,
    /// `IBV_WR_RDMA_WRITE` (or `_WITH_IMM`).
    Write,
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap,
}

impl WorkKind {
    /// Whether the NIC writes the request's local bytes (receives, reads, and the old value
    /// of an atomic), so that the CPU must keep off them and the region needs `LOCAL_WRITE`.
    pub fn writes_local(self) -> bool {
        matches!(
            self,
            WorkKind::Recv | WorkKind::Read | WorkKind::FetchAdd | WorkKind::CompareSwap
        )
    }
}

impl fmt::Display for WorkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkKind::Send => "send",
            WorkKind::Recv => "receive",
            WorkKind::Write => "RDMA write",
            WorkKind::Read => "RDMA read",
            WorkKind::FetchAdd => "atomic fetch-and-add",
            WorkKind::CompareSwap => "atomic compare-and-swap",
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
    /// For a receive, the bytes the message carried, as the provider reports them: a send's
    /// bytes placed in the receive's buffer, or, for a receive consumed by a write with
    /// immediate, the length of that write into this side's registered region (none of it
    /// lands in the receive's buffer). For a request this side posted (a send, write, read
    /// or atomic), the bytes it posted: its parts' lengths together (8 for an atomic; a
    /// batch's, its last write's). That one is never read from the provider (the verbs
    /// define no length for a send's or a write's completion, and mlx5 writes none), so it
    /// is the same on every provider.
    pub byte_len: u32,
    /// Immediate data (host byte order) that a received message carried: a send with
    /// immediate, or a write with immediate, which consumes a receive. `None` on the
    /// sender's side, whose own completion carries none.
    pub imm: Option<u32>,
    /// The local queue pair's number: for a receive through a
    /// [`SharedReceiveQueue`](crate::SharedReceiveQueue), the queue pair the message arrived
    /// on (compare with [`Endpoint::qpn`](crate::Endpoint) of
    /// [`QueuePair::endpoint`](crate::QueuePair::endpoint)).
    pub qp_num: u32,
}

/// A remote atomic operation on a 64-bit value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds `add` (wrapping) to the remote value.
    FetchAdd {
        /// The addend.
        add: u64,
    },
    /// Writes `swap` if the remote value equals `compare`.
    CompareSwap {
        /// The value the remote one must have.
        compare: u64,
        /// The value written if it has.
        swap: u64,
    },
}

impl AtomicOp {
    pub(crate) fn kind(self) -> WorkKind {
        match self {
            AtomicOp::FetchAdd { .. } => WorkKind::FetchAdd,
            AtomicOp::CompareSwap { .. } => WorkKind::CompareSwap,
        }
    }
}
