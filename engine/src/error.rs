//! [`Error`]: every refusal and failure of the engine, typed.
//!
//! The variants hold text rather than the libraries' errors, so that an error can be kept
//! in each entry it failed ([`EntryStatus::Failed`](crate::EntryStatus::Failed)).

/// Which side of an entry a check is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// This agent's segment.
    Local,
    /// The remote agent's segment.
    Remote,
}

/// What the engine refused, or what failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting out of its range (a chunk size or window of 0).
    #[error("settings: {0}")]
    Settings(String),
    /// No RDMA device to use (none given, none with an active port, or one failed to open).
    #[error("RDMA devices: {0}")]
    NoDevice(String),
    /// A call into rdma-dmabuf failed.
    #[error("{op}: {detail}")]
    Rdma {
        /// What the engine was doing.
        op: &'static str,
        /// rdma-dmabuf's error, as text.
        detail: String,
        /// rdma-dmabuf's kind of the error ([`rdma_dmabuf::Error::kind`]).
        kind: rdma_dmabuf::ErrorKind,
        /// The errno behind it, if any ([`rdma_dmabuf::Error::errno`]).
        errno: Option<i32>,
    },
    /// A socket operation of the metadata service or the control channel failed.
    #[error("{op} {addr}: {detail}")]
    Io {
        /// What the engine was doing.
        op: &'static str,
        /// The address involved.
        addr: String,
        /// The OS error, as text.
        detail: String,
    },
    /// CUDA memory that cannot be a segment ([`Memory::Cuda`](crate::Memory::Cuda)): not
    /// device memory of the device (unknown, freed, host, managed, another GPU's), or not
    /// inside one allocation (a range across the seams of `cuMemMap`ped allocations, or past
    /// its allocation's end), or pages shared with other allocations. Nothing was registered.
    #[error("CUDA range of {len} bytes at {ptr:#x}: {why}")]
    CudaRange {
        /// The range's device address.
        ptr: u64,
        /// Its length.
        len: u64,
        /// Why, as rdma-dmabuf and drm-export tell it.
        why: String,
    },
    /// A segment of this name is already registered.
    #[error("segment {0:?} is already registered")]
    SegmentExists(String),
    /// No agent of this name is known to the metadata service.
    #[error("unknown agent {0:?}")]
    UnknownAgent(String),
    /// The agent has no segment of this name.
    #[error("agent {agent:?} has no segment {segment:?}")]
    UnknownSegment {
        /// The agent asked (this one for a local segment).
        agent: String,
        /// The segment's name.
        segment: String,
    },
    /// An entry names memory by address ([`Batch::write_at`](crate::Batch::write_at)) that no
    /// segment of the agent holds whole: never registered, unregistered since, only partly
    /// registered, or a range that wraps around the address space.
    #[error("entry {entry}: no segment of agent {agent:?} holds {len} bytes at {addr:#x} ({side:?} side)")]
    NoSegmentAt {
        /// The entry's index in the batch.
        entry: usize,
        /// Which side.
        side: Side,
        /// The agent asked (this one for the local side).
        agent: String,
        /// The address.
        addr: u64,
        /// The entry's length.
        len: u64,
    },
    /// The segment is used by a transfer that has not finished.
    #[error("segment {segment:?} is used by {users} unfinished transfer(s)")]
    SegmentBusy {
        /// The segment's name.
        segment: String,
        /// How many transfers use it.
        users: usize,
    },
    /// An entry of length zero.
    #[error("entry {entry}: length 0")]
    ZeroLength {
        /// The entry's index in the batch.
        entry: usize,
    },
    /// An entry's range does not fit in a segment.
    #[error("entry {entry}: {side:?} range {offset}+{len} past the segment's {segment_len} bytes")]
    OutOfRange {
        /// The entry's index in the batch.
        entry: usize,
        /// Which segment.
        side: Side,
        /// The entry's offset in it.
        offset: u64,
        /// The entry's length.
        len: u64,
        /// The segment's length.
        segment_len: u64,
    },
    /// A segment's descriptor does not allow the access an entry needs.
    #[error("entry {entry}: {side:?} segment {segment:?} does not allow {needs}")]
    Access {
        /// The entry's index in the batch.
        entry: usize,
        /// Which segment.
        side: Side,
        /// The segment's name.
        segment: String,
        /// The access missing ("remote read", "remote write").
        needs: &'static str,
    },
    /// Two entries of one batch overlap in a local segment, and one of them is a read (the
    /// NIC writes that range).
    #[error("entries {entry} and {other} overlap in local segment {segment:?} and one is a read")]
    Overlap {
        /// The later entry (in local offset order).
        entry: usize,
        /// The entry it overlaps.
        other: usize,
        /// The local segment.
        segment: String,
    },
    /// A batch without entries.
    #[error("a batch needs at least one entry")]
    EmptyBatch,
    /// A batch past the engine's limits (entries, segments, peers or chunks).
    #[error("batch too large: {0}")]
    BatchTooLarge(String),
    /// A notification longer than [`MAX_NOTIFICATION`](crate::MAX_NOTIFICATION).
    #[error("a notification of {0} bytes (at most {max})", max = crate::MAX_NOTIFICATION)]
    NotificationTooLong(usize),
    /// A descriptor in a format version this engine does not read.
    #[error("descriptor format version {found} (this engine reads {supported})")]
    IncompatibleVersion {
        /// The version found.
        found: u16,
        /// The version this engine reads and writes.
        supported: u16,
    },
    /// A malformed message or descriptor.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The peer restarted since its descriptor was fetched: its old keys are never used.
    #[error("agent {agent:?} restarted (incarnation {found:#x}, expected {expected:#x})")]
    IncarnationChanged {
        /// The agent.
        agent: String,
        /// The incarnation the entries were checked against.
        expected: u64,
        /// The incarnation the agent has now.
        found: u64,
    },
    /// The peer is down: its connection failed, and every entry still pending to it failed.
    #[error("agent {agent:?} is down: {cause}")]
    PeerDown {
        /// The agent.
        agent: String,
        /// The first failure seen (a completion error, a refused connection).
        cause: String,
    },
    /// The peer's NIC refused a request's remote access (`IBV_WC_REM_ACCESS_ERR`: a wrong
    /// or revoked rkey, or a range outside the registration): the descriptor the batch was
    /// checked against does not match the peer's registrations. As for
    /// [`Error::PeerDown`], every entry still pending to it fails, and the connection and
    /// the cached descriptor are dropped.
    #[error("agent {agent:?} refused the access: {cause}")]
    RemoteAccess {
        /// The agent.
        agent: String,
        /// The completion error.
        cause: String,
    },
    /// A wait ended before the transfer finished.
    #[error("timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// [`Agent::wait_for_peer`](crate::Agent::wait_for_peer) ended before the metadata
    /// service knew the agent (or before it answered).
    #[error("agent {agent:?} did not appear within {waited:?}; the last look-up: {last}")]
    PeerNotUp {
        /// The agent waited for.
        agent: String,
        /// How long it was waited for.
        waited: std::time::Duration,
        /// The last look-up's error.
        last: Box<Error>,
    },
    /// An entry of a transfer failed ([`Transfer::wait`](crate::Transfer::wait)).
    #[error("entry {entry} failed: {error}")]
    EntryFailed {
        /// The entry's index.
        entry: usize,
        /// Its error.
        error: Box<Error>,
    },
    /// The agent is shutting down.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// The metadata service (etcd) did not answer or failed: a look-up of an agent not
    /// resolved before, or a first publication, while etcd is unreachable.
    #[error("metadata service: {op}: {detail}")]
    Metadata {
        /// What the engine was doing.
        op: &'static str,
        /// The client's error, as text.
        detail: String,
    },
    /// The metadata service (etcd) answered and refused a request itself (too large,
    /// invalid, not permitted, out of space): it would be refused again as it is, so it is
    /// not retried. A registration it refuses is undone.
    #[error("metadata service: {op}: {detail}")]
    MetadataRefused {
        /// What the engine was doing.
        op: &'static str,
        /// The service's answer, as text.
        detail: String,
    },
    /// Another live incarnation of an agent of this name is published: agent names are
    /// unique in a metadata service.
    #[error("agent {agent:?} is already published by another incarnation ({incarnation:x?})")]
    AgentExists {
        /// The name.
        agent: String,
        /// The other incarnation, when its record could be read.
        incarnation: Option<u64>,
    },
    /// A control connection's authentication failed: the peer did not prove the cluster's
    /// key (another cluster, or not an agent), is not the agent expected, or refused this
    /// agent's proof or its lack of one (docs/engine.md, "Security").
    #[error("authentication with {peer}: {detail}")]
    Authentication {
        /// The peer's address.
        peer: String,
        /// What failed.
        detail: String,
    },
    /// The peer refused a request at one of its bounds ([`Limits`](crate::Limits)): fewer
    /// connections, queue pairs or queued notifications, or a smaller request, may pass.
    #[error("agent {peer} refused the request: its limit of {limit:?} ({detail})")]
    LimitReached {
        /// The peer's address or name.
        peer: String,
        /// Which bound.
        limit: Limit,
        /// The bound's value and what was asked, as the peer tells it.
        detail: String,
    },
}

