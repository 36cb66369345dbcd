//! What an operator reads from an agent: its metrics (also as Prometheus text) and the
//! control listener's counters.

use super::Agent;
use crate::limits::ControlStats;
use crate::metrics::{prometheus, Metrics};
use crate::server::Server;
use crate::shared::Shared;
use std::net::SocketAddr;

impl Agent {
    /// The agent's counters since it started: per rail (peer, local device, remote device)
    /// bytes and requests by op and errors, completions in error by status, failovers,
    /// rails and peers marked down, batches and their entries, chunk and batch latency
    /// histograms, queue pairs, requests in flight, registration caches, metadata look-ups
    /// and publications, and the control listener's [`ControlStats`]. Reading them takes a
    /// few locks and allocates; recording them costs the workers no lock and no allocation
    /// per chunk ([`Settings::metrics`](crate::Settings::metrics)).
    pub fn metrics(&self) -> Metrics {
        let gauges = self.server.as_ref().map_or((0, 0), Server::gauges);
        snapshot(&self.shared, gauges)
    }

    /// [`Agent::metrics`] in the OpenMetrics text format that Prometheus scrapes (every
    /// name starts with `gpu_rdma_`, every sample has an `agent` label), for programs that
    /// serve their own metrics; [`Settings::metrics_address`](crate::Settings::metrics_address) serves it.
    pub fn metrics_text(&self) -> String {
        prometheus::render(&self.shared.name, self.metrics())
    }

    /// Where the Prometheus endpoint listens ([`Settings::metrics_address`](crate::Settings::metrics_address), its port
    /// picked if it was 0); `None` when there is none.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.endpoint
            .as_ref()
            .map(crate::metrics::endpoint::Endpoint::addr)
    }

    /// What the control listener accepted and refused since the agent started: connections,
    /// failed authentications, refusals at each of [`Settings::limits`](crate::Settings::limits), and what it holds
    /// now.
    pub fn control_stats(&self) -> ControlStats {
        let (open, qps) = self.server.as_ref().map_or((0, 0), Server::gauges);
        self.shared.counters.snapshot(open, qps)
    }
}

/// The agent's metrics now; `(open, qps)`: the control listener's gauges.
pub(super) fn snapshot(shared: &Shared, (open, qps): (u64, u64)) -> Metrics {
    let devices: Vec<String> = shared.devices.iter().map(|d| d.name.clone()).collect();
    let caches = shared.devices.iter().map(|d| d.cache.stats()).collect();
    let control = shared.counters.snapshot(open, qps);
    let segments = shared.segments.lock().len();
    shared.metrics.snapshot(&devices, caches, control, segments)
}
