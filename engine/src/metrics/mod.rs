//! The engine's own counters ([`Agent::metrics`](crate::Agent::metrics)): what moved over
//! each rail, what failed and why, failovers, latencies, queue pairs, in-flight depth,
//! registration caches and metadata look-ups.
//!
//! The workers record with relaxed atomic adds into cells they look up once per pass over
//! a (round, segment) group (one short lock per rail), so a chunk costs two clock reads and
//! a few adds: no lock, no allocation ([`Settings::metrics`](crate::Settings::metrics)
//! turns the per-chunk part off).

pub(crate) mod endpoint;
mod histogram;
pub(crate) mod prometheus;

pub(crate) use histogram::AtomicHistogram;
pub use histogram::Histogram;

use crate::batch::Op;
use crate::limits::ControlStats;
use crate::metadata::lock;
use rdma_dmabuf::CacheStats;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one rail (peer, local device, remote device) moved, counted as its requests
/// complete.
#[derive(Default)]
pub(crate) struct RailCells {
    write_bytes: AtomicU64,
    write_requests: AtomicU64,
    read_bytes: AtomicU64,
    read_requests: AtomicU64,
    errors: AtomicU64,
}

impl RailCells {
    /// One request of `len` bytes completed successfully.
    pub fn done(&self, op: Op, len: u64) {
        let (bytes, requests) = match op {
            Op::Write => (&self.write_bytes, &self.write_requests),
            Op::Read => (&self.read_bytes, &self.read_requests),
        };
        bytes.fetch_add(len, Relaxed);
        requests.fetch_add(1, Relaxed);
    }

    /// One request completed in error.
    pub fn failed(&self) {
        self.errors.fetch_add(1, Relaxed);
    }
}

/// Each peer's rails' cells, by (local device index, remote device index).
type Rails = BTreeMap<String, BTreeMap<(u16, u16), Arc<RailCells>>>;

/// `ibv_wc_status` values counted one by one; larger ones are counted as the last.
const STATUSES: usize = 23;

/// The verbs' names of completion statuses (`IBV_WC_*`, without the prefix), by value.
const STATUS_NAMES: [&str; STATUSES] = [
    "SUCCESS",
    "LOC_LEN_ERR",
    "LOC_QP_OP_ERR",
    "LOC_EEC_OP_ERR",
    "LOC_PROT_ERR",
    "WR_FLUSH_ERR",
    "MW_BIND_ERR",
    "BAD_RESP_ERR",
    "LOC_ACCESS_ERR",
    "REM_INV_REQ_ERR",
    "REM_ACCESS_ERR",
    "REM_OP_ERR",
    "RETRY_EXC_ERR",
    "RNR_RETRY_EXC_ERR",
    "LOC_RDD_VIOL_ERR",
    "REM_INV_RD_REQ_ERR",
    "REM_ABORT_ERR",
    "INV_EECN_ERR",
    "INV_EEC_STATE_ERR",
    "FATAL_ERR",
    "RESP_TIMEOUT_ERR",
    "GENERAL_ERR",
    "OTHER",
];

/// The agent's counters, shared by its threads.
pub(crate) struct Recorder {
    /// Whether the workers count per chunk ([`Settings::metrics`](crate::Settings::metrics)).
    pub on: bool,
    rails: Mutex<Rails>,
    completion_errors: [AtomicU64; STATUSES],
    failovers: AtomicU64,
    rails_marked_down: AtomicU64,
    rails_down: AtomicI64,
    peers_marked_down: AtomicU64,
    batches: AtomicU64,
    entries_done: AtomicU64,
    entries_failed: AtomicU64,
    queue_pairs: AtomicI64,
    in_flight: AtomicI64,
    lookups: AtomicU64,
    lookup_failures: AtomicU64,
    publishes: AtomicU64,
    publish_failures: AtomicU64,
    /// From a chunk's post to its completion.
    pub chunk_latency: AtomicHistogram,
    /// From [`Agent::transfer`](crate::Agent::transfer) to the worker's end of the batch.
    pub batch_latency: AtomicHistogram,
}

impl Recorder {
    /// Counters at zero; `on`: whether the workers count per chunk.
    pub fn new(on: bool) -> Recorder {
        Recorder {
            on,
            rails: Mutex::default(),
            completion_errors: std::array::from_fn(|_| AtomicU64::new(0)),
            failovers: AtomicU64::new(0),
            rails_marked_down: AtomicU64::new(0),
            rails_down: AtomicI64::new(0),
            peers_marked_down: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            entries_done: AtomicU64::new(0),
            entries_failed: AtomicU64::new(0),
            queue_pairs: AtomicI64::new(0),
            in_flight: AtomicI64::new(0),
            lookups: AtomicU64::new(0),
            lookup_failures: AtomicU64::new(0),
            publishes: AtomicU64::new(0),
            publish_failures: AtomicU64::new(0),
            chunk_latency: AtomicHistogram::default(),
            batch_latency: AtomicHistogram::default(),
        }
    }

