//! The exception hierarchy: one base, `gpu_rdma.Error`, and a subclass for each failure a
//! caller handles, defined once in Python (`gpu_rdma/_errors.py`, which gives `Timeout` and
//! `PeerLost` their builtin bases, `TimeoutError` and `ConnectionError`) and looked up here
//! when the module is initialized. A [`Failure`] becomes an instance of its class with the
//! Rust error's fields as attributes: `kind`, `operation`, `hint`, `errno`, `agent`,
//! `segment`, `device`, `fd` (`failures` reads them from the libraries' errors).

use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyType};

/// The Python class an error becomes, in the order of `_errors.CLASSES`.
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

/// The classes' names, in the order of [`Class`] (checked against `_errors.CLASSES`).
const NAMES: [&str; 10] = [
    "Error",
    "Unsupported",
    "InvalidInput",
    "PeerLost",
    "Timeout",
    "NotFound",
    "Busy",
    "Unauthenticated",
    "LimitReached",
    "Closed",
];

impl Class {
    /// The `kind` of a refusal of this module's own of this class (the name the engine's
    /// kind of the same failure has).
    pub fn kind(self) -> &'static str {
        match self {
            Class::Base => "Other",
            Class::Unsupported => "Unsupported",
            Class::InvalidInput => "InvalidInput",
            Class::PeerLost => "PeerDown",
            Class::Timeout => "TimedOut",
            Class::NotFound => "NotFound",
            Class::Busy => "Busy",
            Class::Unauthenticated => "Unauthenticated",
            Class::LimitReached => "LimitReached",
            Class::Closed => "Closed",
        }
    }
}

static TYPES: GILOnceCell<Vec<Py<PyType>>> = GILOnceCell::new();

/// The classes of `gpu_rdma._errors`, imported once.
fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let classes = py.import("gpu_rdma._errors")?.getattr("CLASSES")?;
        let mut all = Vec::with_capacity(NAMES.len());
        for (i, name) in NAMES.iter().enumerate() {
            let t = classes.get_item(i)?.downcast_into::<PyType>()?;
            if t.name()? != *name {
                return Err(pyo3::exceptions::PyImportError::new_err(format!(
                    "gpu_rdma._errors.CLASSES[{i}] is {}, not {name}",
                    t.name()?
                )));
            }
            all.push(t.unbind());
        }
        Ok(all)
    })
}

/// An error on its way to Python: its class, message (without the hint) and fields.
#[derive(Debug)]
pub(crate) struct Failure {
    pub class: Class,
    /// A stable name: the engine's kind's ([`gpu_rdma_engine::ErrorKind::name`]), or the
    /// class's ([`Class::kind`]).
    pub kind: &'static str,
    pub operation: String,
    pub message: String,
    pub errno: Option<i32>,
    pub hint: Option<String>,
    /// What the error names (boxed: most errors name nothing, and a `Result`'s error stays
    /// small).
    pub about: Box<About>,
}

/// The agent, segment, device and fd an error is about, where it names them: the Rust
/// error's own fields, or the call's (the segment a registration names, the GPU it chose).
#[derive(Debug, Default)]
pub(crate) struct About {
    pub agent: Option<String>,
    pub segment: Option<String>,
    /// An RDMA device's name, or `cuda:N`.
    pub device: Option<String>,
    pub fd: Option<i32>,
}

impl Failure {
    /// A refusal of this module's own (a wrong argument, memory it cannot register), of the
    /// class's kind.
    pub fn new(class: Class, operation: &str, message: impl Into<String>) -> Failure {
        Failure {
            class,
            kind: class.kind(),
            operation: operation.into(),
            message: message.into(),
            errno: None,
            hint: None,
            about: Box::default(),
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
        .with_agent(agent)
    }

    /// An OS error of this module's own (`dup` of an fd): `InvalidInput` for EBADF.
    pub fn os(operation: &str, message: String, e: &std::io::Error) -> Failure {
        let errno = e.raw_os_error();
        let class = if errno == Some(libc::EBADF) {
            Class::InvalidInput
        } else {
            Class::Base
        };
        let mut f = Failure::new(class, operation, format!("{message}: {e}"));
        f.errno = errno;
        f
    }

    /// The same, with a hint.
    pub fn hinted(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// The same, naming agent `agent`.
    pub fn with_agent(mut self, agent: &str) -> Failure {
        self.about.agent = Some(agent.into());
        self
    }

    /// The same, naming segment `segment`.
    pub fn with_segment(mut self, segment: &str) -> Failure {
        self.about.segment = Some(segment.into());
        self
    }

    /// The same, naming device `device` (an RDMA device's name, or `cuda:N`), unless it
    /// names one already (the error's own).
    pub fn with_device(mut self, device: impl Into<String>) -> Failure {
        self.about.device.get_or_insert_with(|| device.into());
        self
    }

    /// The same, naming fd `fd` (the caller's number).
    pub fn with_fd(mut self, fd: i32) -> Failure {
        self.about.fd = Some(fd);
        self
    }
}

/// The name the engine and this module give CUDA device `ordinal`.
pub(crate) fn cuda_name(ordinal: i32) -> String {
    format!("cuda:{ordinal}")
}

/// `f` as an instance of its class, made with its message and fields as keywords.
fn instance(py: Python<'_>, f: Failure) -> PyResult<PyErr> {
    let class = types(py)?[f.class as usize].bind(py);
    let fields = PyDict::new(py);
    fields.set_item("kind", f.kind)?;
    fields.set_item("operation", f.operation)?;
    fields.set_item("hint", f.hint)?;
    fields.set_item("errno", f.errno)?;
    let about = *f.about;
    fields.set_item("agent", about.agent)?;
    fields.set_item("segment", about.segment)?;
    fields.set_item("device", about.device)?;
    fields.set_item("fd", about.fd)?;
    let value = class.call((f.message,), Some(&fields))?;
    Ok(PyErr::from_value(value))
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::with_gil(|py| instance(py, f).unwrap_or_else(|e| e))
    }
}

/// Results whose errors become Python exceptions.
pub(crate) type Result<T> = std::result::Result<T, Failure>;

/// Adds the classes to the module (`gpu_rdma._native.Error` is `gpu_rdma.Error`).
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for (name, t) in NAMES.iter().zip(types(m.py())?) {
        m.add(*name, t.clone_ref(m.py()))?;
    }
    Ok(())
}
