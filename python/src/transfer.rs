//! Batches, transfers and their waits: bounded, with the GIL released, and awaitable from
//! asyncio (`crate::awaiting`).

use crate::errors::{Class, Failure, Result};
use gpu_rdma_engine::{Batch as EngineBatch, EntryStatus, Transfer as EngineTransfer};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A bound for a wait, from seconds: finite and not negative (no wait without a bound).
pub(crate) fn bound(op: &str, seconds: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(seconds).map_err(|_| {
        Failure::new(
            Class::InvalidInput,
            op,
            format!("{op}: a timeout of {seconds} s (a finite number of seconds, 0 or more)"),
        )
    })
}

/// A socket address (`"ip:port"`) from an argument of `op`.
pub(crate) fn address(op: &str, text: &str) -> Result<SocketAddr> {
    text.parse().map_err(|e| {
        Failure::new(
            Class::InvalidInput,
            op,
            format!("{op}: address {text:?}: {e}"),
        )
        .hinted("an IP address and port, such as \"10.0.0.2:18700\"")
    })
}

/// The class `gpu_rdma.EntryStatus`, a `str` enum defined in Python (an `enum.Enum` with
/// `str` mixed in, which PyO3's own enums are not).
const ENTRY_STATUS: &std::ffi::CStr = c"
import enum


class EntryStatus(str, enum.Enum):
    \"\"\"The state of one entry of a transfer, from `Transfer.status()`.

    A `str` as well as an enum: each member equals its value (`EntryStatus.DONE == \"done\"`)
    and prints as it, so code comparing with the strings still works. A failed entry's error
    is `Transfer.errors()`'s.
    \"\"\"

    PENDING = \"pending\"
    DONE = \"done\"
    FAILED = \"failed\"

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(str.__str__(self), spec)


EntryStatus.__module__ = \"gpu_rdma\"
";

/// `EntryStatus`, made once.
static ENTRY_STATUS_CLASS: GILOnceCell<Py<PyAny>> = GILOnceCell::new();

fn entry_status(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    ENTRY_STATUS_CLASS
        .get_or_try_init(py, || {
            let m = PyModule::from_code(
                py,
                ENTRY_STATUS,
                c"gpu_rdma/_entry_status.py",
                c"gpu_rdma._entry_status",
            )?;
            Ok(m.getattr("EntryStatus")?.unbind())
        })
        .map(|c| c.bind(py))
}

/// Adds `EntryStatus` to the module.
pub(crate) fn add(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("EntryStatus", entry_status(m.py())?)
}

/// Reads and writes between this agent's segments and peers' segments, with an optional
/// notification delivered to the peers once every entry has landed.
///
/// `Batch().write("src", 0, "b", "dst", 4096, 65536).notify(b"done")`: methods return the
/// batch, so calls chain.
#[pyclass(module = "gpu_rdma", name = "Batch")]
pub(crate) struct Batch {
    pub(crate) inner: EngineBatch,
}

/// The batch with `add` applied to it (the engine's builder takes the batch by value).
fn push<'py>(
    mut slf: PyRefMut<'py, Batch>,
    add: impl FnOnce(EngineBatch) -> EngineBatch,
) -> PyRefMut<'py, Batch> {
    let b = std::mem::take(&mut slf.inner);
    slf.inner = add(b);
    slf
}

/// The batch with `add(local, peer, remote, length)` applied per index of three lists of
/// one length.
fn many<'py>(
    mut slf: PyRefMut<'py, Batch>,
    op: &str,
    local: &[u64],
    peer: &str,
    remote: &[u64],
    lengths: &[u64],
    add: fn(EngineBatch, u64, &str, u64, u64) -> EngineBatch,
) -> PyResult<PyRefMut<'py, Batch>> {
    if local.len() != remote.len() || local.len() != lengths.len() {
        return Err(Failure::new(
            Class::InvalidInput,
            op,
            format!(
                "{op}: {} local addresses, {} remote addresses and {} lengths (one each per \
                 entry)",
                local.len(),
                remote.len(),
                lengths.len()
            ),
        )
        .into());
    }
    let mut b = std::mem::take(&mut slf.inner);
    for ((&l, &r), &n) in local.iter().zip(remote).zip(lengths) {
        b = add(b, l, peer, r, n);
    }
    slf.inner = b;
    Ok(slf)
}