/// Which of an agent's bounds a peer's request met ([`Error::LimitReached`]); each is a
/// field of [`Limits`](crate::Limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// Authenticated connections, in all ([`Limits::connections`](crate::Limits::connections)).
    Connections,
    /// Connections of one peer ([`Limits::connections_per_peer`](crate::Limits::connections_per_peer)).
    ConnectionsPerPeer,
    /// Queue pairs made over one connection ([`Limits::queue_pairs_per_connection`](crate::Limits::queue_pairs_per_connection)).
    QueuePairsPerConnection,
    /// Queue pairs of one peer ([`Limits::queue_pairs_per_peer`](crate::Limits::queue_pairs_per_peer)).
    QueuePairsPerPeer,
    /// Queue pairs held for all peers ([`Limits::queue_pairs`](crate::Limits::queue_pairs)).
    QueuePairs,
    /// Notifications queued from one sender ([`Limits::notifications_per_sender`](crate::Limits::notifications_per_sender)).
    NotificationsPerSender,
    /// Notifications queued in all ([`Limits::notifications`](crate::Limits::notifications)).
    Notifications,
    /// A request's frame ([`Limits::request_bytes`](crate::Limits::request_bytes)).
    RequestBytes,
}

/// What kind of failure an [`Error`] is ([`Error::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request or a setting was refused before anything was posted: fix the request.
    InvalidInput,
    /// An agent or segment the metadata service does not know (yet, or any more).
    NotFound,
    /// A segment still used by an unfinished transfer: wait for it and try again.
    Busy,
    /// No RDMA device to use.
    NoDevice,
    /// rdma-dmabuf failed, with its kind (registration, queue pair set-up).
    Rdma(rdma_dmabuf::ErrorKind),
    /// The metadata service or a peer's control channel could not be reached: may work
    /// later.
    Unavailable,
    /// A descriptor or message this engine cannot read (another format version, or
    /// malformed).
    Incompatible,
    /// The peer restarted since its descriptor was read: look it up again.
    Restarted,
    /// The peer is down: its entries failed; later batches reconnect.
    PeerDown,
    /// The peer's NIC refused the access (its descriptor does not match its registrations).
    RemoteAccess,
    /// A bounded wait ended first.
    TimedOut,
    /// The agent is shutting down.
    ShuttingDown,
    /// Another live agent holds the name in the metadata service.
    NameTaken,
    /// Authentication failed (a wrong or missing cluster key, a forged record).
    Unauthenticated,
    /// A peer's bound on what one client may hold was reached: retry later or with less.
    LimitReached,
}

