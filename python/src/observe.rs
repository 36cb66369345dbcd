//! What an operator reads from an `Agent`: its metrics (a dict, or the Prometheus text), the
//! control listener's counters, and a bounded wait for a peer; and the engine's traces on
//! stderr when `GPU_RDMA_LOG` asks for them.

use crate::agent::Agent;
use crate::errors::{Failure, Result};
use crate::transfer::bound;
use gpu_rdma_engine::{ControlStats, Histogram, Metrics};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

/// The environment variable whose filter (`RUST_LOG`'s syntax: `info`,
/// `gpu_rdma_engine=debug`, ...) prints the engine's traces on stderr.
const LOG_ENV: &str = "GPU_RDMA_LOG";

/// Tells the user on stderr (a closed stderr is no error: it is only a warning).
fn say(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "gpu_rdma: {what}");
}

/// Prints the engine's traces on stderr when [`LOG_ENV`] is set (at import). A process
/// that already installed a `tracing` subscriber keeps its own.
pub(crate) fn init_traces() {
    let filter = match std::env::var(LOG_ENV) {
        Ok(f) => f,
        Err(std::env::VarError::NotPresent) => return,
        // Set but unreadable: said, never taken as unset silently.
        Err(std::env::VarError::NotUnicode(v)) => {
            say(&format!("{LOG_ENV}={v:?} is not UTF-8; no traces"));
            return;
        }
    };
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = match tracing_subscriber::EnvFilter::try_new(&filter) {
        Ok(f) => f,
        Err(e) => {
            say(&format!(
                "{LOG_ENV}={filter:?} is not a filter ({e}); no traces"
            ));
            return;
        }
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .finish()
        .try_init();
}

/// A histogram as a dict: `count`, `sum` (seconds), `buckets` (a list of `(upper bound in
/// seconds, count)`, the last bound `inf`; counts not cumulative).
fn histogram<'py>(py: Python<'py>, h: &Histogram) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("count", h.count)?;
    d.set_item("sum", h.sum.as_secs_f64())?;
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|&(b, n)| (b.map_or(f64::INFINITY, |b| b.as_secs_f64()), n))
        .collect();
    d.set_item("buckets", buckets)?;
    Ok(d)
}

/// Sets each `(key, count)` of `counts` in `d`.
fn set_counts(d: &Bound<'_, PyDict>, counts: &[(&str, u64)]) -> PyResult<()> {
    for (k, v) in counts {
        d.set_item(k, v)?;
    }
    Ok(())
}

/// The control listener's counters as a dict.
pub(crate) fn control<'py>(py: Python<'py>, s: &ControlStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    set_counts(
        &d,
        &[
            ("accepted", s.accepted),
            ("authenticated", s.authenticated),
            ("unauthenticated", s.unauthenticated),
            ("bad_proofs", s.bad_proofs),
            ("failed_handshakes", s.failed_handshakes),
            ("handshakes_dropped", s.handshakes_dropped),
            ("connections_refused", s.connections_refused),
            ("queue_pairs_refused", s.queue_pairs_refused),
            ("notifications_refused", s.notifications_refused),
            ("requests_too_large", s.requests_too_large),
            ("idle_closed", s.idle_closed),
            ("accept_errors", s.accept_errors),
            ("open_connections", s.open_connections),
            ("queue_pairs", s.queue_pairs),
        ],
    )?;
    Ok(d)
}

