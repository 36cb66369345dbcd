//! The exception hierarchy: one base, `gpu_rdma.Error`, with the Rust error's operation,
//! errno and hint as attributes, and a subclass for each kind a caller handles.

use gpu_rdma_engine::ErrorKind as EngineKind;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::PyType;
use rdma_dmabuf::ErrorKind as RdmaKind;
use std::ffi::{CStr, CString};

/// The classes, made once (`gpu_rdma.Error` first, the others its subclasses), by name and
/// docstring, in the order of [`Class`].
const CLASSES: [(&str, &CStr); 10] = [
    (
        "Error",
        c"Every error of gpu_rdma. Attributes: `operation` (what was attempted), `errno` (the \
         OS error number, or None), `hint` (the likely cause, or None), `kind` (the Rust \
         error kind's name).",
    ),
    (
        "Unsupported",
        c"The device, driver, kernel or build cannot do it (no RDMA device, no CUDA, memory \
         the engine cannot register).",
    ),
    (
        "InvalidInput",
        c"The request was refused before anything was posted: fix it (a range past a \
         segment, a closed fd, a name taken, a read-only buffer).",
    ),
    (
        "PeerLost",
        c"The peer is down, restarted, unreachable, or refused the access: its entries failed.",
    ),
    (
        "Timeout",
        c"A bounded wait ended before what it waited for.",
    ),
    (
        "NotFound",
        c"An agent or segment the metadata service does not know (yet, or any more).",
    ),
    (
        "Busy",
        c"A segment is still used by an unfinished transfer: wait for it and try again.",
    ),
    (
        "Unauthenticated",
        c"Authentication failed: a peer without the cluster's key or certificate, one this \
         agent's key or certificate does not convince, or an etcd value written by someone \
         who is not an agent of the cluster (docs/engine.md, \"Security\").",
    ),
    (
        "LimitReached",
        c"A peer refused a request at one of its limits (connections, queue pairs, \
         notifications queued and not taken): retry later or with less.",
    ),
    (
        "Closed",
        c"The agent was closed (`close()`, or the end of its `with` block): every method \
         but `close` refuses; create a new Agent.",
    ),
];

static TYPES: GILOnceCell<Vec<Py<PyType>>> = GILOnceCell::new();

fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let base = PyErr::new_type(
            py,
            c"gpu_rdma.Error",
            Some(CLASSES[0].1),
            Some(&py.get_type::<PyException>()),
            None,
        )?;
        let mut all = vec![base.clone_ref(py)];
        for (name, doc) in &CLASSES[1..] {
            let full = CString::new(format!("gpu_rdma.{name}")).expect("no NUL in the names");
            let t = PyErr::new_type(py, &full, Some(doc), Some(base.bind(py)), None)?;
            all.push(t);
        }
        Ok(all)
    })
}

/// The Python class an error becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Base = 0,
    Unsupported,
    InvalidInput,
    PeerLost,
    Timeout,
    NotFound,
    Busy,
    Unauthenticated,
    LimitReached,
    Closed,
}

/// An error on its way to Python: its class, text, operation, errno and hint.
#[derive(Debug)]
pub(crate) struct Failure {
    pub class: Class,
    pub kind: String,
    pub operation: String,
    pub message: String,
    pub errno: Option<i32>,
    pub hint: Option<String>,
}

/// An error's text split into the text without the `(hint: ...)` the libraries append, and
/// that hint (None, the text whole, when it has none): the hint goes to `e.hint`, and
/// `str(e)` does not repeat it.
fn split_hint(text: &str) -> (String, Option<String>) {
    let Some(open) = text.find("(hint: ") else {
        return (text.to_string(), None);
    };
    let rest = &text[open + "(hint: ".len()..];
    let end = rest.rfind(')').unwrap_or(rest.len());
    let after = rest.get(end + 1..).unwrap_or("");
    let message = format!("{}{after}", text[..open].trim_end());
    (message, Some(rest[..end].to_string()))
}

/// The OS error number an error's text ends its cause with (`... (os error 38)`), for the
/// engine's errors that carry their cause as text only.
fn os_errno(text: &str) -> Option<i32> {
    let start = text.rfind("(os error ")? + "(os error ".len();
    let digits = &text[start..];
    let end = digits.find(')')?;
    digits[..end].parse().ok()
}

/// What to check when no RDMA device could be used.
pub(crate) const NO_DEVICE_HINT: &str = "`rdma link` lists the RDMA devices and their \
    state (one must be ACTIVE); with no hardware NIC, load soft-RoCE (`modprobe rdma_rxe`, \
    then `rdma link add rxe0 type rxe netdev <netdev>`); `gpu-rdma-doctor` checks the \
    kernel, rdma-core and every device";

/// What to check when the metadata service does not know a peer.
const UNKNOWN_AGENT_HINT: &str = "name the peer first: `add_peer(name, \"ip:port\")`, \
    `add_peer_at(\"ip:port\")` or `add_peer_card(card)`; with etcd, check that the peer's \
    Agent is running and published under the same etcd endpoints and `etcd_prefix` \
    (`wait_for_peer` waits for it)";