/// The engine's results.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// An rdma-dmabuf failure during `op`.
    pub(crate) fn rdma(op: &'static str, e: &rdma_dmabuf::Error) -> Error {
        Error::Rdma {
            op,
            detail: e.to_string(),
            kind: e.kind(),
            errno: e.errno(),
        }
    }

    /// What kind of failure this is, for callers that handle some kinds (retry later, drop
    /// a peer, fix the request) without matching every variant. An
    /// [`Error::EntryFailed`] has its entry's kind.
    pub fn kind(&self) -> ErrorKind {
        use Error as E;
        match self {
            E::Settings(_)
            | E::SegmentExists(_)
            | E::ZeroLength { .. }
            | E::OutOfRange { .. }
            | E::Access { .. }
            | E::Overlap { .. }
            | E::EmptyBatch
            | E::BatchTooLarge(_)
            | E::NotificationTooLong(_)
            | E::MetadataRefused { .. } => ErrorKind::InvalidInput,
            E::UnknownAgent(_) | E::UnknownSegment { .. } | E::NoSegmentAt { .. } => {
                ErrorKind::NotFound
            }
            E::SegmentBusy { .. } => ErrorKind::Busy,
            E::CudaRange { .. } => ErrorKind::InvalidInput,
            E::NoDevice(_) => ErrorKind::NoDevice,
            E::Rdma { kind, .. } => ErrorKind::Rdma(*kind),
            E::Io { .. } | E::Metadata { .. } => ErrorKind::Unavailable,
            E::IncompatibleVersion { .. } | E::Protocol(_) => ErrorKind::Incompatible,
            E::IncarnationChanged { .. } => ErrorKind::Restarted,
            E::PeerDown { .. } => ErrorKind::PeerDown,
            E::RemoteAccess { .. } => ErrorKind::RemoteAccess,
            E::Timeout(_) | E::PeerNotUp { .. } => ErrorKind::TimedOut,
            E::EntryFailed { error, .. } => error.kind(),
            E::ShuttingDown => ErrorKind::ShuttingDown,
            E::AgentExists { .. } => ErrorKind::NameTaken,
            E::Authentication { .. } => ErrorKind::Unauthenticated,
            E::LimitReached { .. } => ErrorKind::LimitReached,
        }
    }

    /// A socket failure during `op` on `addr`.
    pub(crate) fn io(op: &'static str, addr: impl std::fmt::Display, e: std::io::Error) -> Error {
        Error::Io {
            op,
            addr: addr.to_string(),
            detail: e.to_string(),
        }
    }
}

