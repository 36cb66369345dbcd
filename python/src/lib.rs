//! `gpu_rdma._native`: the Python package `gpu_rdma` over the transfer engine
//! ([`gpu_rdma_engine`]) and the exporters ([`drm_export`]), built with PyO3 for the stable
//! ABI of CPython 3.9 and newer. The Python-facing documentation is docs/python.md and the
//! stubs in `python/gpu_rdma/_native.pyi`.
//!
//! * `agent`: `Agent` (register, unregister, transfer, notifications) and what each segment
//!   holds of its Python object while registered.
//! * `memory`: `DmaBuf`, the exporters (`udmabuf`, `dma_heap`, `vgem`) and `dmabuf_from_fd`.
//! * `dlpack`: tensors exported with DLPack (`__dlpack__`), read as one range.
//! * `host`: `HostMemory` and the pinning of buffer-protocol objects.
//! * `transfer`: `Batch`, `Transfer` (bounded waits with the GIL released, asyncio
//!   awaitables, each entry's `EntryStatus`), `Notification`.
//! * `observe`: `Agent.metrics`, `metrics_text`, `control_stats`, `wait_for_peer`, and the
//!   engine's traces on stderr (`GPU_RDMA_LOG`).
//! * `awaiting`: asyncio futures of transfers, settled from the engine on one waiting thread.
//! * `devices`: the RDMA devices an agent would open, checked before its metadata service.
//! * `etcd`: the metadata service an agent starts with (embedded, HTTP, or etcd).
//! * `by_address`: memory registered by address (Mooncake's way), segment tables, and
//!   `MetadataServer`.
//! * `cuda_array`: CUDA tensors with `__cuda_array_interface__`, on the GPU their
//!   `__dlpack_device__` names, and the GPU of `register_cuda`.
//! * `errors`: the exception hierarchy (classes of `gpu_rdma/_errors.py`) and `Failure`,
//!   an error with its fields on its way to Python.
//! * `failures`: the engine's, rdma-dmabuf's and drm-export's errors as `Failure`s, field by
//!   field.
//! * `sys`: the raw layer: CPython's buffer protocol, DLPack capsules, the duplicate of an
//!   fd number, behind safe functions and owned types.

// Unsafe code: only in the raw layer, `sys` (the C buffer protocol's export and release of a
// buffer, the reading and taking of a DLPack capsule's tensor and its deleter, the duplicate
// of an fd number), and the registration of a pinned buffer in place
// (`host::foreign_buffer`) or by address (`host::address_buffer`), calls of the public
// `unsafe fn` `HostBuffer::from_foreign`.
#![deny(unsafe_code)]

mod agent;
mod awaiting;
mod by_address;
mod cuda_array;
mod devices;
mod dlpack;
mod errors;
mod etcd;
mod failures;
mod host;
mod memory;
mod observe;
mod sys;
mod transfer;

use pyo3::prelude::*;

/// The module `gpu_rdma._native` (re-exported by the package `gpu_rdma`).
#[pymodule]
#[pyo3(name = "_native")]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    observe::init_traces();
    errors::add(m)?;
    transfer::add(m)?;
    m.add_class::<agent::Agent>()?;
    m.add_class::<memory::PyDmaBuf>()?;
    m.add_class::<host::HostMemory>()?;
    m.add_class::<transfer::Batch>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<transfer::Notification>()?;
    m.add_class::<by_address::MetadataServer>()?;
    m.add_function(wrap_pyfunction!(memory::udmabuf, m)?)?;
    m.add_function(wrap_pyfunction!(memory::dma_heap, m)?)?;
    m.add_function(wrap_pyfunction!(memory::vgem, m)?)?;
    m.add_function(wrap_pyfunction!(memory::dmabuf_from_fd, m)?)?;
    m.add("MAX_NOTIFICATION", gpu_rdma_engine::MAX_NOTIFICATION)?;
    Ok(())
}
