//! The crate's error type: each failure names the verb, the device or object it acted on, the
//! errno, and a hint where the cause is known.

use rdma_sys as ffi;
use std::fmt;
use std::io;

/// A verbs operation, as named in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Op {
    /// `ibv_get_device_list`.
    ListDevices,
    /// `ibv_open_device`.
    OpenDevice,
    /// `ibv_query_device`.
    QueryDevice,
    /// `ibv_query_port`.
    QueryPort,
    /// `ibv_query_gid` and the GID type table.
    QueryGid,
    /// `ibv_alloc_pd`.
    AllocPd,
    /// `ibv_create_cq`.
    CreateCq,
    /// `ibv_create_qp`.
    CreateQp,
    /// `ibv_modify_qp`.
    ModifyQp,
    /// Host memory for a region (`mmap`).
    AllocHost,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_reg_dmabuf_mr`.
    RegDmabufMr,
    /// `ibv_dereg_mr`.
    DeregMr,
    /// `ibv_alloc_dm`.
    AllocDm,
    /// `ibv_memcpy_to_dm` / `ibv_memcpy_from_dm`.
    CopyDm,
    /// `ibv_reg_dm_mr`.
    RegDmMr,
    /// CPU access to a region's memory (its bytes or a mapping).
    CpuAccess,
    /// `ibv_post_send`.
    PostSend,
    /// `ibv_post_recv`.
    PostRecv,
    /// `ibv_poll_cq`.
    PollCq,
    /// Parsing an endpoint or remote region received from a peer.
    Parse,
    /// A connection-manager step (`rdma_resolve_addr`, `rdma_connect`, ...).
    Cm,
    /// Splitting a region into shards, or joining them back.
    Split,
    /// `ibv_create_srq`.
    CreateSrq,
    /// `ibv_modify_srq`, `ibv_query_srq`.
    ModifySrq,
    /// `ibv_post_srq_recv`.
    PostSrqRecv,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::ListDevices => "ibv_get_device_list",
            Op::OpenDevice => "ibv_open_device",
            Op::QueryDevice => "ibv_query_device",
            Op::QueryPort => "ibv_query_port",
            Op::QueryGid => "ibv_query_gid",
            Op::AllocPd => "ibv_alloc_pd",
            Op::CreateCq => "ibv_create_cq",
            Op::CreateQp => "ibv_create_qp",
            Op::ModifyQp => "ibv_modify_qp",
            Op::AllocHost => "allocate host buffer",
            Op::RegMr => "ibv_reg_mr",
            Op::RegDmabufMr => "ibv_reg_dmabuf_mr",
            Op::DeregMr => "ibv_dereg_mr",
            Op::AllocDm => "ibv_alloc_dm",
            Op::CopyDm => "ibv_memcpy_{to,from}_dm",
            Op::RegDmMr => "ibv_reg_dm_mr",
            Op::CpuAccess => "CPU access to a region",
            Op::PostSend => "ibv_post_send",
            Op::PostRecv => "ibv_post_recv",
            Op::PollCq => "ibv_poll_cq",
            Op::Parse => "parse peer data",
            Op::Cm => "rdma_cm",
            Op::Split => "split or join a region",
            Op::CreateSrq => "ibv_create_srq",
            Op::ModifySrq => "ibv_modify_srq",
            Op::PostSrqRecv => "ibv_post_srq_recv",
        })
    }
}

/// Why a dma-buf registration is "not supported", and where to read on: either the
/// provider or its kernel driver has no dma-buf MRs at all, or it has them and cannot take
/// this particular buffer (the patched soft-RoCE of `kernel-patches/` refuses a buffer whose
/// kernel mapping is I/O memory, or whose exporter has no vmap). [`crate::supports_dmabuf`]
/// tells the two apart.
pub const DMABUF_HINT: &str = "either the provider or its kernel driver has no dma-buf MRs \
    (stock rxe and siw have none; mlx5, efa, irdma, bnxt_re, mana and ionic do; for rxe see \
    kernel-patches/README.md), or it has them but cannot take this buffer: the patched rxe \
    refuses a dma-buf whose kernel mapping (vmap) is I/O memory, such as VRAM behind a PCIe \
    BAR, and one whose exporter has no vmap; supports_dmabuf() tells which (true: the buffer)";

/// `ENOTSUPP` (524), the kernel-internal "not supported" that some drivers let reach user
/// space (seen from `ibv_reg_dmabuf_mr` on GB200 kernels). libc has no constant for it, and
/// `strerror` calls it "Unknown error 524".
pub const ENOTSUPP: i32 = 524;

/// Errors of `rdma-dmabuf`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A verb failed with an errno.
    #[error("{op} on {target}: {source}{}", hint_text(*.hint))]
    Verbs {
        /// What was attempted.
        op: Op,
        /// The device, queue pair or region, with the values that matter.
        target: String,
        /// The errno.
        #[source]
        source: io::Error,
        /// The likely cause, where known.
        hint: Option<&'static str>,
    },
    /// The device, provider or kernel does not implement the operation.
    #[error("{op} on {device}: not supported ({}): {why}", io::Error::from_raw_os_error(*.errno))]
    Unsupported {
        /// What was attempted.
        op: Op,
        /// The device.
        device: String,
        /// The errno that said so (`EOPNOTSUPP`, `EPROTONOSUPPORT`, ...).
        errno: i32,
        /// Why, and what to do.
        why: &'static str,
    },
    /// An argument was rejected before reaching the provider.
    #[error("{op}: invalid argument: {what}")]
    InvalidArgument {
        /// What was attempted.
        op: Op,
        /// Which value and why.
        what: String,
    },
    /// The send or receive queue is full: wait for completions before posting more.
    #[error("{op}: the queue is full ({depth} work requests outstanding)")]
    QueueFull {
        /// Which queue.
        op: Op,
        /// Its depth.
        depth: u32,
    },
    /// A fenced post's fences did not signal in time; nothing was posted.
    #[error("{kind}: the dma-buf's fences did not signal within {timeout:?}; nothing was posted")]
    FenceTimeout {
        /// What would have been posted.
        kind: crate::wr::WorkKind,
        /// How long it waited.
        timeout: std::time::Duration,
    },
    /// The dma-buf's fences could not be exported or waited on.
    #[error("dma-buf fences: {0}")]
    Fence(#[source] Box<drm_export::Error>),
    /// A dma-buf region could not be mapped for the CPU.
    #[error("mapping a dma-buf region: {0}")]
    Map(#[source] Box<drm_export::Error>),
    /// An fd could not be taken as a dma-buf (not a dma-buf, or a live `DmaBuf` of this
    /// process already owns the buffer).
    #[error("taking an fd as a dma-buf: {0}")]
    Adopt(#[source] Box<drm_export::Error>),
    /// A GID index the port cannot use as a queue pair's source GID: outside the port's GID
    /// table, past what the address vector holds (8 bits), or an empty entry.
    #[error("{op} on {device} port {port}: GID index {index} cannot be used: {why} (the port's GID table has {table_len} entries; `rdma link` and /sys/class/infiniband/{device}/ports/{port}/gids list them)")]
    GidIndex {
        /// What was attempted.
        op: Op,
        /// The device.
        device: String,
        /// The port.
        port: u8,
        /// The index asked for.
        index: u32,
        /// The port's GID table length (`ibv_port_attr.gid_tbl_len`).
        table_len: u32,
        /// Why, with the entry's type where it has one.
        why: String,
    },
    /// An error of `drm-export` (allocating or exporting a buffer) met on the way, through
    /// `?` in a function returning this crate's [`Result`] (`From<drm_export::Error>`).
    #[error("{0}")]
    Export(#[source] Box<drm_export::Error>),
    /// An environment variable that sets a default holds a value that cannot be used: not
    /// UTF-8, not a number, or outside the range the variable accepts. Nothing was created.
    #[error("{variable}=\"{value}\": {why} (accepted: {accepted})")]
    Setting {
        /// The variable's name.
        variable: &'static str,
        /// Its value as read, with quotes, control characters and bytes that are not ASCII
        /// escaped (`\xff`).
        value: String,
        /// What is wrong with it.
        why: &'static str,
        /// The values it accepts, and what they bound.
        accepted: &'static str,
    },
    /// A CUDA range the registration cache cannot key on one allocation's buffer id
    /// (`RegistrationCache::checkout_cuda`): empty, or past the
    /// allocation holding `ptr` (across `cuMemMap` seams, or beyond). Cache each part apart.
    #[error("CUDA range of {len} bytes at {ptr:#x}: not inside the one allocation of {alloc_size} bytes at {alloc_base:#x} that a cached registration is keyed on; cache each allocation's part apart")]
    CudaRangeNotOneAllocation {
        /// The range's start.
        ptr: u64,
        /// Its length.
        len: u64,
        /// The base of the allocation holding `ptr`.
        alloc_base: u64,
        /// That allocation's size.
        alloc_size: u64,
    },
    /// A work request completed with an error status.
    #[error("{kind} on qp {qp_num:#x} failed: {status_text} (status {status}, vendor error {vendor_err:#x}){}", hint_text(completion_hint(*.status)))]
    Completion {
        /// The request's `wr_id` as the verbs carry it (this crate's slot and generation; for
        /// matching raw completions, not meant to be read).
        wr_id: u64,
        /// What the request was.
        kind: crate::wr::WorkKind,
        /// The local queue pair it ran on.
        qp_num: u32,
        /// `ibv_wc_status`.
        status: u32,
        /// `ibv_wc_status_str` of it.
        status_text: String,
        /// The provider's own code.
        vendor_err: u32,
    },
}

/// What to check for a completion's error status (`ibv_wc_status`), where we know.
pub(crate) fn completion_hint(status: u32) -> Option<&'static str> {
    use ffi::ibv_wc_status as S;
    Some(match status {
        S::IBV_WC_REM_ACCESS_ERR => {
            "the peer's NIC refused the access: check that the remote region was registered \
             with the access this request needs (REMOTE_WRITE for a write, REMOTE_READ for a \
             read, REMOTE_ATOMIC for an atomic), that the rkey is that region's current one (not \
             of another or a deregistered region), and that address + length lie inside it"
        }
        S::IBV_WC_RETRY_EXC_ERR => {
            "the peer never acknowledged the request: its process or machine died, the \
             connection was closed, or the link is down (a peer that is only slow, such as an \
             emulated machine, needs a longer ack_timeout)"
        }
        S::IBV_WC_RNR_RETRY_EXC_ERR => {
            "the peer had no receive posted for this send: post receives before the peer \
             sends, or raise rnr_retry"
        }
        S::IBV_WC_WR_FLUSH_ERR => {
            "flushed: the queue pair was already in the error state (an earlier request failed, \
             or the connection ended), so this request never ran"
        }
        S::IBV_WC_REM_INV_REQ_ERR => {
            "the peer found the request invalid: a message longer than its receive, or an \
             operation its queue pair does not allow"
        }
        S::IBV_WC_LOC_LEN_ERR => "the message is longer than the receive it landed in",
        S::IBV_WC_LOC_PROT_ERR | S::IBV_WC_LOC_ACCESS_ERR => {
            "the local region refused the access: its range, its lkey, or LOCAL_WRITE for what \
             the NIC writes"
        }
        S::IBV_WC_REM_OP_ERR => {
            "the peer could not complete the operation (for example its receive was too small)"
        }
        _ => return None,
    })
}

/// What kind of failure an [`Error`] is, for callers that handle some kinds (retry a refused
/// connection, give up on a dead peer) without reading errno numbers or status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The peer rejected the connection: nobody listening on that address and port (yet).
    Refused,
    /// The peer did not answer the connection request (`RDMA_CM_EVENT_UNREACHABLE`), or no
    /// route reached it.
    Unreachable,
    /// A bounded wait ended before its event (`ETIMEDOUT`), or a fence did not signal.
    TimedOut,
    /// The peer stopped answering during the connection: transport retries exceeded, or the
    /// connection was reset or closed.
    PeerGone,
    /// The peer's NIC refused the remote access (access flags, rkey or range).
    RemoteAccess,
    /// A send found no receive posted at the peer.
    ReceiverNotReady,
    /// The request itself was wrong, so it would fail on any path to the peer: a local
    /// length, protection or access error (`IBV_WC_LOC_LEN_ERR`, `LOC_PROT_ERR`,
    /// `LOC_ACCESS_ERR`), or one the peer found invalid or could not carry out
    /// (`REM_INV_REQ_ERR`, `REM_OP_ERR`).
    InvalidRequest,
    /// The request never ran: its queue pair was in the error state.
    Flushed,
    /// The device, provider or kernel does not implement the operation.
    Unsupported,
    /// A value was refused before anything reached the provider.
    InvalidInput,
    /// The queue was full: wait for completions and post again.
    QueueFull,
    /// The device is gone or was never there.
    NoDevice,
    /// Anything else (see the error's text).
    Other,
}

impl From<drm_export::Error> for Error {
    fn from(e: drm_export::Error) -> Error {
        Error::Export(Box::new(e))
    }
}

fn hint_text(hint: Option<&'static str>) -> String {
    hint.map(|h| format!(" (hint: {h})")).unwrap_or_default()
}

impl Error {
    /// The errno behind this error, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verbs { source, .. } => source.raw_os_error(),
            Error::Unsupported { errno, .. } => Some(*errno),
            Error::GidIndex { .. } => Some(libc::EINVAL),
            Error::Export(e) => e.errno(),
            _ => None,
        }
    }

    /// What kind of failure this is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        use ffi::ibv_wc_status as S;
        match self {
            Error::Unsupported { .. } => ErrorKind::Unsupported,
            Error::InvalidArgument { .. }
            | Error::GidIndex { .. }
            | Error::Setting { .. }
            | Error::CudaRangeNotOneAllocation { .. } => ErrorKind::InvalidInput,
            Error::QueueFull { .. } => ErrorKind::QueueFull,
            Error::FenceTimeout { .. } => ErrorKind::TimedOut,
            Error::Export(e) | Error::Fence(e) | Error::Map(e) | Error::Adopt(e) => {
                match e.errno() {
                    Some(libc::EOPNOTSUPP | libc::ENOTTY | ENOTSUPP) => ErrorKind::Unsupported,
                    Some(libc::EINVAL) => ErrorKind::InvalidInput,
                    Some(libc::ENOENT | libc::ENODEV) => ErrorKind::NoDevice,
                    Some(libc::ETIMEDOUT) => ErrorKind::TimedOut,
                    _ => ErrorKind::Other,
                }
            }
            Error::Completion { status, .. } => match *status {
                S::IBV_WC_REM_ACCESS_ERR => ErrorKind::RemoteAccess,
                S::IBV_WC_RETRY_EXC_ERR => ErrorKind::PeerGone,
                S::IBV_WC_RNR_RETRY_EXC_ERR => ErrorKind::ReceiverNotReady,
                S::IBV_WC_WR_FLUSH_ERR => ErrorKind::Flushed,
                S::IBV_WC_LOC_LEN_ERR
                | S::IBV_WC_LOC_PROT_ERR
                | S::IBV_WC_LOC_ACCESS_ERR
                | S::IBV_WC_REM_INV_REQ_ERR
                | S::IBV_WC_REM_OP_ERR => ErrorKind::InvalidRequest,
                _ => ErrorKind::Other,
            },
            Error::Verbs { source, .. } => match source.raw_os_error() {
                Some(libc::ECONNREFUSED) => ErrorKind::Refused,
                Some(libc::EHOSTUNREACH | libc::ENETUNREACH) => ErrorKind::Unreachable,
                Some(libc::ETIMEDOUT) => ErrorKind::TimedOut,
                Some(libc::ECONNRESET | libc::ENOTCONN | libc::EPIPE | libc::ECONNABORTED) => {
                    ErrorKind::PeerGone
                }
                Some(libc::ENODEV | libc::ENXIO) => ErrorKind::NoDevice,
                Some(libc::EOPNOTSUPP | libc::ENOSYS | ENOTSUPP) => ErrorKind::Unsupported,
                Some(libc::EINVAL) => ErrorKind::InvalidInput,
                _ => ErrorKind::Other,
            },
        }
    }

    /// Whether the operation is unsupported here (as opposed to failing).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. })
    }

    /// An error from `errno` (as libibverbs leaves it) for `op` on `target`.
    pub(crate) fn last_os(op: Op, target: impl fmt::Display) -> Error {
        Error::from_errno(
            op,
            target,
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// An error from an errno value (verbs that return it rather than set `errno`).
    pub(crate) fn from_errno(op: Op, target: impl fmt::Display, errno: i32) -> Error {
        let errno = if errno == 0 { libc::EIO } else { errno };
        Error::Verbs {
            op,
            target: target.to_string(),
            source: io::Error::from_raw_os_error(errno),
            hint: hint_for(op, errno),
        }
    }

    pub(crate) fn invalid(op: Op, what: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op,
            what: what.into(),
        }
    }
}

fn hint_for(op: Op, errno: i32) -> Option<&'static str> {
    match (op, errno) {
        (Op::OpenDevice, libc::ENOENT | libc::ENODEV) => {
            Some("no such RDMA device: `rdma link` lists them (soft-RoCE: `rdma link add rxe0 type rxe netdev eth0`)")
        }
        (Op::OpenDevice | Op::AllocPd | Op::RegMr, libc::EACCES | libc::EPERM) => {
            Some("no permission on /dev/infiniband/uverbs*: check udev rules or group membership")
        }
        (Op::RegMr | Op::RegDmabufMr, libc::ENOMEM) => {
            Some(
                "the pinned memory limit was reached (raise `ulimit -l`, RLIMIT_MEMLOCK), or \
                 the driver could not allocate its table for a region this large (rxe keeps \
                 one physically contiguous array per region: register smaller regions)",
            )
        }
        (Op::RegMr, libc::EFAULT) => Some(
            "the address range is not ordinary memory (e.g. a dma-buf mmap, which is VM_PFNMAP): \
             register the dma-buf itself with register_dmabuf",
        ),
        (Op::RegDmabufMr, libc::EINVAL) => Some(
            "offset + length must lie inside the dma-buf, length must be non-zero, iova must \
             have the same offset within a page as offset, and the fd must be a dma-buf",
        ),
        (Op::RegDmabufMr, libc::EBADF) => Some("the fd is not open"),
        (Op::ModifyQp, libc::EINVAL) => {
            Some("check the GID index (a RoCEv2 GID must exist at it) and the peer's endpoint")
        }
        (Op::QueryGid, libc::EINVAL) => Some("no GID at that index: see the port's GID table"),
        (Op::Cm, libc::ETIMEDOUT) => Some("no answer in time: is the peer listening, and reachable over this device?"),
        (Op::Cm, libc::ECONNREFUSED) => Some("the peer rejected the connection (nobody listening on that port?): kind() is ErrorKind::Refused; a client that may start before its server retries with CmConnector::connect_retrying"),
        (Op::Cm, libc::EHOSTUNREACH) => Some("the peer's side never answered the connection request: is its process alive and listening on that address?"),
        (Op::Cm, libc::EADDRNOTAVAIL | libc::ENODEV) => {
            Some("the address belongs to no RDMA device: use the address of the RDMA netdev")
        }
        _ => None,
    }
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