impl Error {
    /// What to check or do, where the engine knows the likely cause; None where the error
    /// says it all, or where its cause is text of another library (an [`Error::Rdma`]'s
    /// `detail`, a peer's `cause`), which carries that library's own hint. An
    /// [`Error::EntryFailed`] has its entry's hint, an [`Error::PeerNotUp`] its last
    /// look-up's.
    pub fn hint(&self) -> Option<&'static str> {
        use Error as E;
        Some(match self {
            E::NoDevice(_) => {
                "`rdma link` lists the RDMA devices and their state (one must be ACTIVE); with \
                 no hardware NIC, load soft-RoCE (`modprobe rdma_rxe`, then `rdma link add rxe0 \
                 type rxe netdev <netdev>`); `gpu-rdma-doctor` checks the kernel, rdma-core and \
                 every device"
            }
            E::UnknownAgent(_) => {
                "name the peer first (`add_peer`, `add_peer_at` or `add_peer_card`); with etcd, \
                 check that the peer's agent is running and published under the same endpoints \
                 and prefix (`wait_for_peer` waits for it)"
            }
            E::UnknownSegment { .. } => {
                "check the name, and that the agent registered the segment before the batch \
                 and has not unregistered it"
            }
            E::NoSegmentAt { .. } => {
                "register the whole range first (one segment must hold it), and keep it \
                 registered until the transfer ends"
            }
            E::SegmentExists(_) => "unregister it first, or choose another name",
            E::SegmentBusy { .. } => "wait for the transfers that use it, then unregister it",
            E::BatchTooLarge(_) => "split the batch",
            E::IncompatibleVersion { .. } => "run the same gpu_rdma version on every agent",
            E::IncarnationChanged { .. } => "the peer restarted: look it up again",
            E::PeerDown { .. } => {
                "the peer's process or machine died, its connection closed, or the link is \
                 down: its pending entries failed, and a later batch reconnects"
            }
            E::RemoteAccess { .. } => {
                "the peer's registrations do not match the descriptor the batch was checked \
                 against (a segment unregistered or registered again since): the connection \
                 and the cached descriptor were dropped, so a new batch is checked anew"
            }
            E::Io { .. } => "check that the agent at that address is running and reachable",
            E::Metadata { .. } => "check that etcd is up and reachable at the endpoints given",
            E::AgentExists { .. } => {
                "agent names are unique in a metadata service: choose another, or wait until \
                 the other incarnation's record expires"
            }
            E::Authentication { .. } => {
                "give every agent of the cluster the same key, or certificates of the same CA \
                 (docs/engine.md, \"Security\")"
            }
            E::LimitReached { .. } => "retry later, or with less (the peer's `Limits`)",
            E::PeerNotUp { last, .. } => return last.hint(),
            E::EntryFailed { error, .. } => return error.hint(),
            _ => return None,
        })
    }

    /// The errno behind this error, where it has one (an [`Error::Rdma`]'s, or a failed
    /// entry's).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Rdma { errno, .. } => *errno,
            Error::EntryFailed { error, .. } => error.errno(),
            _ => None,
        }
    }

    /// The agent the error is about, where it names one (a failed entry's error's).
    pub fn agent(&self) -> Option<&str> {
        use Error as E;
        match self {
            E::UnknownAgent(agent)
            | E::UnknownSegment { agent, .. }
            | E::NoSegmentAt { agent, .. }
            | E::IncarnationChanged { agent, .. }
            | E::PeerDown { agent, .. }
            | E::RemoteAccess { agent, .. }
            | E::PeerNotUp { agent, .. }
            | E::AgentExists { agent, .. } => Some(agent),
            E::EntryFailed { error, .. } => error.agent(),
            _ => None,
        }
    }

    /// The segment the error is about, where it names one (a failed entry's error's).
    pub fn segment(&self) -> Option<&str> {
        use Error as E;
        match self {
            E::SegmentExists(segment)
            | E::UnknownSegment { segment, .. }
            | E::SegmentBusy { segment, .. }
            | E::Access { segment, .. }
            | E::Overlap { segment, .. } => Some(segment),
            E::EntryFailed { error, .. } => error.segment(),
            _ => None,
        }
    }
}

