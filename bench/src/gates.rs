//! The gates: bounds on deterministic counts ([`GATES`]), which a run fails on when one is
//! missed. A count that timing cannot move does not flake, where the goals' ratios of times
//! move by more than their margins from run to run under TCG and are only reported.

use crate::results::{Failure, Sample};
use crate::series::{Gate, GATES, SERIES};
use crate::units::{nodes_name, num, size};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// The samples of `gate` on `nodes` nodes.
fn counted<'s>(samples: &'s [Sample], gate: &Gate, nodes: u8) -> Vec<&'s Sample> {
    samples
        .iter()
        .filter(|s| s.nodes == nodes)
        .filter(|s| SERIES[s.series].metric == gate.metric && SERIES[s.series].name == gate.series)
        .collect()
}

/// The count of `s` for `gate`, and whether it meets it.
fn count(s: &Sample, gate: &Gate) -> Option<(f64, bool)> {
    let x = *s.values.get(gate.metric.value())?;
    Some((x, x <= gate.most))
}

/// The gates on `nodes` nodes as text (a line per gate counted), and a failure for each
/// count over its bound.
pub fn check(samples: &[Sample], nodes: u8) -> (String, Vec<Failure>) {
    let mut text = String::new();
    let mut failures = Vec::new();
    for g in GATES {
        let found = counted(samples, g, nodes);
        if found.is_empty() {
            continue;
        }
        if text.is_empty() {
            let _ = writeln!(
                text,
                "gates, {}: deterministic counts; the run fails when one is missed",
                nodes_name(nodes)
            );
        }
        for s in found {
            let Some((x, met)) = count(s, g) else {
                continue;
            };
            let _ = writeln!(
                text,
                "  {}: {} at {} ({}): {}",
                g.describe(),
                num(x),
                size(s.size),
                g.why,
                if met { "met" } else { "MISSED" }
            );
            if !met {
                failures.push(Failure {
                    id: s.id.clone(),
                    why: format!("gate {} missed: counted {}", g.describe(), num(x)),
                });
            }
        }
    }
    (text, failures)
}

/// The JSON's `gates` entries on `nodes` nodes.
pub fn json(samples: &[Sample], nodes: u8) -> Vec<Value> {
    let mut out = Vec::new();
    for g in GATES {
        for s in counted(samples, g, nodes) {
            if let Some((x, met)) = count(s, g) {
                out.push(json!({
                    "nodes": nodes, "gate": g.describe(), "metric": g.metric.key(),
                    "series": g.series, "size": s.size, "count": x, "most": g.most,
                    "met": met, "values": s.values,
                }));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::series::Metric;
    use std::collections::BTreeMap;

    fn sample(x: f64) -> Sample {
        Sample {
            id: "1n/r1/alloc/engine/4096".into(),
            series: SERIES
                .iter()
                .position(|s| s.name == "engine" && s.metric == Metric::Allocations)
                .unwrap(),
            nodes: 1,
            size: 4096,
            round: 1,
            iters: 256,
            values: BTreeMap::from([("allocs_per_chunk".to_string(), x)]),
        }
    }

    #[test]
    fn a_count_over_its_bound_fails_the_run_and_one_within_passes() {
        let (t, f) = check(&[sample(0.0)], 1);
        assert!(t.contains("alloc engine <= 0.01: 0.0000 at 4 KiB"), "{t}");
        assert!(t.trim_end().ends_with("met"), "{t}");
        assert!(f.is_empty());
        let (t, f) = check(&[sample(1.0)], 1);
        assert!(t.contains("MISSED"), "{t}");
        assert_eq!(f[0].id, "1n/r1/alloc/engine/4096");
        assert!(f[0].why.contains("counted 1.00"), "{}", f[0].why);
        assert_eq!(check(&[sample(1.0)], 2), (String::new(), vec![]));
        let j = json(&[sample(0.5)], 1);
        assert_eq!(
            (j[0]["met"].as_bool(), j[0]["count"].as_f64()),
            (Some(false), Some(0.5))
        );
    }
}
