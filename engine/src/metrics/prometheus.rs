//! The metrics in the OpenMetrics text format that Prometheus scrapes, encoded by the
//! `prometheus-client` crate.

use super::Metrics;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

/// The content type of the text [`render`] makes.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// One scrape's snapshot, as a collector of the registry.
#[derive(Debug)]
struct Scrape {
    agent: String,
    m: Metrics,
}

type Labels = Vec<(&'static str, String)>;

/// Reads one counter of a registration cache's.
type CachePick = fn(&rdma_dmabuf::CacheStats) -> u64;

/// A family of one type: each labelled value encoded by `each`.
fn family<T>(
    enc: &mut DescriptorEncoder<'_>,
    (name, help, unit, kind): (&str, &str, Option<Unit>, MetricType),
    values: impl IntoIterator<Item = (Labels, T)>,
    each: impl Fn(&mut prometheus_client::encoding::MetricEncoder<'_>, &T) -> std::fmt::Result,
) -> std::fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), kind)?;
    for (labels, v) in values {
        each(&mut m.encode_family(&labels)?, &v)?;
    }
    Ok(())
}

fn counter(m: &mut prometheus_client::encoding::MetricEncoder<'_>, v: &u64) -> std::fmt::Result {
    m.encode_counter::<NoLabelSet, _, u64>(v, None)
}

fn gauge(m: &mut prometheus_client::encoding::MetricEncoder<'_>, v: &u64) -> std::fmt::Result {
    m.encode_gauge(&i64::try_from(*v).unwrap_or(i64::MAX))
}