#[pymethods]
impl Batch {
    #[new]
    fn new() -> Batch {
        Batch {
            inner: EngineBatch::new(),
        }
    }

    /// Adds an RDMA write of `length` bytes from `local`'s `local_offset` to `remote`'s
    /// `remote_offset` on agent `peer`.
    fn write<'py>(
        slf: PyRefMut<'py, Self>,
        local: &str,
        local_offset: u64,
        peer: &str,
        remote: &str,
        remote_offset: u64,
        length: u64,
    ) -> PyRefMut<'py, Self> {
        push(slf, |b| {
            b.write(local, local_offset, peer, remote, remote_offset, length)
        })
    }

    /// Adds an RDMA read of `length` bytes from `remote`'s `remote_offset` on agent `peer`
    /// into `local`'s `local_offset`.
    fn read<'py>(
        slf: PyRefMut<'py, Self>,
        local: &str,
        local_offset: u64,
        peer: &str,
        remote: &str,
        remote_offset: u64,
        length: u64,
    ) -> PyRefMut<'py, Self> {
        push(slf, |b| {
            b.read(local, local_offset, peer, remote, remote_offset, length)
        })
    }

    /// Adds an RDMA write of `length` bytes at address `local_address` (inside a segment of
    /// this agent registered from host or CUDA memory) to `remote_address` of agent `peer`
    /// (inside one of its segments): Mooncake's way of naming memory. An address no segment
    /// holds whole is refused with `NotFound` when the batch is submitted.
    fn write_at<'py>(
        slf: PyRefMut<'py, Self>,
        local_address: u64,
        peer: &str,
        remote_address: u64,
        length: u64,
    ) -> PyRefMut<'py, Self> {
        push(slf, |b| {
            b.write_at(local_address, peer, remote_address, length)
        })
    }

    /// Adds an RDMA read of `length` bytes at `remote_address` of agent `peer` into
    /// `local_address` (see `write_at`).
    fn read_at<'py>(
        slf: PyRefMut<'py, Self>,
        local_address: u64,
        peer: &str,
        remote_address: u64,
        length: u64,
    ) -> PyRefMut<'py, Self> {
        push(slf, |b| {
            b.read_at(local_address, peer, remote_address, length)
        })
    }

    /// Adds one `write_at` per index of the three lists (local addresses, remote
    /// addresses, lengths: sequences of one length), in one call.
    fn write_many_at<'py>(
        slf: PyRefMut<'py, Self>,
        local_addresses: Vec<u64>,
        peer: &str,
        remote_addresses: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        many(
            slf,
            "write_many_at",
            &local_addresses,
            peer,
            &remote_addresses,
            &lengths,
            EngineBatch::write_at,
        )
    }

    /// Adds one `read_at` per index of the three lists, in one call (see `write_many_at`).
    fn read_many_at<'py>(
        slf: PyRefMut<'py, Self>,
        local_addresses: Vec<u64>,
        peer: &str,
        remote_addresses: Vec<u64>,
        lengths: Vec<u64>,
    ) -> PyResult<PyRefMut<'py, Self>> {
        many(
            slf,
            "read_many_at",
            &local_addresses,
            peer,
            &remote_addresses,
            &lengths,
            EngineBatch::read_at,
        )
    }

    /// Sends `message` (at most 4096 bytes) to every peer of the batch once all its
    /// entries have landed.
    fn notify<'py>(slf: PyRefMut<'py, Self>, message: &[u8]) -> PyRefMut<'py, Self> {
        push(slf, |b| b.notify(message.to_vec()))
    }

    fn __len__(&self) -> usize {
        self.inner.entries.len()
    }

    fn __repr__(&self) -> String {
        format!("Batch({} entries)", self.inner.entries.len())
    }
}