/// The engine's [`Metrics`] as a dict of plain values.
fn metrics<'py>(py: Python<'py>, m: &Metrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let rails = PyList::empty(py);
    for r in &m.rails {
        let e = PyDict::new(py);
        e.set_item("peer", &r.peer)?;
        e.set_item("local_device", &r.local_device)?;
        e.set_item("remote_device", r.remote_device)?;
        e.set_item("write_bytes", r.write_bytes)?;
        e.set_item("write_requests", r.write_requests)?;
        e.set_item("read_bytes", r.read_bytes)?;
        e.set_item("read_requests", r.read_requests)?;
        e.set_item("errors", r.errors)?;
        rails.append(e)?;
    }
    d.set_item("rails", rails)?;
    let errors = PyDict::new(py);
    for (status, n) in &m.completion_errors {
        errors.set_item(status, n)?;
    }
    d.set_item("completion_errors", errors)?;
    set_counts(
        &d,
        &[
            ("failovers", m.failovers),
            ("rails_marked_down", m.rails_marked_down),
            ("rails_down", m.rails_down),
            ("peers_marked_down", m.peers_marked_down),
            ("batches", m.batches),
            ("entries_done", m.entries_done),
            ("entries_failed", m.entries_failed),
            ("queue_pairs", m.queue_pairs),
            ("in_flight", m.in_flight),
            ("segments", m.segments as u64),
        ],
    )?;
    d.set_item("chunk_latency", histogram(py, &m.chunk_latency)?)?;
    d.set_item("batch_latency", histogram(py, &m.batch_latency)?)?;
    let caches = PyDict::new(py);
    for (device, c) in &m.caches {
        let e = PyDict::new(py);
        set_counts(
            &e,
            &[
                ("hits", c.hits),
                ("misses", c.misses),
                ("evictions", c.evictions),
                ("invalidations", c.invalidations),
                ("entries", c.entries as u64),
                ("checked_out", c.checked_out as u64),
                ("bytes", c.bytes),
            ],
        )?;
        caches.set_item(device, e)?;
    }
    d.set_item("caches", caches)?;
    let md = PyDict::new(py);
    let md_counts = &m.metadata;
    set_counts(
        &md,
        &[
            ("lookups", md_counts.lookups),
            ("lookup_failures", md_counts.lookup_failures),
            ("publishes", md_counts.publishes),
            ("publish_failures", md_counts.publish_failures),
        ],
    )?;
    d.set_item("metadata", md)?;
    d.set_item("control", control(py, &m.control)?)?;
    Ok(d)
}

#[pymethods]
impl Agent {
    /// The engine's counters since the agent started, as a dict (docs/python.md,
    /// "Metrics"): `rails` (per peer and device pair: bytes and requests by op, errors),
    /// `completion_errors` by status, `failovers`, `rails_marked_down`, `rails_down`,
    /// `peers_marked_down`, `batches`, `entries_done`, `entries_failed`, `chunk_latency`
    /// and `batch_latency` histograms, `queue_pairs`, `in_flight`, `segments`, `caches`,
    /// `metadata` and `control`.
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let m = self.engine("metrics")?.metrics();
        metrics(py, &m)
    }

    /// `metrics()` in the OpenMetrics text format Prometheus scrapes (for a program that
    /// serves its own `/metrics`).
    fn metrics_text(&self) -> PyResult<String> {
        Ok(self.engine("metrics_text")?.metrics_text())
    }

    /// Where the Prometheus endpoint listens (`"ip:port"`, from `Agent(...,
    /// metrics_address=)`), or None.
    #[getter]
    fn metrics_address(&self) -> PyResult<Option<String>> {
        let a = self.engine("metrics_address")?.metrics_address();
        Ok(a.map(|a| a.to_string()))
    }

    /// What the control listener accepted and refused since the agent started (a dict of
    /// counts: `accepted`, `authenticated`, `unauthenticated`, `bad_proofs`, refusals at
    /// each limit, `open_connections`, `queue_pairs`, ...).
    fn control_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.engine("control_stats")?.control_stats();
        control(py, &s)
    }

    /// Waits at most `timeout` seconds until agent `name` is known and answers (the
    /// embedded metadata service: named with `add_peer`; etcd: once it published), with
    /// the GIL released. Raises `Timeout` with the last look-up's cause.
    fn wait_for_peer(&self, py: Python<'_>, name: &str, timeout: f64) -> PyResult<()> {
        let wait = bound("wait_for_peer", timeout)?;
        let agent = self.engine("wait_for_peer")?;
        let r: Result<()> = py.allow_threads(|| {
            agent
                .wait_for_peer(name, wait)
                .map(drop)
                .map_err(|e| Failure::engine("wait_for_peer", &e))
        });
        Ok(r?)
    }
}
