//! `Agent`: the engine's agent, its segments and what keeps each segment's Python memory
//! alive while registered.

use crate::cuda_array::{cuda_array, cuda_device, register_ordinal};
use crate::dlpack;
use crate::errors::{cuda_name, Class, Failure, Result};
use crate::host::{foreign_buffer, is_buffer, pin, HostMemory, Pin};
use crate::memory::{from_fd, PyDmaBuf};
use crate::transfer::{address, bound, Batch, Notification, Transfer};
use gpu_rdma_engine::{Agent as EngineAgent, Memory, Settings};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// What a registered segment holds on the Python side.
enum Held {
    /// A `DmaBuf` object, given its dma-buf back when unregistered.
    DmaBuf(Py<PyDmaBuf>),
    /// The object registered (a `HostMemory`, a buffer object, a CUDA tensor's owner); a
    /// buffer's pinned export is held by the segment's `HostBuffer` itself.
    Object(PyObject),
    /// A DLPack tensor's object (handed back when unregistered) and the owner of the tensor
    /// taken from its capsule (which calls the producer's deleter when dropped; let go after
    /// the memory is deregistered).
    Tensor(PyObject, PyObject),
    /// A dma-buf from an `int` fd (a duplicate of it): handed back as a new `DmaBuf`.
    Fd,
}

/// A transfer engine agent: one per process. Peers find its segments through the metadata
/// service (the embedded one: name peers with `add_peer`).
///
/// `Agent(name, devices=None, bind="0.0.0.0:0", chunk_size=None, in_flight=None,
/// queue_pairs=None, workers=None, io_timeout=None)`: `devices` are RDMA device names
/// (default: every device with an active port); `io_timeout` bounds each control-channel
/// connect, request and reply (seconds). `etcd=["http://host:2379"]` uses etcd as the
/// metadata service instead of the embedded one (keys under `etcd_prefix`, default
/// `/gpu-rdma`, with a lease of `etcd_lease_ttl` seconds, default 5); `Unsupported` in a build
/// without the `etcd` feature. `metrics=False` stops the per-chunk counting of `metrics()`;
/// `metrics_address="127.0.0.1:9464"` serves them to Prometheus at `/metrics`.
#[pyclass(module = "gpu_rdma", name = "Agent", frozen)]
pub(crate) struct Agent {
    /// The agent's name, kept for the error of a closed agent.
    name: String,
    agent: Mutex<Option<Arc<EngineAgent>>>,
    segments: Mutex<HashMap<String, Held>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A DLPack tensor (one that is not a buffer: a torch tensor, a JAX array) registered in
/// place, its capsule consumed: host memory through `HostBuffer::from_foreign` holding the
/// tensor's owner (which holds the producer object too), CUDA memory as a CUDA range; the
/// segment holds the object and the owner as well.
fn dlpack_memory(obj: &Bound<'_, PyAny>) -> Result<(Memory, Held, Option<String>)> {
    let py = obj.py();
    let t = dlpack::tensor(obj)?;
    let memory = match t.place {
        dlpack::Place::Cuda(ordinal) => Memory::Cuda {
            device: cuda_device(py, "register", ordinal)?,
            ptr: t.addr,
            len: t.len,
        },
        dlpack::Place::Host => {
            let addr = usize::try_from(t.addr).map_err(|_| {
                Failure::new(
                    Class::InvalidInput,
                    "register",
                    "register: __dlpack__: an address past usize".to_string(),
                )
            })?;
            let pin = Pin {
                _holder: t.owner.clone_ref(py),
                addr,
                len: t.len as usize,
            };
            Memory::Host(foreign_buffer(pin)?)
        }
    };
    let gpu = match t.place {
        dlpack::Place::Cuda(ordinal) => Some(cuda_name(ordinal)),
        dlpack::Place::Host => None,
    };
    Ok((memory, Held::Tensor(obj.clone().unbind(), t.owner), gpu))
}

impl Agent {
    pub(crate) fn engine(&self, op: &str) -> Result<Arc<EngineAgent>> {
        lock(&self.agent)
            .clone()
            .ok_or_else(|| Failure::closed(op, &self.name))
    }