fn rdma_class(kind: RdmaKind) -> Class {
    match kind {
        RdmaKind::InvalidInput => Class::InvalidInput,
        RdmaKind::TimedOut => Class::Timeout,
        RdmaKind::Unsupported | RdmaKind::NoDevice => Class::Unsupported,
        RdmaKind::Refused | RdmaKind::Unreachable | RdmaKind::PeerGone | RdmaKind::RemoteAccess => {
            Class::PeerLost
        }
        _ => Class::Base,
    }
}

impl Failure {
    /// A refusal of this module's own (a wrong argument, memory it cannot register).
    pub fn new(class: Class, operation: &str, message: impl Into<String>) -> Failure {
        Failure {
            class,
            kind: format!("{class:?}"),
            operation: operation.into(),
            message: message.into(),
            errno: None,
            hint: None,
        }
    }

    /// Agent `agent`'s method `operation`, called after `close()`.
    pub fn closed(operation: &str, agent: &str) -> Failure {
        Failure::new(
            Class::Closed,
            operation,
            format!("{operation}: agent {agent:?} is closed"),
        )
        .hinted("close() shut it down; create a new Agent")
    }

    /// The same, with a hint.
    pub fn hinted(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// The engine's error `e`, during `operation`.
    pub fn engine(operation: &str, e: &gpu_rdma_engine::Error) -> Failure {
        let kind = e.kind();
        let class = match kind {
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
        };
        let mut errno = None;
        let mut op = operation.to_string();
        let mut inner = e;
        while let gpu_rdma_engine::Error::EntryFailed { error, .. } = inner {
            inner = error;
        }
        if let gpu_rdma_engine::Error::Rdma {
            op: what, errno: n, ..
        } = inner
        {
            errno = *n;
            op = format!("{operation}: {what}");
        }
        let (message, mut hint) = split_hint(&e.to_string());
        match inner {
            gpu_rdma_engine::Error::NoDevice(_) => {
                errno = errno.or_else(|| os_errno(&message));
                hint = hint.or_else(|| Some(NO_DEVICE_HINT.to_string()));
            }
            gpu_rdma_engine::Error::UnknownAgent(_) => {
                hint = hint.or_else(|| Some(UNKNOWN_AGENT_HINT.to_string()));
            }
            gpu_rdma_engine::Error::PeerNotUp { last, .. }
                if matches!(**last, gpu_rdma_engine::Error::UnknownAgent(_)) =>
            {
                hint = hint.or_else(|| Some(UNKNOWN_AGENT_HINT.to_string()));
            }
            _ => {}
        }
        Failure {
            class,
            kind: format!("{kind:?}"),
            operation: op,
            hint,
            message,
            errno,
        }
    }

    /// rdma-dmabuf's error `e`, during `operation`.
    pub fn rdma(operation: &str, e: &rdma_dmabuf::Error) -> Failure {
        let kind = e.kind();
        let (message, hint) = split_hint(&e.to_string());
        Failure {
            class: rdma_class(kind),
            kind: format!("{kind:?}"),
            operation: operation.into(),
            hint,
            message,
            errno: e.errno(),
        }
    }

    /// drm-export's error `e`, during `operation`.
    pub fn export(operation: &str, e: &drm_export::Error) -> Failure {
        use drm_export::Error as E;
        let errno = e.errno();
        let class = match e {
            E::Unsupported { .. } | E::CudaPointer { .. } => Class::Unsupported,
            E::InvalidArgument { .. } | E::NotDmaBuf { .. } | E::AlreadyOwned { .. } => {
                Class::InvalidInput
            }
            E::Timeout { .. } => Class::Timeout,
            _ if matches!(errno, Some(2 | 6 | 19 | 95)) => Class::Unsupported,
            _ if matches!(errno, Some(9 | 22)) => Class::InvalidInput,
            _ => Class::Base,
        };
        let (message, hint) = split_hint(&e.to_string());
        Failure {
            class,
            kind: format!("{class:?}"),
            operation: operation.into(),
            hint,
            message,
            errno,
        }
    }

    /// An OS error of this module's own (`dup` of an fd).
    pub fn os(operation: &str, e: &std::io::Error) -> Failure {
        let errno = e.raw_os_error();
        let class = if errno == Some(9) {
            Class::InvalidInput
        } else {
            Class::Base
        };
        Failure {
            class,
            kind: format!("{class:?}"),
            operation: operation.into(),
            message: format!("{operation}: {e}"),
            errno,
            hint: None,
        }
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::with_gil(|py| {
            let class = match types(py) {
                Ok(t) => t[f.class as usize].clone_ref(py),
                Err(e) => return e,
            };
            let err = PyErr::from_type(class.into_bound(py), f.message.clone());
            let v = err.value(py);
            // Setting attributes on a fresh exception instance cannot fail but for memory.
            let _ = v.setattr("operation", f.operation);
            let _ = v.setattr("errno", f.errno);
            let _ = v.setattr("hint", f.hint);
            let _ = v.setattr("kind", f.kind);
            err
        })
    }
}

/// Results whose errors become Python exceptions.
pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// Adds the classes to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for ((name, _), t) in CLASSES.iter().zip(types(m.py())?) {
        m.add(*name, t.clone_ref(m.py()))?;
    }
    Ok(())
}
