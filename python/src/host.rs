//! Host memory from Python: `HostMemory`, page-aligned memory a udmabuf can export (a sealed
//! memfd mapped into the process), and the pinning of buffer-protocol objects.
//!
//! rdma-dmabuf registers host memory only as its own `HostBuffer` (an anonymous mapping it
//! makes, with a sealed `Backing` trait): it has no constructor over memory another owner
//! holds. So memory a Python object owns (a `bytearray`, a numpy array allocated by numpy)
//! cannot be registered without a copy, and this module refuses it (`Unsupported`, with the
//! way round it as the hint). Memory of a `HostMemory` can: a buffer object over it (a
//! numpy array from `numpy.frombuffer(mem.buffer)`, a `memoryview` slice) is exported as a
//! new udmabuf of the same memfd pages, so the NIC and the array share the memory.

use crate::errors::{Class, Failure, Result};
use drm_export::{DmaBuf, MemfdPages, Udmabuf};
use pyo3::prelude::*;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

/// A live `HostMemory`'s mapping: its first byte's address, length and memfd.
struct Mapped {
    base: usize,
    len: usize,
    memfd: Arc<OwnedFd>,
}

/// Every live `HostMemory`'s mapping. An entry exists only while its `HostMemory` is alive,
/// and a `HostMemory` holds its mapping (the `mmap` object), so an address found here is
/// mapped to that memfd.
static MAPPED: Mutex<Vec<Mapped>> = Mutex::new(Vec::new());

fn mapped() -> std::sync::MutexGuard<'static, Vec<Mapped>> {
    MAPPED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Page-aligned host memory that segments can be made of without a copy: a sealed memfd,
/// mapped shared (`buffer`, an `mmap.mmap`), exported as a udmabuf when registered.
/// `numpy.frombuffer(mem.buffer, dtype)` views it; registering the `HostMemory`, or any
/// page-aligned, whole-pages, C-contiguous view of it, makes a segment of those pages.
#[pyclass(module = "gpu_rdma", name = "HostMemory")]
pub(crate) struct HostMemory {
    memfd: Arc<OwnedFd>,
    size: u64,
    base: usize,
    mapping: PyObject,
}

/// A writable buffer-protocol object's bytes, held: a ctypes array made with
/// `from_buffer` holds the object's buffer export (a `Py_buffer`) for as long as it lives,
/// so a `bytearray` cannot be resized nor its memory freed while the pin is held.
pub(crate) struct Pin {
    /// The ctypes array holding the export (released when the pin drops).
    pub _holder: PyObject,
    pub addr: usize,
    pub len: usize,
}

/// Pins `obj`'s bytes (a writable, C-contiguous buffer).
pub(crate) fn pin(obj: &Bound<'_, PyAny>) -> Result<Pin> {
    let py = obj.py();
    let refused = |why: String| {
        Failure::new(Class::InvalidInput, "register", format!("register: {why}"))
            .hinted("pass a writable, C-contiguous buffer (numpy array, bytearray, memoryview)")
    };
    let view = py
        .import("builtins")
        .and_then(|b| b.getattr("memoryview"))
        .and_then(|m| m.call1((obj,)))
        .map_err(|e| refused(format!("not a buffer: {e}")))?;
    let len: usize = view
        .getattr("nbytes")
        .and_then(|n| n.extract())
        .map_err(|e| refused(e.to_string()))?;
    // The view was for the size only: release its export now.
    let _ = view.call_method0("release");
    if len == 0 {
        return Err(refused("an empty buffer".into()));
    }
    let ctypes = py
        .import("ctypes")
        .map_err(|e| refused(format!("ctypes: {e}")))?;
    let holder = ctypes
        .getattr("c_char")
        .and_then(|c| c.call_method1("__mul__", (len,)))
        .and_then(|t| t.call_method1("from_buffer", (obj,)))
        .map_err(|e| refused(format!("a writable, C-contiguous buffer is needed: {e}")))?;
    let addr: usize = ctypes
        .call_method1("addressof", (&holder,))
        .and_then(|a| a.extract())
        .map_err(|e| refused(e.to_string()))?;
    Ok(Pin {
        _holder: holder.unbind(),
        addr,
        len,
    })
}

/// The dma-buf of `pin`'s pages when they are a `HostMemory`'s (a udmabuf of the same
/// memfd pages); `Unsupported` for memory another owner allocated.
pub(crate) fn export_pinned(pin: &Pin) -> Result<DmaBuf> {
    let page = drm_export::page_size() as usize;
    let found = mapped()
        .iter()
        .find(|m| pin.addr >= m.base && pin.addr + pin.len <= m.base + m.len)
        .map(|m| (pin.addr - m.base, m.memfd.clone()));
    let Some((offset, memfd)) = found else {
        return Err(Failure::new(
            Class::Unsupported,
            "register",
            format!(
                "register: {} bytes of host memory at {:#x} that gpu_rdma did not allocate",
                pin.len, pin.addr
            ),
        )
        .hinted(
            "rdma-dmabuf registers only host memory it allocates (no copy is made): allocate \
             with gpu_rdma.HostMemory(size) and view it with numpy.frombuffer(mem.buffer)",
        ));
    };
    if !offset.is_multiple_of(page) || !pin.len.is_multiple_of(page) {
        return Err(Failure::new(
            Class::InvalidInput,
            "register",
            format!(
                "register: {} bytes at offset {offset} of a HostMemory: a segment is whole \
                 {page}-byte pages",
                pin.len
            ),
        ));
    }
    Udmabuf::export(&*memfd, offset as u64, pin.len as u64)
        .map_err(|e| Failure::export("register", &e))
}

#[pymethods]
impl HostMemory {
    /// `size` bytes (a multiple of the page size), zero-filled.
    #[new]
    fn new(py: Python<'_>, size: u64) -> PyResult<HostMemory> {
        let memfd = drm_export::sealed_memfd(MemfdPages::Shmem, size)
            .map_err(|e| Failure::export("HostMemory", &e))?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&memfd);
        // Python's mmap duplicates the fd: the mapping lives as long as the mmap object.
        let mapping = py.import("mmap")?.getattr("mmap")?.call1((fd, size))?;
        let base = pin(&mapping)?.addr;
        mapped().push(Mapped {
            base,
            len: size as usize,
            memfd: Arc::new(memfd),
        });
        let memfd = mapped().last().map(|m| m.memfd.clone()).expect("pushed");
        Ok(HostMemory {
            memfd,
            size,
            base,
            mapping: mapping.unbind(),
        })
    }

    /// Its size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.size
    }

    /// The memory as a writable buffer (an `mmap.mmap`): `numpy.frombuffer(mem.buffer)`,
    /// `memoryview(mem.buffer)`.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> PyObject {
        self.mapping.clone_ref(py)
    }

    /// The address of its first byte in this process.
    #[getter]
    fn address(&self) -> usize {
        self.base
    }

    fn __len__(&self) -> usize {
        self.size as usize
    }

    fn __repr__(&self) -> String {
        format!("HostMemory(size={})", self.size)
    }
}

impl HostMemory {
    /// A udmabuf of all of it.
    pub(crate) fn export(&self) -> Result<DmaBuf> {
        Udmabuf::export(&*self.memfd, 0, self.size).map_err(|e| Failure::export("register", &e))
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        mapped().retain(|m| !Arc::ptr_eq(&m.memfd, &self.memfd));
    }
}
