//! The crate's error type: each failure names the verb, the device or object it acted on, the
//! errno, and a hint where the cause is known.

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
    /// A work request completed with an error status.
    #[error("work request {wr_id} ({kind}) failed: {status_text} (status {status}, vendor error {vendor_err:#x})")]
    Completion {
        /// The request's id.
        wr_id: u64,
        /// What the request was.
        kind: crate::wr::WorkKind,
        /// `ibv_wc_status`.
        status: u32,
        /// `ibv_wc_status_str` of it.
        status_text: String,
        /// The provider's own code.
        vendor_err: u32,
    },
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
            _ => None,
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
        (Op::Cm, libc::ECONNREFUSED) => Some("the peer rejected the connection (nobody listening on that port?)"),
        (Op::Cm, libc::EADDRNOTAVAIL | libc::ENODEV) => {
            Some("the address belongs to no RDMA device: use the address of the RDMA netdev")
        }
        _ => None,
    }
}

/// This crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_errors_name_the_op_target_errno_and_hint() {
        let e = Error::from_errno(
            Op::RegDmabufMr,
            "pd on rxe0 (fd 7, offset 1, iova 0)",
            libc::EINVAL,
        );
        let s = e.to_string();
        assert!(
            s.starts_with(
                "ibv_reg_dmabuf_mr on pd on rxe0 (fd 7, offset 1, iova 0): Invalid argument"
            ),
            "{s}"
        );
        assert!(s.contains("same offset within a page"), "{s}");
        assert_eq!(e.errno(), Some(libc::EINVAL));
    }

    #[test]
    fn unsupported_names_the_errno() {
        let e = Error::Unsupported {
            op: Op::RegDmabufMr,
            device: "rxe0".into(),
            errno: libc::EOPNOTSUPP,
            why: DMABUF_HINT,
        };
        let s = e.to_string();
        assert!(
            s.contains("rxe0")
                && s.contains("Operation not supported")
                && s.contains("kernel-patches"),
            "{s}"
        );
        assert!(e.is_unsupported());
    }

    #[test]
    fn the_dmabuf_hint_names_both_causes_of_eopnotsupp() {
        // No dma-buf MRs at all (stock providers, stock rxe)...
        assert!(DMABUF_HINT.contains("has no dma-buf MRs"), "{DMABUF_HINT}");
        // ...or a driver that has them and refuses this buffer (the patched rxe).
        for what in ["I/O memory", "no vmap", "supports_dmabuf()"] {
            assert!(DMABUF_HINT.contains(what), "{what}: {DMABUF_HINT}");
        }
    }

    #[test]
    fn zero_errno_becomes_eio() {
        assert_eq!(
            Error::from_errno(Op::PostSend, "qp", 0).errno(),
            Some(libc::EIO)
        );
    }
}
