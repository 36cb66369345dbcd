//! The libraries' errors as [`Failure`]s, field by field: the engine's (its kind's name, its
//! `hint`, `errno`, `agent` and `segment` methods), rdma-dmabuf's and drm-export's (their
//! variants' `hint`, errno, device and fd fields). The message is the error's text; where a
//! library puts a hint of its own into that text, the message is made from the variant's
//! fields instead, without it, and the hint goes to `hint` alone.

use crate::errors::{cuda_name, About, Class, Failure};
use gpu_rdma_engine::{Error as EngineError, ErrorKind as EngineKind};
use rdma_dmabuf::ErrorKind as RdmaKind;

/// What to check when the metadata service does not know a peer, in this package's terms
/// (the engine's own hint names the Rust API).
const UNKNOWN_AGENT_HINT: &str = "name the peer first: `add_peer(name, \"ip:port\")`, \
    `add_peer_at(\"ip:port\")` or `add_peer_card(card)`; with etcd, check that the peer's \
    Agent is running and published under the same etcd endpoints and `etcd_prefix` \
    (`wait_for_peer` waits for it)";

/// What to do with a dma-buf another `DmaBuf` of this process owns, in this package's terms.
const ALREADY_OWNED_HINT: &str = "use that DmaBuf, or close it first; two owners could map \
    the buffer while a device uses it";

fn rdma_class(kind: RdmaKind) -> Class {
    match kind {
        RdmaKind::InvalidInput | RdmaKind::InvalidRequest => Class::InvalidInput,
        RdmaKind::TimedOut => Class::Timeout,
        RdmaKind::Unsupported | RdmaKind::NoDevice => Class::Unsupported,
        RdmaKind::Refused | RdmaKind::Unreachable | RdmaKind::PeerGone | RdmaKind::RemoteAccess => {
            Class::PeerLost
        }
        _ => Class::Base,
    }
}

fn engine_class(kind: EngineKind) -> Class {
    match kind {
        EngineKind::InvalidInput => Class::InvalidInput,
        EngineKind::NotFound => Class::NotFound,
        EngineKind::Busy => Class::Busy,
        EngineKind::NoDevice => Class::Unsupported,
        EngineKind::Rdma(k) => rdma_class(k),
        EngineKind::Unavailable
        | EngineKind::Restarted
        | EngineKind::PeerDown
        | EngineKind::RemoteAccess => Class::PeerLost,
        EngineKind::TimedOut => Class::Timeout,
        EngineKind::Unauthenticated => Class::Unauthenticated,
        EngineKind::LimitReached => Class::LimitReached,
        _ => Class::Base,
    }
}

/// This package's hint for an engine error, where its wording differs from the engine's
/// (which names the Rust API).
fn package_hint(e: &EngineError) -> Option<&'static str> {
    match e {
        EngineError::UnknownAgent(_) => Some(UNKNOWN_AGENT_HINT),
        EngineError::PeerNotUp { last, .. } => package_hint(last),
        EngineError::EntryFailed { error, .. } => package_hint(error),
        _ => None,
    }
}

impl Failure {
    /// The engine's error `e`, during `operation` (an rdma-dmabuf failure's own operation
    /// added: `"register: register a segment"`).
    pub fn engine(operation: &str, e: &EngineError) -> Failure {
        let kind = e.kind();
        let mut inner = e;
        while let EngineError::EntryFailed { error, .. } = inner {
            inner = error;
        }
        let operation = match inner {
            EngineError::Rdma { op, .. } => format!("{operation}: {op}"),
            _ => operation.to_string(),
        };
        Failure {
            class: engine_class(kind),
            kind: kind.name(),
            operation,
            message: e.to_string(),
            errno: e.errno(),
            hint: package_hint(e).or_else(|| e.hint()).map(Into::into),
            about: Box::new(About {
                agent: e.agent().map(Into::into),
                segment: e.segment().map(Into::into),
                ..About::default()
            }),
        }
    }

    /// rdma-dmabuf's error `e`, during `operation`.
    pub fn rdma(operation: &str, e: &rdma_dmabuf::Error) -> Failure {
        use rdma_dmabuf::Error as E;
        let kind = e.kind();
        let mut f = match e {
            E::Export(inner) => Failure::export(operation, inner),
            _ => Failure::new(rdma_class(kind), operation, e.to_string()),
        };
        f.class = rdma_class(kind);
        f.kind = EngineKind::Rdma(kind).name();
        f.errno = e.errno();
        match e {
            E::Verbs {
                op,
                target,
                source,
                hint,
            } => {
                f.message = format!("{op} on {target}: {source}");
                f.hint = hint.map(Into::into);
            }
            E::Unsupported { device, .. } | E::GidIndex { device, .. } => {
                f.about.device = Some(device.clone());
            }
            _ => {}
        }
        f
    }

