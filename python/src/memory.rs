//! Dma-bufs from Python: the exporters (vgem, udmabuf, dma-heap), any `int` dma-buf fd, and
//! the `DmaBuf` class that holds one until it is registered.

use crate::errors::{Class, Failure, Result};
use drm_export::{DmaBuf, DmaHeap, DrmDevice, DumbBuffer, NodeKind, Udmabuf};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;

/// A dma-buf this process owns. Registering it as a segment moves it into the agent (the
/// object then reads as `registered`); unregistering the segment puts it back.
#[pyclass(module = "gpu_rdma", name = "DmaBuf")]
pub(crate) struct PyDmaBuf {
    inner: Option<DmaBuf>,
    size: u64,
    exporter: String,
    /// The segment holding it, while registered.
    segment: Option<String>,
}

impl PyDmaBuf {
    pub(crate) fn wrap(d: DmaBuf) -> PyDmaBuf {
        PyDmaBuf {
            size: d.size(),
            exporter: d.exporter().to_string(),
            inner: Some(d),
            segment: None,
        }
    }

    /// The dma-buf, for registration as `segment`.
    pub(crate) fn lend(&mut self, segment: &str) -> Result<DmaBuf> {
        let d = self.held("register")?;
        self.segment = Some(segment.to_string());
        Ok(d)
    }

    /// Puts back what unregistering handed back.
    pub(crate) fn restore(&mut self, d: DmaBuf) {
        self.inner = Some(d);
        self.segment = None;
    }

    /// The engine dropped the dma-buf (a refused registration, a closed agent).
    pub(crate) fn restore_none(&mut self) {
        self.inner = None;
        self.segment = None;
    }

    fn held(&mut self, op: &str) -> Result<DmaBuf> {
        self.inner.take().ok_or_else(|| self.gone(op))
    }

    fn gone(&self, op: &str) -> Failure {
        match &self.segment {
            Some(s) => Failure::new(
                Class::InvalidInput,
                op,
                format!("{op}: this dma-buf is registered as segment {s:?}"),
            )
            .hinted("unregister the segment first (Agent.unregister gives it back)")
            .with_segment(s),
            None => Failure::new(
                Class::InvalidInput,
                op,
                format!("{op}: this dma-buf is closed"),
            ),
        }
    }

    fn inner_mut(&mut self, op: &str) -> Result<&mut DmaBuf> {
        if self.inner.is_none() {
            return Err(self.gone(op));
        }
        Ok(self.inner.as_mut().expect("checked just above"))
    }
}

fn range(op: &str, size: u64, offset: u64, len: u64) -> Result<()> {
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(Failure::new(
            Class::InvalidInput,
            op,
            format!("{op}: {len} bytes at offset {offset} past the dma-buf's {size} bytes"),
        ));
    }
    Ok(())
}

#[pymethods]
impl PyDmaBuf {
    /// Its size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The exporting driver's name (`udmabuf`, `vgem`, `system`, ...).
    #[getter]
    fn exporter(&self) -> &str {
        &self.exporter
    }

    /// Whether it is registered as a segment now.
    #[getter]
    fn registered(&self) -> bool {
        self.segment.is_some()
    }