    /// The cells of rail (`peer`, `local`, `remote`), made on first use. Takes a lock (and
    /// allocates the first time only): once per rail and pass, never per chunk.
    pub fn rail(&self, peer: &str, local: u16, remote: u16) -> Arc<RailCells> {
        let mut rails = lock(&self.rails);
        let of_peer = match rails.get_mut(peer) {
            Some(r) => r,
            None => rails.entry(peer.into()).or_default(),
        };
        of_peer.entry((local, remote)).or_default().clone()
    }

    /// A request was posted (`Some(now)` to time it, when counting is on).
    pub fn posted(&self) -> Option<Instant> {
        self.on.then(|| {
            self.in_flight.fetch_add(1, Relaxed);
            Instant::now()
        })
    }

    /// A request posted at `posted` completed (with `status` when in error).
    pub fn completed(&self, posted: Option<Instant>, status: Option<u32>) {
        if let Some(at) = posted {
            self.in_flight.fetch_sub(1, Relaxed);
            self.chunk_latency.record(at.elapsed());
        }
        if let Some(s) = status {
            let k = usize::try_from(s).map_or(STATUSES - 1, |s| s.min(STATUSES - 1));
            self.completion_errors[k].fetch_add(1, Relaxed);
        }
    }

    /// `n` chunks moved off a failed rail onto another.
    pub fn failed_over(&self, n: u64) {
        self.failovers.fetch_add(n, Relaxed);
    }

    /// `newly` rails were marked down, and the number of rails left out changed by
    /// `down_now_delta`.
    pub fn rails_changed(&self, newly: u64, down_now_delta: i64) {
        self.rails_marked_down.fetch_add(newly, Relaxed);
        self.rails_down.fetch_add(down_now_delta, Relaxed);
    }

    /// A peer was marked down in a batch.
    pub fn peer_down(&self) {
        self.peers_marked_down.fetch_add(1, Relaxed);
    }

    /// A batch ended after `took`, with `done` entries done and `failed` failed.
    pub fn batch_ended(&self, took: Duration, done: u64, failed: u64) {
        self.batches.fetch_add(1, Relaxed);
        self.entries_done.fetch_add(done, Relaxed);
        self.entries_failed.fetch_add(failed, Relaxed);
        self.batch_latency.record(took);
    }

    /// Queue pairs made (positive) or destroyed (negative) by the workers.
    pub fn queue_pairs(&self, delta: i64) {
        self.queue_pairs.fetch_add(delta, Relaxed);
    }

    /// A look-up of a peer's descriptor in the metadata service, and whether it failed.
    pub fn looked_up(&self, failed: bool) {
        self.lookups.fetch_add(1, Relaxed);
        if failed {
            self.lookup_failures.fetch_add(1, Relaxed);
        }
    }

    /// A publication of the agent's descriptor, and whether it failed.
    pub fn published(&self, failed: bool) {
        self.publishes.fetch_add(1, Relaxed);
        if failed {
            self.publish_failures.fetch_add(1, Relaxed);
        }
    }

    /// Everything counted so far; `devices` names the device indices, `caches` and
    /// `control` are read by the caller.
    pub fn snapshot(
        &self,
        devices: &[String],
        caches: Vec<CacheStats>,
        control: ControlStats,
        segments: usize,
    ) -> Metrics {
        let name = |d: u16| devices.get(usize::from(d)).cloned().unwrap_or_default();
        let rails = lock(&self.rails)
            .iter()
            .flat_map(|(peer, of_peer)| of_peer.iter().map(move |(lr, c)| (peer, lr, c)))
            .map(|(peer, (l, r), c)| RailMetrics {
                peer: peer.clone(),
                local_device: name(*l),
                remote_device: *r,
                write_bytes: c.write_bytes.load(Relaxed),
                write_requests: c.write_requests.load(Relaxed),
                read_bytes: c.read_bytes.load(Relaxed),
                read_requests: c.read_requests.load(Relaxed),
                errors: c.errors.load(Relaxed),
            })
            .collect();
        let gauge = |g: &AtomicI64| u64::try_from(g.load(Relaxed)).unwrap_or(0);
        Metrics {
            rails,
            completion_errors: STATUS_NAMES
                .iter()
                .zip(&self.completion_errors)
                .map(|(n, c)| (*n, c.load(Relaxed)))
                .filter(|&(_, c)| c > 0)
                .collect(),
            failovers: self.failovers.load(Relaxed),
            rails_marked_down: self.rails_marked_down.load(Relaxed),
            rails_down: gauge(&self.rails_down),
            peers_marked_down: self.peers_marked_down.load(Relaxed),
            batches: self.batches.load(Relaxed),
            entries_done: self.entries_done.load(Relaxed),
            entries_failed: self.entries_failed.load(Relaxed),
            chunk_latency: self.chunk_latency.snapshot(),
            batch_latency: self.batch_latency.snapshot(),
            queue_pairs: gauge(&self.queue_pairs),
            in_flight: gauge(&self.in_flight),
            caches: devices.iter().cloned().zip(caches).collect(),
            metadata: MetadataMetrics {
                lookups: self.lookups.load(Relaxed),
                lookup_failures: self.lookup_failures.load(Relaxed),
                publishes: self.publishes.load(Relaxed),
                publish_failures: self.publish_failures.load(Relaxed),
            },
            control,
            segments,
        }
    }
}

