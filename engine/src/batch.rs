//! [`Batch`]: what [`Agent::transfer`](crate::Agent::transfer) moves, a list of [`Entry`]s
//! and an optional notification.

use crate::error::{Error, Result};

/// The most bytes a notification carries.
pub const MAX_NOTIFICATION: usize = 4096;

/// Which way an entry moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// RDMA write: the local range to the remote one.
    Write,
    /// RDMA read: the remote range into the local one.
    Read,
}

/// One transfer: `len` bytes between `local` at `local_offset` and `remote_segment` of
/// `remote_agent` at `remote_offset`.
///
/// A side may name memory by address instead ([`Batch::write_at`], [`Batch::read_at`]):
/// its segment name is then empty ([`BY_ADDRESS`]; no segment has that name) and its offset
/// is the address, resolved when the batch is checked to the segment whose
/// [`base`](crate::SegmentDescriptor::base) range holds the whole entry (this agent's
/// segments for `local`, the remote agent's descriptor for `remote_segment`), or refused
/// with [`Error::NoSegmentAt`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Write or read.
    pub op: Op,
    /// This agent's segment.
    pub local: String,
    /// Where in it.
    pub local_offset: u64,
    /// The remote agent's name.
    pub remote_agent: String,
    /// The remote agent's segment.
    pub remote_segment: String,
    /// Where in it.
    pub remote_offset: u64,
    /// How many bytes.
    pub len: u64,
}

/// The segment name of an entry's side that names memory by address (its offset is the
/// address): see [`Entry`].
pub const BY_ADDRESS: &str = "";

impl Entry {
    /// Whether either side names memory by address ([`BY_ADDRESS`]).
    pub fn by_address(&self) -> bool {
        self.local == BY_ADDRESS || self.remote_segment == BY_ADDRESS
    }
}

/// Entries and an optional notification for the remote agents.
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The entries, checked together before any is posted.
    pub entries: Vec<Entry>,
    /// Delivered to every remote agent of the batch once every entry has landed.
    pub notification: Option<Vec<u8>>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Adds a write of `local[local_offset..+len]` to `remote_agent`'s
    /// `remote_segment[remote_offset..]`.
    pub fn write(
        self,
        local: &str,
        local_offset: u64,
        remote_agent: &str,
        remote_segment: &str,
        remote_offset: u64,
        len: u64,
    ) -> Batch {
        let (remote, at) = ((remote_agent, remote_segment), remote_offset);
        self.entry(Op::Write, (local, local_offset), remote, at, len)
    }

    /// Adds a read of `remote_agent`'s `remote_segment[remote_offset..+len]` into
    /// `local[local_offset..]`.
    pub fn read(
        self,
        local: &str,
        local_offset: u64,
        remote_agent: &str,
        remote_segment: &str,
        remote_offset: u64,
        len: u64,
    ) -> Batch {
        let (remote, at) = ((remote_agent, remote_segment), remote_offset);
        self.entry(Op::Read, (local, local_offset), remote, at, len)
    }

    /// Adds a write of the `len` bytes at `local_addr` (inside a segment of this agent that
    /// has a base address: host or CUDA memory) to `remote_addr` of `remote_agent` (inside
    /// one of its segments): Mooncake's way of naming memory. See [`Entry`].
    pub fn write_at(
        self,
        local_addr: u64,
        remote_agent: &str,
        remote_addr: u64,
        len: u64,
    ) -> Batch {
        let remote = (remote_agent, BY_ADDRESS);
        self.entry(
            Op::Write,
            (BY_ADDRESS, local_addr),
            remote,
            remote_addr,
            len,
        )
    }

    /// Adds a read of the `len` bytes at `remote_addr` of `remote_agent` into `local_addr`.
    /// See [`Batch::write_at`].
    pub fn read_at(self, local_addr: u64, remote_agent: &str, remote_addr: u64, len: u64) -> Batch {
        let remote = (remote_agent, BY_ADDRESS);
        self.entry(Op::Read, (BY_ADDRESS, local_addr), remote, remote_addr, len)
    }

    /// Adds an entry: `op` between `local` (segment, offset) and `remote` (agent, segment)
    /// at `remote_offset`, `len` bytes.
    fn entry(
        mut self,
        op: Op,
        (local, local_offset): (&str, u64),
        (remote_agent, remote_segment): (&str, &str),
        remote_offset: u64,
        len: u64,
    ) -> Batch {
        self.entries.push(Entry {
            op,
            local: local.into(),
            local_offset,
            remote_agent: remote_agent.into(),
            remote_segment: remote_segment.into(),
            remote_offset,
            len,
        });
        self
    }

    /// Sets the notification (at most [`MAX_NOTIFICATION`] bytes, checked by
    /// [`Agent::transfer`](crate::Agent::transfer)).
    pub fn notify(mut self, message: impl Into<Vec<u8>>) -> Batch {
        self.notification = Some(message.into());
        self
    }

    pub(crate) fn check_notification(&self) -> Result<()> {
        match &self.notification {
            Some(m) if m.len() > MAX_NOTIFICATION => Err(Error::NotificationTooLong(m.len())),
            _ => Ok(()),
        }
    }
}

/// A notification received from a peer: its batch has landed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notification {
    /// The agent that sent it.
    pub from: String,
    /// Its bytes.
    pub message: Vec<u8>,
}