    /// Whether it was closed.
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_none() && self.segment.is_none()
    }

    /// Its fd (owned by this object: duplicate it to keep it past `close`).
    fn fileno(&mut self) -> PyResult<i32> {
        Ok(self.inner_mut("fileno")?.as_fd().as_raw_fd())
    }

    /// `length` bytes from `offset` (default: to the end), through its CPU mapping.
    #[pyo3(signature = (offset = 0, length = None))]
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let size = self.size;
        let len = length.unwrap_or(size.saturating_sub(offset));
        range("read", size, offset, len)?;
        let d = self.inner_mut("read")?;
        let map = d.map().map_err(|e| Failure::export("map", &e))?;
        let guard = map.read().map_err(|e| Failure::export("read", &e))?;
        let mut out = vec![0u8; len as usize];
        guard
            .read_at(offset as usize, &mut out)
            .map_err(|e| Failure::export("read", &e))?;
        Ok(PyBytes::new(py, &out))
    }

    /// Writes `data` at `offset` through its CPU mapping.
    #[pyo3(signature = (data, offset = 0))]
    fn write(&mut self, data: &[u8], offset: u64) -> PyResult<()> {
        range("write", self.size, offset, data.len() as u64)?;
        let d = self.inner_mut("write")?;
        let mut map = d.map().map_err(|e| Failure::export("map", &e))?;
        let mut guard = map.write().map_err(|e| Failure::export("write", &e))?;
        guard
            .write_at(offset as usize, data)
            .map_err(|e| Failure::export("write", &e))?;
        Ok(())
    }

    /// Closes it (refused while registered).
    fn close(&mut self) -> PyResult<()> {
        if self.segment.is_some() {
            return Err(self.gone("close").into());
        }
        self.inner = None;
        Ok(())
    }

    fn __repr__(&self) -> String {
        let state = match (&self.inner, &self.segment) {
            (_, Some(s)) => format!("registered as {s:?}"),
            (Some(d), None) => format!("fd {}", d.as_fd().as_raw_fd()),
            (None, None) => "closed".into(),
        };
        format!(
            "DmaBuf(exporter={:?}, size={}, {state})",
            self.exporter, self.size
        )
    }
}

/// `size` bytes of host memory exported by `/dev/udmabuf` (a sealed memfd). `size` must be a
/// multiple of the page size.
#[pyfunction]
pub(crate) fn udmabuf(py: Python<'_>, size: u64) -> PyResult<PyDmaBuf> {
    let d = py
        .allow_threads(|| Udmabuf::new(size))
        .map_err(|e| Failure::export("udmabuf", &e))?;
    Ok(PyDmaBuf::wrap(d.into_parts().1))
}

/// `size` bytes from the dma-heap `heap` (`/dev/dma_heap/<heap>`, default `system`).
#[pyfunction]
#[pyo3(signature = (size, heap = "system"))]
pub(crate) fn dma_heap(py: Python<'_>, size: u64, heap: &str) -> PyResult<PyDmaBuf> {
    let d = py
        .allow_threads(|| DmaHeap::open(heap)?.allocate(size))
        .map_err(|e| Failure::export("dma_heap", &e))?;
    Ok(PyDmaBuf::wrap(d))
}

/// A vgem dumb buffer of at least `size` bytes, exported with PRIME (the testbed's stand-in
/// GPU).
#[pyfunction]
pub(crate) fn vgem(py: Python<'_>, size: u64) -> PyResult<PyDmaBuf> {
    let d = py
        .allow_threads(|| {
            let card = Arc::new(DrmDevice::open_driver("vgem", NodeKind::Card)?);
            DumbBuffer::new(&card, size)?.export()
        })
        .map_err(|e| Failure::export("vgem", &e))?;
    Ok(PyDmaBuf::wrap(d))
}

/// A dma-buf from any fd (another library's, another process's): the fd is duplicated (the
/// caller keeps its own) and checked as the Rust side checks it (a dma-buf, its size and
/// exporter read from the kernel, not owned by another `DmaBuf` of this process).
#[pyfunction]
pub(crate) fn dmabuf_from_fd(fd: i32) -> PyResult<PyDmaBuf> {
    Ok(PyDmaBuf::wrap(from_fd(fd)?))
}

/// The dma-buf behind a duplicate of `fd`.
pub(crate) fn from_fd(fd: i32) -> Result<DmaBuf> {
    if fd < 0 {
        return Err(Failure::new(
            Class::InvalidInput,
            "dmabuf_from_fd",
            format!("fd {fd}: not an fd"),
        )
        .with_fd(fd));
    }
    let owned = crate::sys::fd::dup_cloexec(fd).map_err(|e| {
        let op = "dmabuf_from_fd";
        Failure::os(op, format!("{op}: dup of fd {fd}"), &e).with_fd(fd)
    })?;
    DmaBuf::try_from(owned).map_err(|e| Failure::export_fd("dmabuf_from_fd", &e, fd))
}