/// A submitted batch. `wait(timeout)` blocks with the GIL released; `await
/// transfer.finished(timeout)` waits in the event loop's executor.
#[pyclass(module = "gpu_rdma", name = "Transfer")]
pub(crate) struct Transfer {
    pub(crate) inner: Arc<EngineTransfer>,
}

#[pymethods]
impl Transfer {
    /// Waits at most `timeout` seconds for every entry (the GIL released meanwhile).
    /// Raises `Timeout` if the batch has not finished by then, the first failed entry's
    /// error (`PeerLost`, ...) if one failed.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = bound("wait", timeout)?;
        let inner = self.inner.clone();
        py.allow_threads(move || inner.wait(t))
            .map_err(|e| Failure::engine("wait", &e).into())
    }

    /// An asyncio future of `wait(timeout)`: settled from the engine when the batch
    /// finishes (no executor thread is held while it waits), with `Timeout` after `timeout`
    /// seconds. Call it from a coroutine (it needs the running loop).
    fn finished<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let t = bound("finished", timeout)?;
        crate::awaiting::finished(py, self.inner.clone(), t)
    }

    /// Whether the engine is done with the batch (every entry done or failed).
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_finished()
    }

    /// The engine's clock for this batch: `(started, submitted, finished)`, the first the
    /// wall-clock time `transfer` was called (microseconds since the epoch), the others
    /// microseconds since then, rounded up: when it was planned and handed to the worker,
    /// and when the worker was done with it (`None` while it is not).
    fn timing(&self) -> (u64, u64, Option<u64>) {
        let t = self.inner.timing();
        let us = |d: Duration| u64::try_from(d.as_nanos().div_ceil(1000)).unwrap_or(u64::MAX);
        let epoch = t
            .started
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        (epoch, us(t.submitted), t.finished.map(us))
    }

    /// Each entry's state, in the batch's order: `EntryStatus.PENDING`, `DONE` or `FAILED`
    /// (`str` members, equal to `"pending"`, `"done"`, `"failed"`).
    fn status<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let class = entry_status(py)?;
        self.inner
            .status()
            .into_iter()
            .map(|s| {
                class.getattr(match s {
                    EntryStatus::Pending => "PENDING",
                    EntryStatus::Done => "DONE",
                    EntryStatus::Failed(_) => "FAILED",
                })
            })
            .collect()
    }

    /// Each entry's error, in the batch's order: None for an entry pending or done, the
    /// exception (a `gpu_rdma.Error`, as `wait` would raise it) for a failed one.
    fn errors(&self, py: Python<'_>) -> Vec<Option<PyObject>> {
        self.inner
            .status()
            .into_iter()
            .map(|s| match s {
                EntryStatus::Failed(e) => Some(
                    PyErr::from(Failure::engine("status", &e))
                        .into_value(py)
                        .into_any(),
                ),
                EntryStatus::Pending | EntryStatus::Done => None,
            })
            .collect()
    }

    fn __repr__(&self) -> String {
        let s = self.inner.status();
        let done = s.iter().filter(|x| **x == EntryStatus::Done).count();
        format!("Transfer({done} of {} entries done)", s.len())
    }
}

/// A notification from a peer: who sent it, and the message.
#[pyclass(module = "gpu_rdma", name = "Notification", frozen)]
pub(crate) struct Notification {
    pub(crate) sender: String,
    pub(crate) message: Vec<u8>,
}

#[pymethods]
impl Notification {
    /// The sending agent's name.
    #[getter]
    fn sender(&self) -> &str {
        &self.sender
    }

    /// The message.
    #[getter]
    fn message<'py>(&self, py: Python<'py>) -> Bound<'py, pyo3::types::PyBytes> {
        pyo3::types::PyBytes::new(py, &self.message)
    }

    fn __repr__(&self) -> String {
        format!(
            "Notification(sender={:?}, {} bytes)",
            self.sender,
            self.message.len()
        )
    }
}