    /// The engine's memory for `obj`, and what the segment must hold.
    fn memory(&self, name: &str, obj: &Bound<'_, PyAny>) -> Result<(Memory, Held, Option<String>)> {
        if let Ok(d) = obj.downcast::<PyDmaBuf>() {
            let dmabuf = d.borrow_mut().lend(name)?;
            return Ok((
                Memory::DmaBuf(dmabuf),
                Held::DmaBuf(d.clone().unbind()),
                None,
            ));
        }
        if let Ok(h) = obj.downcast::<HostMemory>() {
            let dmabuf = h.borrow().export()?;
            return Ok((
                Memory::DmaBuf(dmabuf),
                Held::Object(obj.clone().unbind()),
                None,
            ));
        }
        if obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>() {
            let fd: i32 = obj.extract().map_err(|e| {
                Failure::new(
                    Class::InvalidInput,
                    "register",
                    format!("register: fd: {e}"),
                )
            })?;
            return Ok((Memory::DmaBuf(from_fd(fd)?), Held::Fd, None));
        }
        if let Some((ptr, len, ordinal)) = cuda_array(obj)? {
            let device = cuda_device(obj.py(), "register", ordinal)?;
            let memory = Memory::Cuda { device, ptr, len };
            let gpu = Some(cuda_name(ordinal));
            return Ok((memory, Held::Object(obj.clone().unbind()), gpu));
        }
        if obj.hasattr("__dlpack__").unwrap_or(false) && !is_buffer(obj) {
            return dlpack_memory(obj);
        }
        // Any other writable buffer: registered in place (no copy), its export held by the
        // segment's buffer until it is unregistered.
        let buffer = foreign_buffer(pin(obj)?)?;
        Ok((
            Memory::Host(buffer),
            Held::Object(obj.clone().unbind()),
            None,
        ))
    }

    /// Registers `memory` as segment `name`; a failure names the segment, and `gpu`, the
    /// GPU of CUDA memory (`cuda:N`), where the engine's error names none.
    fn insert(
        &self,
        py: Python<'_>,
        op: &str,
        name: &str,
        memory: Memory,
        held: Held,
        gpu: Option<String>,
    ) -> PyResult<u64> {
        let agent = self.engine(op)?;
        let owned = name.to_string();
        match py.allow_threads(move || agent.register(&owned, memory)) {
            Ok(desc) => {
                lock(&self.segments).insert(name.to_string(), held);
                Ok(desc.len)
            }
            Err(e) => {
                // The engine dropped the memory: a DmaBuf object is closed now.
                if let Held::DmaBuf(d) = held {
                    d.borrow_mut(py).restore_none();
                }
                let mut f = Failure::engine(op, &e);
                f.about.segment.get_or_insert_with(|| name.to_string());
                if let Some(gpu) = gpu {
                    f = f.with_device(gpu);
                }
                Err(f.into())
            }
        }
    }

