//! The JSON file of a run: how it was run, every sample, every failure, and the spread and
//! goal ratios derived from them.

use crate::gates;
use crate::ins;
use crate::plan::{Profile, COST_ITERS, ENGINE_COUNT_CHUNKS};
use crate::results::{spreads, Failure, Sample};
use crate::series::{Metric, ENGINE_COUNT_CHUNK, GOALS, SERIES};
use crate::table::{ratio_ranges, verdicts};
use serde_json::{json, Value};

/// What a run was: its profiles (one per node count), the guest kernel, and the host's load.
#[derive(Debug)]
pub struct Context<'a> {
    /// One profile per booted node count.
    pub profiles: &'a [Profile],
    /// The guest kernel's version.
    pub kernel: &'a str,
    /// The guest scheduler's setting for the run (`bench.sh` prints it).
    pub sched: &'a str,
    /// The host's `/proc/loadavg` when the run began, and when it ended.
    pub load: [String; 2],
    /// Seconds since the Unix epoch when the run began.
    pub started: u64,
}

/// The whole document.
pub fn document(ctx: &Context<'_>, samples: &[Sample], failures: &[Failure]) -> Value {
    let profiles: Vec<Value> = ctx
        .profiles
        .iter()
        .map(|p| {
            json!({
                "nodes": p.nodes,
                "sizes": p.sizes,
                "rounds": p.rounds,
                "bw_bytes": p.bw_bytes,
                "bw_max_iters": p.bw_max,
                "lat_bytes": p.lat_bytes,
                "lat_max_iters": p.lat_max,
                "reg_iters": p.reg_iters,
                "cost_sizes": p.cost_sizes,
                "cost_iters": COST_ITERS,
                "engine_alloc_chunk": ENGINE_COUNT_CHUNK,
                "engine_alloc_chunks": [ENGINE_COUNT_CHUNKS, 4 * ENGINE_COUNT_CHUNKS],
                "only": p.only,
            })
        })
        .collect();
    let series: Vec<Value> = SERIES
        .iter()
        .map(|s| {
            json!({
                "name": s.name,
                "metric": s.metric.key(),
                "program": s.program,
                "args": s.args,
            })
        })
        .collect();
    let samples_json: Vec<Value> = samples
        .iter()
        .map(|s| {
            json!({
                "id": s.id,
                "series": SERIES[s.series].name,
                "metric": SERIES[s.series].metric.key(),
                "nodes": s.nodes,
                "size": s.size,
                "round": s.round,
                "iters": s.iters,
                "values": s.values,
            })
        })
        .collect();
    let mut summary = Vec::new();
    let mut goals = Vec::new();
    let mut instructions = Vec::new();
    let mut gate_list = Vec::new();
    for p in ctx.profiles {
        instructions.extend(ins::json(samples, p.nodes));
        gate_list.extend(gates::json(samples, p.nodes));
        for m in Metric::ALL {
            for value in value_names(m) {
                for ((name, size), sp) in spreads(samples, m, p.nodes, value) {
                    summary.push(json!({
                        "nodes": p.nodes, "metric": m.key(), "series": name, "size": size,
                        "value": value, "min": sp.min, "median": sp.median, "max": sp.max,
                        "n": sp.n,
                    }));
                }
            }
        }
        for g in GOALS {
            let r = verdicts(samples, g, p.nodes);
            if r.is_empty() {
                continue;
            }
            let ranges = ratio_ranges(samples, g, p.nodes);
            let at: Vec<Value> = r
                .iter()
                .map(|(&size, &(x, v))| {
                    json!({"size": size, "ratio": x, "met": g.met(x), "verdict": v.name(),
                           "range": ranges.get(&size).map(|&(lo, hi)| [lo, hi])})
                })
                .collect();
            goals.push(json!({
                "nodes": p.nodes, "goal": g.describe(), "metric": g.metric.key(),
                "series": g.series, "base": g.base, "bound": g.bound, "at_least": g.at_least,
                "from_size": g.from, "ratios": at,
            }));
        }
    }
    json!({
        "bench": "cargo xtask bench",
        "started_unix": ctx.started,
        "guest_kernel": ctx.kernel,
        "guest_scheduler": ctx.sched,
        "host_loadavg": {"start": ctx.load[0], "end": ctx.load[1]},
        "profiles": profiles,
        "series": series,
        "samples": samples_json,
        "failures": failures.iter().map(|f| json!({"id": f.id, "why": f.why})).collect::<Vec<_>>(),
        "summary": summary,
        "goals": goals,
        "instructions": instructions,
        "gates": gate_list,
    })
}

