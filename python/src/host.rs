//! Host memory from Python: the pinning of buffer-protocol objects (a `bytearray`, a numpy
//! array, a `memoryview`, an `mmap`) registered in place, without a copy, as
//! `HostBuffer::from_foreign` over the pinned bytes; and `HostMemory`, page-aligned memory
//! a udmabuf can export (a sealed memfd mapped into the process), for segments that are
//! dma-bufs.

use crate::errors::{Class, Failure, Result};
use drm_export::{DmaBuf, MemfdPages, Udmabuf};
use pyo3::prelude::*;
use rdma_dmabuf::HostBuffer;
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::Arc;

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

/// Writable bytes of a Python object, held: for a buffer-protocol object, a ctypes array
/// made with `from_buffer` holds the object's buffer export (a `Py_buffer`) for as long as
/// it lives, so a `bytearray` cannot be resized nor its memory freed while the pin is held;
/// for a DLPack tensor, its unconsumed capsule (the producer frees the tensor only when the
/// capsule is destroyed).
pub(crate) struct Pin {
    /// What keeps the bytes allocated (released when the pin drops).
    pub _holder: PyObject,
    pub addr: usize,
    pub len: usize,
}

/// Whether `obj` has the buffer protocol (a `memoryview` of it can be made).
pub(crate) fn is_buffer(obj: &Bound<'_, PyAny>) -> bool {
    let view = obj
        .py()
        .import("builtins")
        .and_then(|b| b.getattr("memoryview"))
        .and_then(|m| m.call1((obj,)));
    match view {
        Ok(v) => {
            let _ = v.call_method0("release");
            true
        }
        Err(_) => false,
    }
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

/// The pinned bytes as a `HostBuffer` to register in place: the buffer holds the pin (and
/// with it the object's buffer export) until it drops, after every region over it is
/// deregistered.
#[allow(unsafe_code)] // HostBuffer::from_foreign: see the SAFETY comment
pub(crate) fn foreign_buffer(pin: Pin) -> Result<HostBuffer> {
    let (addr, len) = (pin.addr, pin.len);
    let ptr = NonNull::new(addr as *mut u8).ok_or_else(|| {
        Failure::new(
            Class::InvalidInput,
            "register",
            "register: a buffer at address 0".to_string(),
        )
    })?;
    // SAFETY: `addr..addr + len` are either the bytes of a writable, C-contiguous buffer
    // export (ctypes' `from_buffer`, held by `pin._holder`): while the export is held the
    // object cannot resize or free them (a `bytearray` refuses to resize, an `mmap` to close,
    // numpy keeps its data); or a contiguous host DLPack tensor whose unconsumed capsule
    // `pin._holder` holds (its producer frees the tensor only when the capsule is destroyed).
    // `pin` is the buffer's owner, dropped with it. No Rust reference to the bytes exists
    // outside the buffer (Python code reaches them through its own objects), and no slice of
    // them is ever made through it: the buffer goes straight to the engine as a segment,
    // which gives the CPU no access, and comes back from `unregister` only to be dropped.
    // What Python code does with the bytes meanwhile races only with the NIC, as in C.
    unsafe { HostBuffer::from_foreign(ptr, len, Box::new(pin)) }
        .map_err(|e| Failure::rdma("register", &e))
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
        Ok(HostMemory {
            memfd: Arc::new(memfd),
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