    /// Refuses `name` when a segment of this object has it, as the engine would
    /// (`SegmentExists`), before the memory is taken from its object.
    fn check_free(&self, op: &str, name: &str) -> Result<()> {
        if lock(&self.segments).contains_key(name) {
            let e = gpu_rdma_engine::Error::SegmentExists(name.to_string());
            return Err(Failure::engine(op, &e));
        }
        Ok(())
    }
}

#[pymethods]
impl Agent {
    #[new]
    #[pyo3(signature = (name, devices = None, bind = "0.0.0.0:0", chunk_size = None,
        in_flight = None, queue_pairs = None, workers = None, io_timeout = None, etcd = None,
        etcd_prefix = None, etcd_lease_ttl = None, metadata_server = None, metrics = true,
        metrics_address = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        devices: Option<Vec<String>>,
        bind: &str,
        chunk_size: Option<u64>,
        in_flight: Option<u32>,
        queue_pairs: Option<u32>,
        workers: Option<u32>,
        io_timeout: Option<f64>,
        etcd: Option<Vec<String>>,
        etcd_prefix: Option<String>,
        etcd_lease_ttl: Option<f64>,
        metadata_server: Option<String>,
        metrics: bool,
        metrics_address: Option<&str>,
    ) -> PyResult<Agent> {
        let mut s = Settings::default();
        s.devices = devices;
        s.bind = address("Agent", bind)?;
        s.chunk_size = chunk_size.unwrap_or(s.chunk_size);
        s.in_flight = in_flight.unwrap_or(s.in_flight);
        s.queue_pairs = queue_pairs.unwrap_or(s.queue_pairs);
        s.workers = workers.unwrap_or(s.workers);
        s.metrics = metrics;
        if let Some(m) = metrics_address {
            s.metrics_address = Some(address("Agent", m)?);
        }
        if let Some(t) = io_timeout {
            s.io_timeout = bound("Agent", t)?;
        }
        let metadata =
            crate::etcd::Metadata::new(etcd, etcd_prefix, etcd_lease_ttl, metadata_server)?;
        crate::awaiting::start_in_background();
        let owned = name.to_string();
        let agent = py.allow_threads(move || {
            // Before any metadata service is connected to: no device is `Unsupported` now.
            crate::devices::check(s.devices.as_deref())?;
            metadata
                .start(&owned, s)
                .map_err(|e| Failure::engine("Agent", &e))
        })?;
        Ok(Agent {
            name: name.to_string(),
            agent: Mutex::new(Some(Arc::new(agent))),
            segments: Mutex::default(),
        })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> PyResult<String> {
        Ok(self.engine("name")?.name().to_string())
    }

    /// The control listener's address, `"ip:port"` (peers pass it to `add_peer`).
    #[getter]
    fn address(&self) -> PyResult<String> {
        Ok(self.engine("address")?.address().to_string())
    }

    /// The RDMA devices in use.
    #[getter]
    fn devices(&self) -> PyResult<Vec<String>> {
        Ok(self.engine("devices")?.devices())
    }

    /// This start's random incarnation.
    #[getter]
    fn incarnation(&self) -> PyResult<u64> {
        Ok(self.engine("incarnation")?.incarnation())
    }

    /// The names of the segments registered through this object.
    fn segments(&self) -> PyResult<Vec<String>> {
        self.engine("segments")?;
        let mut v: Vec<String> = lock(&self.segments).keys().cloned().collect();
        v.sort();
        Ok(v)
    }

    /// Names peer `name` and its control address `"ip:port"`.
    fn add_peer(&self, name: &str, address: &str) -> PyResult<()> {
        let addr = crate::transfer::address("add_peer", address)?;
        self.engine("add_peer")?.add_peer(name, addr);
        Ok(())
    }

    /// This agent's card (bytes): its control address as peers reach it and its
    /// descriptor, versioned. Hand it to a peer out of band; the peer loads it with
    /// `add_peer_card` (NIXL's agent metadata). `segments=False`: the descriptor's segments
    /// left out, a card of a few dozen bytes that names the agent as well.
    #[pyo3(signature = (segments = true))]
    fn card<'py>(
        &self,
        py: Python<'py>,
        segments: bool,
    ) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let a = self.engine("card")?;
        let c = if segments { a.card() } else { a.name_card() };
        let c = c.map_err(|e| Failure::engine("card", &e))?;
        Ok(pyo3::types::PyBytes::new(py, &c))
    }

    /// Loads a peer's card (`card`), names the peer as `add_peer` does and returns its
    /// name. A card of another format version, or bytes that are not a whole card, raise
    /// `Incompatible`.
    fn add_peer_card(&self, card: &[u8]) -> PyResult<String> {
        self.engine("add_peer_card")?
            .add_peer_card(card)
            .map_err(|e| Failure::engine("add_peer_card", &e).into())
    }

    /// Forgets peer `name` (its address, cached descriptor and notification connection):
    /// batches naming it fail with `NotFound` until it is named again.
    fn remove_peer(&self, name: &str) -> PyResult<()> {
        self.engine("remove_peer")?.remove_peer(name);
        Ok(())
    }

    /// Registers `memory` whole as segment `name`, readable and writable by peers; returns
    /// its length. `memory`: a `DmaBuf` (moved into the segment until `unregister`), a
    /// `HostMemory`, a writable buffer over a `HostMemory`'s whole pages (a numpy array, a
    /// `memoryview`), an `int` dma-buf fd (duplicated; the caller keeps its own), or a
    /// contiguous CUDA array with `__cuda_array_interface__` (a torch tensor, on the GPU its
    /// `__dlpack_device__()` names, GPU 0 without one). The segment holds a reference to the
    /// object, and a buffer's export, until unregistered.
    fn register(&self, py: Python<'_>, name: &str, memory: &Bound<'_, PyAny>) -> PyResult<u64> {
        self.engine("register")?;
        self.check_free("register", name)?;
        let (memory, held, gpu) = self.memory(name, memory)?;
        self.insert(py, "register", name, memory, held, gpu)
    }

    /// Finds the agent listening at `address` (`"ip:port"`) by its address alone, names it
    /// as `add_peer` does, and returns its name (Mooncake's P2P handshake).
    fn add_peer_at(&self, py: Python<'_>, address: &str) -> PyResult<String> {
        let addr = crate::transfer::address("add_peer_at", address)?;
        let agent = self.engine("add_peer_at")?;
        py.allow_threads(move || agent.add_peer_at(addr))
            .map_err(|e| Failure::engine("add_peer_at", &e).into())
    }

    /// Registers the `size` bytes at `address` of this process's memory as segment `name`
    /// (peers name them by address: `Batch.write_at`); returns where the memory is, `"cpu"`
    /// or `"cuda:N"`. `location`: `"*"`
    /// (CUDA device memory if the driver knows the address, else host memory), `"cpu"`, or
    /// `"cuda:N"`. The caller promises, as with Mooncake's `register_memory`, that the
    /// memory stays allocated until `unregister`: the engine cannot tell. The segment holds
    /// `owner` until then.
    #[pyo3(signature = (name, address, size, location = "*", owner = None))]
    fn register_address(
        &self,
        py: Python<'_>,
        name: &str,
        address: u64,
        size: u64,
        location: &str,
        owner: Option<PyObject>,
    ) -> PyResult<String> {
        self.engine("register_address")?;
        self.check_free("register_address", name)?;
        let (memory, found) = crate::by_address::memory(py, address, size, location)?;
        let owner = owner.unwrap_or_else(|| py.None());
        let gpu = found.starts_with("cuda:").then(|| found.clone());
        self.insert(
            py,
            "register_address",
            name,
            memory,
            Held::Object(owner),
            gpu,
        )?;
        Ok(found)
    }

    /// The segments of this agent (`agent=None`) or of agent `agent` (asked of the metadata
    /// service): `(name, base address or None, length)` each, in name order. A segment has
    /// a base address when registered from host or CUDA memory.
    #[pyo3(signature = (agent = None))]
    fn describe(
        &self,
        py: Python<'_>,
        agent: Option<&str>,
    ) -> PyResult<Vec<(String, Option<u64>, u64)>> {
        let a = self.engine("describe")?;
        let d = match agent {
            None => a.descriptor(),
            Some(peer) => py
                .allow_threads(move || a.peer_descriptor(peer))
                .map_err(|e| Failure::engine("describe", &e))?,
        };
        Ok(crate::by_address::table(&d))
    }

    /// Registers `[ptr, ptr + size)` of GPU `device`'s memory (a tensor's `data_ptr()` and
    /// byte size) as segment `name`; the segment holds a reference to `owner` (the tensor)
    /// until unregistered. `device` left out: the owner's GPU, where its
    /// `__dlpack_device__()` names one, else GPU 0; a `device` that differs from the owner's
    /// is refused (`InvalidInput`). `Unsupported` without CUDA.
    #[pyo3(signature = (name, ptr, size, device = None, owner = None))]
    fn register_cuda(
        &self,
        py: Python<'_>,
        name: &str,
        ptr: u64,
        size: u64,
        device: Option<i32>,
        owner: Option<PyObject>,
    ) -> PyResult<u64> {
        let op = "register_cuda";
        self.engine(op)?;
        self.check_free(op, name)?;
        let ordinal = register_ordinal(owner.as_ref().map(|o| o.bind(py)), device)?;
        let memory = Memory::Cuda {
            device: cuda_device(py, op, ordinal)?,
            ptr,
            len: size,
        };
        let owner = owner.unwrap_or_else(|| py.None());
        let gpu = Some(cuda_name(ordinal));
        self.insert(py, op, name, memory, Held::Object(owner), gpu)
    }

    /// Unregisters segment `name` (refused with `Busy` while a transfer uses it) and returns
    /// what was registered: the `DmaBuf` (readable again), the `HostMemory` or buffer
    /// object, a new `DmaBuf` for an `int` fd, the owner of a CUDA range.
    fn unregister(&self, py: Python<'_>, name: &str) -> PyResult<PyObject> {
        let agent = self.engine("unregister")?;
        if !lock(&self.segments).contains_key(name) {
            let e = gpu_rdma_engine::Error::UnknownSegment {
                agent: agent.name().to_string(),
                segment: name.to_string(),
            };
            return Err(Failure::engine("unregister", &e).into());
        }
        let owned = name.to_string();
        let memory = py
            .allow_threads(move || agent.unregister(&owned))
            .map_err(|e| Failure::engine("unregister", &e))?;
        let held = lock(&self.segments).remove(name);
        Ok(match (held, memory) {
            (Some(Held::DmaBuf(d)), Memory::DmaBuf(m)) => {
                d.borrow_mut(py).restore(m);
                d.into_any()
            }
            (Some(Held::Fd), Memory::DmaBuf(m)) => Py::new(py, PyDmaBuf::wrap(m))?.into_any(),
            (Some(Held::Object(o)), m) => {
                // Deregistered: the memory goes (a udmabuf, or the buffer holding the
                // object's export), and the object is handed back.
                drop(m);
                o
            }
            (Some(Held::Tensor(o, owner)), m) => {
                // Deregistered first: only then may the producer's deleter run.
                drop(m);
                drop(owner);
                o
            }
            (_, m) => {
                drop(m);
                py.None()
            }
        })
    }

    /// Submits `batch`: every entry is checked against both segments first (`InvalidInput`,
    /// `NotFound`), then posted. Returns at once; wait on the `Transfer`.
    fn transfer(&self, py: Python<'_>, batch: &Batch) -> PyResult<Transfer> {
        let agent = self.engine("transfer")?;
        let b = &batch.inner;
        let t = py
            .allow_threads(move || agent.transfer(b))
            .map_err(|e| Failure::engine("transfer", &e))?;
        Ok(Transfer { inner: Arc::new(t) })
    }

    /// The next notification, waiting at most `timeout` seconds (the GIL released); None if
    /// none came.
    fn wait_notification(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<Notification>> {
        let t = bound("wait_notification", timeout)?;
        let agent = self.engine("wait_notification")?;
        Ok(py
            .allow_threads(move || agent.wait_notification(t))
            .map(|n| Notification {
                sender: n.from,
                message: n.message,
            }))
    }

    /// Sends `message` (at most `MAX_NOTIFICATION` bytes) to agent `agent` on its own, with
    /// no transfer; returns once the peer queued it (the GIL released). The peer sees it as
    /// from this agent: the name its connection authenticated.
    fn notify(&self, py: Python<'_>, agent: &str, message: &[u8]) -> PyResult<()> {
        let a = self.engine("notify")?;
        py.allow_threads(move || a.notify(agent, message))
            .map_err(|e| Failure::engine("notify", &e).into())
    }

    /// An awaitable of `wait_notification(timeout)`, run in the event loop's executor.
    fn notification<'py>(slf: Bound<'py, Self>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        bound("notification", timeout)?;
        slf.get().engine("notification")?;
        let py = slf.py();
        let looped = py.import("asyncio")?.call_method0("get_running_loop")?;
        let wait = slf.getattr("wait_notification")?;
        looped.call_method1("run_in_executor", (py.None(), wait, timeout))
    }

    /// Shuts the agent down: its segments are deregistered and their Python objects let go
    /// (a registered `DmaBuf` is closed).
    fn close(&self, py: Python<'_>) {
        let agent = lock(&self.agent).take();
        if let Some(a) = agent {
            py.allow_threads(move || drop(a));
        }
        let held: Vec<Held> = lock(&self.segments).drain().map(|(_, h)| h).collect();
        for h in held {
            if let Held::DmaBuf(d) = h {
                d.borrow_mut(py).restore_none();
            }
        }
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
        match lock(&self.agent).as_ref() {
            Some(a) => format!(
                "Agent(name={:?}, address={:?})",
                a.name(),
                a.address().to_string()
            ),
            None => "Agent(closed)".into(),
        }
    }
}