    /// drm-export's error `e`, during `operation`.
    pub fn export(operation: &str, e: &drm_export::Error) -> Failure {
        Failure::export_of(operation, e, None)
    }

    /// drm-export's error `e` about a duplicate of the caller's fd `fd`: the message and
    /// `fd` name the caller's number.
    pub fn export_fd(operation: &str, e: &drm_export::Error, fd: i32) -> Failure {
        Failure::export_of(operation, e, Some(fd))
    }

    fn export_of(operation: &str, e: &drm_export::Error, caller_fd: Option<i32>) -> Failure {
        use drm_export::Error as E;
        let errno = e.errno();
        let (class, kind) = match e {
            E::Unsupported { .. } | E::CudaPointer { .. } => (Class::Unsupported, "Unsupported"),
            E::InvalidArgument { .. } | E::NotDmaBuf { .. } | E::AlreadyOwned { .. } => {
                (Class::InvalidInput, "InvalidInput")
            }
            E::Timeout { .. } => (Class::Timeout, "TimedOut"),
            _ => match errno {
                Some(libc::ENOENT | libc::ENXIO | libc::ENODEV) => (Class::Unsupported, "NoDevice"),
                Some(libc::EOPNOTSUPP) => (Class::Unsupported, "Unsupported"),
                Some(libc::EBADF | libc::EINVAL) => (Class::InvalidInput, "InvalidInput"),
                _ => (Class::Base, "Other"),
            },
        };
        let mut f = Failure::new(class, operation, e.to_string());
        f.kind = kind;
        f.errno = errno;
        match e {
            E::Os {
                op,
                target,
                source,
                hint,
            } => {
                f.message = format!("{op} on {target}: {source}");
                f.hint = hint.map(Into::into);
            }
            E::NotDmaBuf { fd, what } => {
                let fd = caller_fd.unwrap_or(*fd);
                f.message = format!("fd {fd} is not a dma-buf ({what})");
                f.about.fd = Some(fd);
            }
            E::AlreadyOwned {
                fd,
                inode,
                exporter,
            } => {
                let fd = caller_fd.unwrap_or(*fd);
                f.message = format!(
                    "fd {fd}: dma-buf inode {inode} ({exporter}) is already owned by a live \
                     DmaBuf of this process"
                );
                f.hint = Some(ALREADY_OWNED_HINT.into());
                f.about.fd = Some(fd);
            }
            E::NotSyncFile { fd, .. } | E::Timeout { fd, .. } => f.about.fd = Some(*fd),
            E::CudaPointer { ptr, len, why } => cuda_refusal(&mut f, *ptr, *len, why),
            _ => {}
        }
        f
    }
}

/// A refused CUDA range's message and hint, the hint apart (drm-export's text has some
/// inline), and the device the memory is on where that is why.
fn cuda_refusal(f: &mut Failure, ptr: u64, len: u64, why: &drm_export::CudaRefusal) {
    use drm_export::CudaRefusal as R;
    let (what, hint) = match why {
        R::HostMemory => (
            "it is page-locked host memory, not device memory".to_string(),
            "register host memory as host memory (a buffer object, HostMemory, or \
             register_address(..., location=\"cpu\"))",
        ),
        R::ManagedMemory => (
            "it is managed memory, which the driver migrates between host and device".to_string(),
            "use cudaMalloc or cuMemCreate memory (torch's and CuPy's default allocators)",
        ),
        R::SharesPages { base, size } => (
            format!(
                "its allocation ({size} bytes at {base:#x}) does not fill the pages holding \
                 it, so their dma-buf would hold other allocations' memory"
            ),
            "allocate whole pages, page-aligned, or a larger pool",
        ),
        R::OtherDevice { ordinal } => {
            f.about.device = Some(cuda_name(*ordinal));
            return;
        }
        _ => return,
    };
    f.message = format!("CUDA pointer {ptr:#x} + {len} bytes: {what}");
    f.hint = Some(hint.into());
}
