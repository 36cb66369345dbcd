//! Memory named by address, as Mooncake names it: what `Agent.register_address` registers
//! (host memory, or CUDA memory the driver knows), the segment tables `Agent.describe`
//! returns, and `MetadataServer`, a server of Mooncake's HTTP metadata protocol.

use crate::errors::{cuda_name, Class, Failure, Result};
use crate::host::address_buffer;
use drm_export::cuda::CudaDevice;
use gpu_rdma_engine::{AgentDescriptor, Memory};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};

/// The most GPUs a wildcard location looks through for a device pointer.
const MAX_GPUS: i32 = 16;

/// The GPU `location` names (`"cuda:N"`), or for the wildcard `"*"` (and `"cpu..."`: none)
/// the GPU whose device memory `addr` is, if the CUDA driver knows it; `None` for host
/// memory.
fn cuda_of(addr: u64, location: &str) -> Result<Option<(Arc<CudaDevice>, i32)>> {
    let op = "register_address";
    if let Some(n) = location.strip_prefix("cuda:") {
        let ordinal: i32 = n.parse().map_err(|_| {
            Failure::new(
                Class::InvalidInput,
                op,
                format!("{op}: location {location:?}"),
            )
            .hinted("\"*\" (found from the address), \"cpu\", or \"cuda:<ordinal>\"")
        })?;
        let d = CudaDevice::open(ordinal)
            .map_err(|e| Failure::export(op, &e).with_device(cuda_name(ordinal)))?;
        return Ok(Some((d, ordinal)));
    }
    if location != "*" && !location.is_empty() {
        return Ok(None);
    }
    // No driver (a host without CUDA) or not device memory of any GPU: host memory.
    for ordinal in 0..MAX_GPUS {
        let Ok(d) = CudaDevice::open(ordinal) else {
            break;
        };
        if d.pointer_info(addr).is_ok() {
            return Ok(Some((d, ordinal)));
        }
    }
    Ok(None)
}

/// The engine's memory for `size` bytes at `addr` in `location` (see `cuda_of`), and where
/// it is: `"cpu"` or `"cuda:N"`.
pub(crate) fn memory(
    py: Python<'_>,
    addr: u64,
    size: u64,
    location: &str,
) -> Result<(Memory, String)> {
    match py.allow_threads(|| cuda_of(addr, location))? {
        Some((device, ordinal)) => Ok((
            Memory::Cuda {
                device,
                ptr: addr,
                len: size,
            },
            format!("cuda:{ordinal}"),
        )),
        None => Ok((Memory::Host(address_buffer(addr, size)?), "cpu".into())),
    }
}

/// `(name, base address or None, length)` of each segment of `d`, in name order.
pub(crate) fn table(d: &AgentDescriptor) -> Vec<(String, Option<u64>, u64)> {
    let mut t: Vec<_> = d
        .segments
        .iter()
        .map(|s| (s.name.clone(), s.base, s.len))
        .collect();
    t.sort();
    t
}

/// A server of Mooncake's HTTP metadata protocol (`GET`/`PUT`/`DELETE
/// /metadata?key=...`), in this process: `MetadataServer(bind="0.0.0.0:8080")`, its `url`
/// what agents (`Agent(..., metadata_server=url)`) and Mooncake's engines are given. It
/// serves until `close()` (or the end of a `with` block).
#[pyclass(module = "gpu_rdma", name = "MetadataServer", frozen)]
pub(crate) struct MetadataServer {
    inner: Mutex<Option<gpu_rdma_engine::MetadataServer>>,
    url: String,
    address: String,
}

#[pymethods]
impl MetadataServer {
    #[new]
    #[pyo3(signature = (bind = "0.0.0.0:8080"))]
    fn new(bind: &str) -> PyResult<MetadataServer> {
        let addr = crate::transfer::address("MetadataServer", bind)?;
        let s = gpu_rdma_engine::MetadataServer::start(addr)
            .map_err(|e| Failure::engine("MetadataServer", &e))?;
        Ok(MetadataServer {
            url: s.url(),
            address: s.addr().to_string(),
            inner: Mutex::new(Some(s)),
        })
    }

    /// `http://<address>/metadata`.
    #[getter]
    fn url(&self) -> String {
        self.url.clone()
    }

    /// The address it listens on, `"ip:port"`.
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Stops serving (what it held is gone).
    fn close(&self, py: Python<'_>) {
        let s = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        py.allow_threads(move || drop(s));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (_t = None, _v = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _t: Option<PyObject>,
        _v: Option<PyObject>,
        _tb: Option<PyObject>,
    ) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        format!("MetadataServer(url={:?})", self.url)
    }
}