fn histogram(
    m: &mut prometheus_client::encoding::MetricEncoder<'_>,
    h: &super::Histogram,
) -> std::fmt::Result {
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|&(b, n)| (b.map_or(f64::MAX, |b| b.as_secs_f64()), n))
        .collect();
    m.encode_histogram::<NoLabelSet>(h.sum.as_secs_f64(), h.count, &buckets, None)
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> std::fmt::Result {
        use MetricType::{Counter, Gauge, Histogram};
        let (m, a) = (&self.m, || ("agent", self.agent.clone()));
        let rail = |r: &super::RailMetrics| {
            vec![
                a(),
                ("peer", r.peer.clone()),
                ("local_device", r.local_device.clone()),
                ("remote_device", r.remote_device.to_string()),
            ]
        };
        let by_op = |pick: fn(&super::RailMetrics) -> (u64, u64)| {
            m.rails.iter().flat_map(move |r| {
                let (w, rd) = pick(r);
                [("write", w), ("read", rd)].map(|(op, v)| {
                    let mut l = rail(r);
                    l.push(("op", op.into()));
                    (l, v)
                })
            })
        };
        family(
            &mut enc,
            (
                "gpu_rdma_rail",
                "Bytes moved by requests that completed successfully, per rail and op.",
                Some(Unit::Bytes),
                Counter,
            ),
            by_op(|r| (r.write_bytes, r.read_bytes)),
            counter,
        )?;
        family(
            &mut enc,
            (
                "gpu_rdma_rail_requests",
                "Requests (chunks) that completed successfully, per rail and op.",
                None,
                Counter,
            ),
            by_op(|r| (r.write_requests, r.read_requests)),
            counter,
        )?;
        family(
            &mut enc,
            (
                "gpu_rdma_rail_errors",
                "Requests that completed in error, per rail.",
                None,
                Counter,
            ),
            m.rails.iter().map(|r| (rail(r), r.errors)),
            counter,
        )?;
        family(
            &mut enc,
            (
                "gpu_rdma_completion_errors",
                "Completions in error by status (IBV_WC_*).",
                None,
                Counter,
            ),
            m.completion_errors
                .iter()
                .map(|&(s, n)| (vec![a(), ("status", s.to_string())], n)),
            counter,
        )?;
        let one = |v: u64| [(vec![a()], v)];
        let counters = [
            (
                "gpu_rdma_failovers",
                "Chunks moved off a failed rail onto another.",
                m.failovers,
            ),
            (
                "gpu_rdma_rails_marked_down",
                "Times a rail was marked down.",
                m.rails_marked_down,
            ),
            (
                "gpu_rdma_peers_marked_down",
                "Times a peer was marked down in a batch.",
                m.peers_marked_down,
            ),
            (
                "gpu_rdma_batches",
                "Batches the workers finished.",
                m.batches,
            ),
            (
                "gpu_rdma_metadata_lookups",
                "Look-ups of peers' descriptors.",
                m.metadata.lookups,
            ),
            (
                "gpu_rdma_metadata_lookup_failures",
                "Look-ups of peers' descriptors that failed.",
                m.metadata.lookup_failures,
            ),
            (
                "gpu_rdma_metadata_publishes",
                "Publications of the agent's descriptor.",
                m.metadata.publishes,
            ),
            (
                "gpu_rdma_metadata_publish_failures",
                "Publications of the agent's descriptor that failed.",
                m.metadata.publish_failures,
            ),
            (
                "gpu_rdma_control_connections_refused",
                "Authenticated control connections refused at a limit.",
                m.control.connections_refused,
            ),
            (
                "gpu_rdma_control_handshakes_failed",
                "Control handshakes that failed (no key, a wrong proof, malformed, too slow).",
                m.control.unauthenticated + m.control.bad_proofs + m.control.failed_handshakes,
            ),
        ];
        for (name, help, v) in counters {
            family(&mut enc, (name, help, None, Counter), one(v), counter)?;
        }
        family(
            &mut enc,
            (
                "gpu_rdma_entries",
                "Entries of finished batches, by outcome.",
                None,
                Counter,
            ),
            [("done", m.entries_done), ("failed", m.entries_failed)]
                .map(|(o, v)| (vec![a(), ("outcome", o.to_string())], v)),
            counter,
        )?;
        let gauges = [
            (
                "gpu_rdma_rails_down",
                "Rails left out of batches now, waiting for their probe.",
                m.rails_down,
            ),
            (
                "gpu_rdma_in_flight",
                "Requests posted and not yet completed.",
                m.in_flight,
            ),
            (
                "gpu_rdma_segments",
                "Segments registered.",
                m.segments as u64,
            ),
        ];
        for (name, help, v) in gauges {
            family(&mut enc, (name, help, None, Gauge), one(v), gauge)?;
        }
        family(
            &mut enc,
            ("gpu_rdma_queue_pairs", "Queue pairs held now: made by the workers (initiator) or for peers by the control listener (responder).", None, Gauge),
            [("initiator", m.queue_pairs), ("responder", m.control.queue_pairs)]
                .map(|(s, v)| (vec![a(), ("side", s.to_string())], v)),
            gauge,
        )?;
        let cache = |pick: CachePick| {
            m.caches
                .iter()
                .map(move |(d, c)| (vec![a(), ("device", d.clone())], pick(c)))
        };
        let cache_counters: [(&str, &str, CachePick); 3] = [
            (
                "gpu_rdma_registration_cache_hits",
                "CUDA segments registered from a cached registration.",
                |c| c.hits,
            ),
            (
                "gpu_rdma_registration_cache_misses",
                "CUDA segments that were exported and registered.",
                |c| c.misses,
            ),
            (
                "gpu_rdma_registration_cache_evictions",
                "Cached registrations deregistered to stay within the limits.",
                |c| c.evictions,
            ),
        ];
        for (name, help, pick) in cache_counters {
            family(&mut enc, (name, help, None, Counter), cache(pick), counter)?;
        }
        family(
            &mut enc,
            (
                "gpu_rdma_registration_cache",
                "Bytes the registration cache holds registered.",
                Some(Unit::Bytes),
                Gauge,
            ),
            cache(|c| c.bytes),
            gauge,
        )?;
        family(
            &mut enc,
            (
                "gpu_rdma_chunk_latency",
                "From a chunk's post to its completion.",
                Some(Unit::Seconds),
                Histogram,
            ),
            [(vec![a()], &m.chunk_latency)],
            |e, h| histogram(e, h),
        )?;
        family(
            &mut enc,
            (
                "gpu_rdma_batch_latency",
                "From transfer() to the worker's end of the batch.",
                Some(Unit::Seconds),
                Histogram,
            ),
            [(vec![a()], &m.batch_latency)],
            |e, h| histogram(e, h),
        )
    }
}

/// `m`, agent `agent`'s metrics, in the OpenMetrics text format.
pub(crate) fn render(agent: &str, m: Metrics) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        agent: agent.into(),
        m,
    }));
    let mut out = String::new();
    // Writing into a String does not fail; the encoder's own errors are for bad names.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}
