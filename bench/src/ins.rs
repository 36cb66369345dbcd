//! Instructions per write: each counted series beside the C loop over libibverbs, as the
//! terminal table and the JSON's `instructions` section. A count is deterministic (the same
//! binary and inputs give the same count whatever the machine is doing), so one round
//! measures it; where a run counted a series more than once, the counts must agree, and a
//! disagreement is shown.

use crate::plan::COST_ITERS;
use crate::results::{spreads, Sample};
use crate::series::{Metric, SERIES};
use crate::units::{nodes_name, size};
use serde_json::{json, Value};
use std::fmt::Write as _;

/// The C loop: one signalled write and its completion per iteration.
pub const C: &str = "c";
/// The C loop posting a chain of 16 writes, only the last signalled.
pub const C_BATCH: &str = "c/batch";

/// One series' count at one size, and its ratios.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// The series' name.
    pub series: &'static str,
    /// Message size.
    pub size: u64,
    /// Instructions per write (the median, where counted more than once).
    pub per_write: f64,
    /// The lowest and highest count, where they differ (they should not).
    pub varied: Option<(f64, f64)>,
    /// How many times it was counted.
    pub n: usize,
    /// Its ratio to the C loop's count at the same size.
    pub vs_c: Option<f64>,
    /// A batch's ratio to the C loop's chain of the same length at the same size.
    pub vs_c_batch: Option<f64>,
}

/// Whether `series` posts chains (and is compared with [`C_BATCH`] too).
fn batched(series: &str) -> bool {
    series.ends_with("/batch") && series != C_BATCH
}

/// Every counted series at every size on `nodes` nodes, size after size in table order.
pub fn rows(samples: &[Sample], nodes: u8) -> Vec<Row> {
    let m = Metric::Instructions;
    let sp = spreads(samples, m, nodes, m.value());
    let mut sizes: Vec<u64> = sp.keys().map(|&(_, s)| s).collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut out = Vec::new();
    for size in sizes {
        let base = |name: &str| sp.get(&(name, size)).map(|s| s.median);
        let ratio = |x: f64, b: Option<f64>| b.filter(|&b| b > 0.0).map(|b| x / b);
        // (The engine's count is per chunk, not per write: a gate, not a row here.)
        for s in SERIES.iter().filter(|s| s.metric == m && !s.engine()) {
            let Some(x) = sp.get(&(s.name, size)) else {
                continue;
            };
            out.push(Row {
                series: s.name,
                size,
                per_write: x.median,
                varied: (x.max > x.min).then_some((x.min, x.max)),
                n: x.n,
                vs_c: ratio(x.median, base(C)),
                vs_c_batch: batched(s.name)
                    .then(|| ratio(x.median, base(C_BATCH)))
                    .flatten(),
            });
        }
    }
    out
}

/// The table on `nodes` nodes: a row per size and series, with its ratios to the C loop (a
/// batch's also to the C chain); empty when nothing was counted.
pub fn table(samples: &[Sample], nodes: u8) -> String {
    let rows = rows(samples, nodes);
    if rows.is_empty() {
        return String::new();
    }
    let [short, long] = COST_ITERS;
    let mut t = format!(
        "user-space instructions per RDMA write, {}: callgrind's count in the post and the \
         completion, ({long} iterations - {short}) / {}, per write; deterministic, so one round \
         is enough\n",
        nodes_name(nodes),
        long - short,
    );
    let _ = writeln!(
        t,
        "  {:>8}  {:<16}  {:>10}  {:>7}  {:>9}",
        "size", "series", "per write", "/ c", "/ c/batch"
    );
    let ratio = |r: Option<f64>| r.map(|x| format!("{x:.2}")).unwrap_or_default();
    for r in &rows {
        let _ = write!(
            t,
            "  {:>8}  {:<16}  {:>10.1}  {:>7}  {:>9}",
            size(r.size),
            r.series,
            r.per_write,
            ratio(r.vs_c),
            ratio(r.vs_c_batch)
        );
        if let Some((lo, hi)) = r.varied {
            let _ = write!(t, "  VARIED over {} counts: {lo:.1} to {hi:.1}", r.n);
        }
        t.push('\n');
    }
    t
}