impl ErrorKind {
    /// The kind's name, stable (the Python package's `kind`): the variant's, and for
    /// [`ErrorKind::Rdma`] rdma-dmabuf's kind's (`"Refused"`, `"PeerGone"`, ...).
    pub fn name(self) -> &'static str {
        use rdma_dmabuf::ErrorKind as R;
        match self {
            ErrorKind::InvalidInput => "InvalidInput",
            ErrorKind::NotFound => "NotFound",
            ErrorKind::Busy => "Busy",
            ErrorKind::NoDevice => "NoDevice",
            ErrorKind::Rdma(k) => match k {
                R::Refused => "Refused",
                R::Unreachable => "Unreachable",
                R::TimedOut => "TimedOut",
                R::PeerGone => "PeerGone",
                R::RemoteAccess => "RemoteAccess",
                R::ReceiverNotReady => "ReceiverNotReady",
                R::InvalidRequest => "InvalidRequest",
                R::Flushed => "Flushed",
                R::Unsupported => "Unsupported",
                R::InvalidInput => "InvalidInput",
                R::QueueFull => "QueueFull",
                R::NoDevice => "NoDevice",
                _ => "Other",
            },
            ErrorKind::Unavailable => "Unavailable",
            ErrorKind::Incompatible => "Incompatible",
            ErrorKind::Restarted => "Restarted",
            ErrorKind::PeerDown => "PeerDown",
            ErrorKind::RemoteAccess => "RemoteAccess",
            ErrorKind::TimedOut => "TimedOut",
            ErrorKind::ShuttingDown => "ShuttingDown",
            ErrorKind::NameTaken => "NameTaken",
            ErrorKind::Unauthenticated => "Unauthenticated",
            ErrorKind::LimitReached => "LimitReached",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Error, ErrorKind};
    use crate::{Agent, Settings};

    #[test]
    fn an_rdma_failure_keeps_its_kind_and_errno_through_the_engine() {
        // The only test of this crate that sets the variable; Agent::new reads it before
        // it opens any device.
        std::env::set_var("RDMA_DMABUF_ACK_TIMEOUT", "40");
        let Err(e) = Agent::new("k", Settings::default()) else {
            panic!("an ACK timeout of 40 was accepted");
        };
        std::env::remove_var("RDMA_DMABUF_ACK_TIMEOUT");
        assert!(
            matches!(e, Error::Rdma { op, .. } if op.contains("retry")),
            "{e:?}"
        );
        assert_eq!(
            e.kind(),
            ErrorKind::Rdma(rdma_dmabuf::ErrorKind::InvalidInput),
            "{e}"
        );
    }

    #[test]
    fn the_accessors_read_a_failed_entrys_fields() {
        let unknown = Error::UnknownSegment {
            agent: "b".into(),
            segment: "d".into(),
        };
        let failed = Error::EntryFailed {
            entry: 0,
            error: Box::new(unknown),
        };
        assert_eq!((failed.agent(), failed.segment()), (Some("b"), Some("d")));
        assert!(failed.hint().is_some_and(|h| h.contains("registered")));
        assert_eq!((failed.kind().name(), failed.errno()), ("NotFound", None));
        let gone = ErrorKind::Rdma(rdma_dmabuf::ErrorKind::PeerGone);
        assert_eq!(gone.name(), "PeerGone");
    }

    #[test]
    fn a_failed_entry_has_the_kind_of_its_error() {
        let down = Error::PeerDown {
            agent: "b".into(),
            cause: "retry exceeded".into(),
        };
        let failed = Error::EntryFailed {
            entry: 3,
            error: Box::new(down.clone()),
        };
        assert_eq!(failed.kind(), ErrorKind::PeerDown);
        assert_eq!(
            Error::ZeroLength { entry: 0 }.kind(),
            ErrorKind::InvalidInput
        );
        assert_eq!(Error::UnknownAgent("x".into()).kind(), ErrorKind::NotFound);
        let busy = Error::SegmentBusy {
            segment: "s".into(),
            users: 1,
        };
        assert_eq!(busy.kind(), ErrorKind::Busy);
    }
}