/// The samples and profiles of a document written by [`document`] (for `--replot`).
///
/// # Errors
/// A field is missing or names no series of [`SERIES`].
pub fn read(doc: &Value) -> Result<(Vec<Sample>, Vec<Profile>), String> {
    let mut samples = Vec::new();
    for s in doc["samples"].as_array().ok_or("no samples")? {
        let text = |k: &str| s[k].as_str().ok_or_else(|| format!("a sample has no {k}"));
        let int = |k: &str| s[k].as_u64().ok_or_else(|| format!("a sample has no {k}"));
        let (name, metric) = (text("series")?, text("metric")?);
        let series = SERIES
            .iter()
            .position(|x| x.name == name && x.metric.key() == metric)
            .ok_or_else(|| format!("no series {metric} {name}"))?;
        let values = s["values"]
            .as_object()
            .ok_or("a sample has no values")?
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
            .collect();
        samples.push(Sample {
            id: text("id")?.to_string(),
            series,
            nodes: u8::try_from(int("nodes")?).map_err(|e| e.to_string())?,
            size: int("size")?,
            round: u32::try_from(int("round")?).map_err(|e| e.to_string())?,
            iters: int("iters")?,
            values,
        });
    }
    let mut profiles = Vec::new();
    for p in doc["profiles"].as_array().ok_or("no profiles")? {
        let nodes = p["nodes"]
            .as_u64()
            .and_then(|n| u8::try_from(n).ok())
            .ok_or("nodes")?;
        let mut profile = Profile::full(nodes);
        profile.rounds = p["rounds"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or("rounds")?;
        profiles.push(profile);
    }
    Ok((samples, profiles))
}

/// The figures each metric's steps report.
pub fn value_names(m: Metric) -> &'static [&'static str] {
    match m {
        Metric::Bandwidth => &["bw_MBps", "mpps", "batch_lat_usec"],
        Metric::Latency => &["lat_usec", "typ_usec"],
        Metric::Registration => &["reg_usec", "dereg_usec"],
        Metric::Instructions => &["ins_per_write"],
        Metric::Allocations => &["allocs_per_chunk"],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Profile;

    #[test]
    fn the_document_holds_every_sample_failure_spread_and_ratio() {
        let p = [Profile::quick(1)];
        let ctx = Context {
            profiles: &p,
            kernel: "6.12.0",
            sched: "NO_RUN_TO_PARITY",
            load: ["1.0".into(), "2.0".into()],
            started: 1,
        };
        let mk = |series: usize, round: u32, x: f64| Sample {
            id: format!("{series}/{round}"),
            series,
            nodes: 1,
            size: 8,
            round,
            iters: 5,
            values: [("bw_MBps".to_string(), x), ("mpps".to_string(), x / 8.0)]
                .into_iter()
                .collect(),
        };
        // Series 0 is perftest's bandwidth, 1 ours on host memory.
        let samples = [
            mk(0, 1, 10.0),
            mk(0, 2, 20.0),
            mk(1, 1, 11.0),
            mk(1, 2, 21.0),
        ];
        let failures = [Failure {
            id: "x".into(),
            why: "client timed out".into(),
        }];
        let d = document(&ctx, &samples, &failures);
        assert_eq!(d["samples"].as_array().unwrap().len(), 4);
        assert_eq!(d["samples"][0]["values"]["bw_MBps"], 10.0);
        assert_eq!(d["failures"][0]["why"], "client timed out");
        let sum = d["summary"].as_array().unwrap();
        let pt = sum
            .iter()
            .find(|s| s["series"] == "perftest" && s["value"] == "bw_MBps")
            .unwrap();
        assert_eq!(
            (pt["min"].as_f64(), pt["median"].as_f64()),
            (Some(10.0), Some(15.0))
        );
        let g = &d["goals"][0];
        assert_eq!(g["ratios"][0]["ratio"].as_f64(), Some(16.0 / 15.0));
        assert_eq!(g["ratios"][0]["met"], true);
        // Nothing counted: an empty instructions section.
        assert_eq!(d["instructions"], json!([]));
        assert_eq!(d["profiles"][0]["cost_iters"], json!([10, 60]));
        // It reads back as text.
        let text = serde_json::to_string_pretty(&d).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["samples"], d["samples"]);
        let (again, profiles) = read(&back).unwrap();
        assert_eq!(again, samples);
        assert_eq!((profiles[0].nodes, profiles[0].rounds), (1, 3));
        assert!(read(&json!({"samples": [{"series": "nope"}]})).is_err());
    }
}