/// The JSON's `instructions` entries on `nodes` nodes.
pub fn json(samples: &[Sample], nodes: u8) -> Vec<Value> {
    rows(samples, nodes)
        .into_iter()
        .map(|r| {
            json!({
                "nodes": nodes, "series": r.series, "size": r.size, "per_write": r.per_write,
                "counts": r.n, "same_every_count": r.varied.is_none(),
                "vs_c": r.vs_c, "vs_c_batch": r.vs_c_batch,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A count of `series` at `size`: `per_write` instructions per write.
    fn sample(series: &str, size: u64, round: u32, per_write: f64) -> Sample {
        let i = SERIES
            .iter()
            .position(|s| s.name == series && s.metric == Metric::Instructions)
            .unwrap();
        Sample {
            id: format!("1n/r{round}/ins/{series}/{size}"),
            series: i,
            nodes: 1,
            size,
            round,
            iters: 60,
            values: BTreeMap::from([("ins_per_write".to_string(), per_write)]),
        }
    }

    fn counts() -> Vec<Sample> {
        vec![
            sample("c", 8, 1, 305.0),
            sample("ours/owned", 8, 1, 897.0),
            sample("ours/batch", 8, 1, 302.0),
            sample("c/batch", 8, 1, 167.0),
            sample("sideway", 8, 1, 304.0),
            sample("ibverbs/send", 8, 1, 310.0),
            sample("c", 64 << 10, 1, 310.0),
            sample("ours/owned", 64 << 10, 1, 900.0),
            sample("ours/owned", 64 << 10, 2, 901.0),
        ]
    }

    #[test]
    fn rows_hold_ratios_to_the_c_loop_and_batches_to_the_c_chain() {
        let r = rows(&counts(), 1);
        let at = |series: &str, size: u64| {
            r.iter()
                .find(|r| r.series == series && r.size == size)
                .unwrap()
                .clone()
        };
        assert_eq!(at("c", 8).vs_c, Some(1.0));
        assert_eq!(at("ours/owned", 8).vs_c, Some(897.0 / 305.0));
        assert_eq!(at("ours/owned", 8).vs_c_batch, None);
        let b = at("ours/batch", 8);
        assert_eq!(
            (b.vs_c, b.vs_c_batch),
            (Some(302.0 / 305.0), Some(302.0 / 167.0))
        );
        assert_eq!(at("c/batch", 8).vs_c_batch, None);
        // The verbs crates' loops: compared with the C loop, not with the C chain.
        let sw = at("sideway", 8);
        assert_eq!((sw.vs_c, sw.vs_c_batch), (Some(304.0 / 305.0), None));
        assert_eq!(at("ibverbs/send", 8).vs_c, Some(310.0 / 305.0));
        // Counted twice with different results: shown, not hidden.
        let o = at("ours/owned", 64 << 10);
        assert_eq!((o.varied, o.n), (Some((900.0, 901.0)), 2));
        assert!(rows(&counts(), 2).is_empty());
    }

    #[test]
    fn the_table_and_json_show_counts_and_ratios() {
        let t = table(&counts(), 1);
        assert!(
            t.starts_with("user-space instructions per RDMA write, one node"),
            "{t}"
        );
        assert!(t.contains("(60 iterations - 10) / 50, per write"), "{t}");
        let line = |series: &str, size: &str| {
            t.lines()
                .find(|l| {
                    let w: Vec<_> = l.split_whitespace().collect();
                    w.len() > 2 && w[..2].join(" ") == size && w[2] == series
                })
                .unwrap_or_else(|| panic!("{series} at {size}:\n{t}"))
                .to_string()
        };
        assert!(line("ours/owned", "8 B").contains("897.0     2.94"), "{t}");
        assert!(line("sideway", "8 B").contains("304.0     1.00"), "{t}");
        assert!(
            line("ours/batch", "8 B").ends_with("0.99       1.81"),
            "{t}"
        );
        assert!(
            line("ours/owned", "64 KiB").contains("VARIED over 2 counts: 900.0 to 901.0"),
            "{t}"
        );
        assert_eq!(table(&[], 1), "");
        let j = json(&counts(), 1);
        assert_eq!(j[1]["series"], "ours/owned");
        assert_eq!(j[1]["vs_c"].as_f64(), Some(897.0 / 305.0));
        assert_eq!(j[1]["same_every_count"], true);
        assert_eq!(j[2]["vs_c_batch"].as_f64(), Some(302.0 / 167.0));
        assert_eq!(j[0]["vs_c_batch"], Value::Null);
    }
}