/// What one rail moved: requests completed successfully, by op, and those in error.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RailMetrics {
    /// The peer.
    pub peer: String,
    /// The local device's name.
    pub local_device: String,
    /// The remote device's index in the peer's descriptor (its regions' `device`).
    pub remote_device: u16,
    /// Bytes of RDMA writes that completed successfully.
    pub write_bytes: u64,
    /// RDMA writes (chunks) that completed successfully.
    pub write_requests: u64,
    /// Bytes of RDMA reads that completed successfully.
    pub read_bytes: u64,
    /// RDMA reads (chunks) that completed successfully.
    pub read_requests: u64,
    /// Requests that completed in error (flushes included).
    pub errors: u64,
}

/// Look-ups and publications through the metadata service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MetadataMetrics {
    /// Look-ups of peers' descriptors (the embedded service's ask the peer; etcd's read
    /// its watch's copy).
    pub lookups: u64,
    /// Of which failed (unknown agent, unreachable, refused).
    pub lookup_failures: u64,
    /// Publications of this agent's descriptor (at each register and unregister).
    pub publishes: u64,
    /// Of which failed.
    pub publish_failures: u64,
}

/// The agent's counters since it started ([`Agent::metrics`](crate::Agent::metrics)); the
/// same as the Prometheus endpoint's ([`Settings::metrics_address`](crate::Settings::metrics_address)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metrics {
    /// Per rail (peer, local device, remote device) that carried a request, in order.
    pub rails: Vec<RailMetrics>,
    /// Completions in error by their status (`IBV_WC_*` without the prefix, e.g.
    /// `"RETRY_EXC_ERR"`, `"WR_FLUSH_ERR"`, `"REM_ACCESS_ERR"`), those seen only.
    pub completion_errors: Vec<(&'static str, u64)>,
    /// Chunks moved off a failed rail onto another of the same peer.
    pub failovers: u64,
    /// Times a rail was marked down (a failure in a batch, not a rail already left out).
    pub rails_marked_down: u64,
    /// Rails left out of batches now (waiting for their probe, [`Settings::rail_probe_after`](crate::Settings::rail_probe_after)).
    pub rails_down: u64,
    /// Times a peer was marked down in a batch (unreachable, restarted, refused, or every
    /// rail to it failed).
    pub peers_marked_down: u64,
    /// Batches the workers finished.
    pub batches: u64,
    /// Their entries that ended done.
    pub entries_done: u64,
    /// Their entries that ended failed.
    pub entries_failed: u64,
    /// From a chunk's post to its completion (with [`Settings::metrics`](crate::Settings::metrics) on).
    pub chunk_latency: Histogram,
    /// From [`Agent::transfer`](crate::Agent::transfer) to the worker's end of the batch.
    pub batch_latency: Histogram,
    /// Queue pairs the workers hold to peers now (those the control listener made for
    /// peers are `control.queue_pairs`).
    pub queue_pairs: u64,
    /// Requests posted and not yet completed now (with [`Settings::metrics`](crate::Settings::metrics) on).
    pub in_flight: u64,
    /// Each device's registration cache ([`Agent::cache_stats`](crate::Agent::cache_stats)), by device name.
    pub caches: Vec<(String, CacheStats)>,
    /// The metadata service's use.
    pub metadata: MetadataMetrics,
    /// The control listener's ([`Agent::control_stats`](crate::Agent::control_stats)).
    pub control: ControlStats,
    /// Segments registered now.
    pub segments: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the workers add per chunk with metrics on, timed alone on the host (a figure
    /// for docs/engine.md, not a gate: run with `cargo test --release -p gpu-rdma-engine
    /// --lib per_chunk_recording -- --ignored --nocapture`).
    #[test]
    #[ignore = "a measurement, run by hand in release"]
    fn per_chunk_recording_costs_nanoseconds() {
        let rec = Recorder::new(true);
        let cells = rec.rail("peer", 0, 0);
        const N: u32 = 2_000_000;
        let start = Instant::now();
        for _ in 0..N {
            let posted = std::hint::black_box(rec.posted());
            rec.completed(posted, None);
            cells.done(Op::Write, 65536);
        }
        let per = start.elapsed() / N;
        eprintln!("RESULT metrics per chunk: {per:?} (2 clock reads, 6 atomic adds)");
        assert_eq!(rec.chunk_latency.snapshot().count, u64::from(N));
    }
}
