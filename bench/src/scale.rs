//! `cargo xtask bench --scale`: how the transfer engine's costs grow with its scale, on one
//! node of the testbed (rxe loopback): a batch's submission time, whole time and peak memory
//! against its entries, and a registration's time, the memory it adds and a peer's look-up
//! of the descriptor against the segments an agent holds. The step is
//! `examples/engine_scale_bench.rs`; the table, `target/bench/scale.json` and the plots
//! (`scale-entries.png`, `scale-segments.png`, and SVG) are made here. Each curve is per unit
//! (per entry, per segment), and the goal is flat: the largest count's cost per unit within
//! 1.5x of the cheapest point's. (The smallest counts cost more per unit, their fixed costs
//! spread over few units; that is no growth, and the check does not count it.)
//!
//! Not measured here (yet): the curves against the number of agents (2 to 64 processes over
//! both nodes, etcd metadata), and failure at that scale.

use crate::loadavg;
use crate::plot;
use crate::results::Spread;
use crate::workspace::Paths;
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::{fail, vm};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

/// One `RESULT` line's `key=value` words.
type Fields = BTreeMap<String, String>;

/// How far the largest point of a per-unit curve may be from the smallest.
const FLAT: f64 = 1.5;

/// The `RESULT scale=<kind>` lines of `console`.
fn results(console: &str, kind: &str) -> Vec<Fields> {
    let tag = format!("scale={kind} ");
    console
        .lines()
        .filter_map(|l| l.split("RESULT ").nth(1))
        .filter(|rest| rest.starts_with(&tag))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

fn num(f: &Fields, k: &str) -> f64 {
    f.get(k).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// One curve: (count, value per unit) in count order.
struct Curve {
    label: &'static str,
    unit: &'static str,
    points: Vec<(u64, f64)>,
}

impl Curve {
    /// `key` of each row divided by `per(row)`.
    fn of(
        rows: &[Fields],
        label: &'static str,
        unit: &'static str,
        key: &str,
        per: impl Fn(&Fields) -> f64,
    ) -> Curve {
        let points = rows
            .iter()
            .map(|r| (num(r, "n") as u64, num(r, key) / per(r)))
            .collect();
        Curve {
            label,
            unit,
            points,
        }
    }

    /// The largest count's value over the cheapest point's: how much a unit costs more at
    /// the largest scale measured than at its cheapest.
    fn spread(&self) -> f64 {
        let lo = self
            .points
            .iter()
            .map(|p| p.1)
            .fold(f64::INFINITY, f64::min);
        let last = self
            .points
            .iter()
            .max_by_key(|p| p.0)
            .map_or(f64::NAN, |p| p.1);
        last / lo
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "label": self.label,
            "unit": self.unit,
            "points": self.points.iter().map(|(n, v)| json!({"n": n, "value": v})).collect::<Vec<_>>(),
            "largest_count_over_cheapest": self.spread(),
            "flat": self.spread() <= FLAT,
        })
    }

    fn line(&self) -> plot::Line {
        let points = self
            .points
            .iter()
            .map(|&(n, v)| {
                let s = Spread {
                    min: v,
                    median: v,
                    max: v,
                    n: 1,
                };
                (n, s)
            })
            .collect();
        plot::Line {
            label: format!("{} ({})", self.label, self.unit),
            points,
            dashed: false,
        }
    }
}

/// Prints `curves` as a table: one row per count, one column per curve, and each curve's
/// spread against the goal.
fn table(title: &str, what: &str, curves: &[Curve]) {
    println!("\n{title}");
    print!("{what:>10}");
    for c in curves {
        print!("  {:>26}", format!("{} ({})", c.label, c.unit));
    }
    println!();
    let counts: Vec<u64> = curves[0].points.iter().map(|p| p.0).collect();
    for (i, n) in counts.iter().enumerate() {
        print!("{n:>10}");
        for c in curves {
            print!("  {:>26.2}", c.points.get(i).map_or(f64::NAN, |p| p.1));
        }
        println!();
    }
    print!("{:>10}", "largest n/");
    for c in curves {
        let s = c.spread();
        let verdict = if s <= FLAT { "flat" } else { "NOT flat" };
        print!("  {:>26}", format!("{s:.2}x {verdict}"));
    }
    println!("\n{:>10}  (goal: within {FLAT}x)", "cheapest");
}

/// Runs the step in the testbed and reports it; `args`: `--entries 10,1000,100000` and
/// `--segments 10,1000,10000` (the counts).
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let mut entries = "10,1000,100000".to_string();
    let mut segments = "10,1000,10000".to_string();
    let mut it = args.iter();
    while let Some(k) = it.next() {
        let v = it.next().cloned().unwrap_or_default();
        let ok = !v.is_empty() && v.split(',').all(|c| c.parse::<u64>().is_ok_and(|n| n > 0));
        match k.as_str() {
            "--entries" if ok => entries = v,
            "--segments" if ok => segments = v,
            _ => fail!(
                "bench --scale takes --entries N,N,.. and --segments N,N,.. (counts above 0), \
                 not {k:?} {v:?}"
            ),
        }
    }
    let example = paths.release_example("engine_scale_bench")?;
    let e = example.display();
    let script =
        format!("{e} entries --counts {entries} --rounds 3 && {e} segments --counts {segments}");
    let argv = vec!["/bin/sh".to_string(), "-c".to_string(), script];
    // The cluster key, as every agent of the testbed needs one.
    let mut env = paths.cluster_env()?;
    env.push(("RDMA_DEVICE".into(), "rxe0".into()));
    let opts = vm::Opts {
        timeout: Duration::from_secs(1800),
        expose: paths.vm_expose(),
        env,
        ..vm::Opts::default()
    };
    let load_start = loadavg();
    let (nodes, _) = vm::run_past_emulator_fault(paths, &argv, &opts, false)?;
    let load_end = loadavg();
    let out = paths.target.join("bench");
    std::fs::create_dir_all(&out)?;
    let node = &nodes[0];
    let console_file = out.join("console-scale.txt");
    std::fs::write(&console_file, &node.console)?;
    if !node.ok() {
        fail!(
            "the step ended with {:?}, kernel problems {:?} (console in {})",
            node.status,
            node.problems,
            console_file.display()
        );
    }
    let e_rows = results(&node.console, "entries");
    let s_rows = results(&node.console, "segments");
    if e_rows.is_empty() || s_rows.is_empty() {
        fail!("no RESULT lines (console in {})", console_file.display());
    }
    let n = |r: &Fields| num(r, "n");
    let e_curves = [
        Curve::of(&e_rows, "submission", "us/entry", "submit_us", n),
        Curve::of(&e_rows, "whole batch", "us/entry", "total_us", n),
        Curve::of(&e_rows, "peak memory", "KiB/entry", "peak_kib", n),
    ];
    let s_curves = [
        Curve::of(
            &s_rows,
            "register, mean",
            "us/segment",
            "register_us",
            |_| 1.0,
        ),
        Curve::of(
            &s_rows,
            "register, last tenth",
            "us/segment",
            "last_register_us",
            |_| 1.0,
        ),
        Curve::of(&s_rows, "memory", "KiB/segment", "rss_kib", n),
        Curve::of(&s_rows, "descriptor look-up", "us/segment", "lookup_us", n),
    ];
    println!("\nthe engine at scale: one node, rxe loopback (load {load_start} -> {load_end})");
    table(
        "a batch of N writes of 64 bytes (median of 3)",
        "entries",
        &e_curves,
    );
    table(
        "N segments of 4 KiB registered by one agent",
        "segments",
        &s_curves,
    );
    let doc = json!({
        "load": {"start": load_start, "end": load_end},
        "flat_within": FLAT,
        "entries": {
            "rows": e_rows,
            "curves": e_curves.iter().map(Curve::json).collect::<Vec<_>>(),
        },
        "segments": {
            "rows": s_rows,
            "curves": s_curves.iter().map(Curve::json).collect::<Vec<_>>(),
        },
    });
    let json_file = out.join("scale.json");
    std::fs::write(&json_file, serde_json::to_string_pretty(&doc)?)?;
    let charts = [
        (
            "scale-entries",
            "a batch's cost per entry",
            &e_curves[..],
            "entries",
        ),
        (
            "scale-segments",
            "an agent's cost per segment",
            &s_curves[..],
            "segments",
        ),
    ];
    for (file, title, curves, x) in charts {
        let chart = plot::Chart {
            title: title.into(),
            y_label: "per unit".into(),
            lines: curves.iter().map(Curve::line).collect(),
            reference: None,
        };
        let axis = plot::Axis {
            desc: x,
            label: plot::count_label,
        };
        match plot::draw_against(&chart, &out.join(file), &axis) {
            Ok(files) => files.iter().for_each(|f| println!("{}", f.display())),
            Err(e) => println!("no plot {file}: {e}"),
        }
    }
    println!("{}", json_file.display());
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONSOLE: &str = "\
[   12.3] boot noise
RESULT scale=entries n=10 submit_us=470 total_us=450 peak_kib=4
RESULT scale=entries n=1000 submit_us=13700 total_us=45400 peak_kib=144
RESULT scale=segments n=10 register_us=250.0 last_register_us=240.0 rss_kib=200 lookup_us=16000 descriptor_segments=10
";

    #[test]
    fn a_kinds_lines_are_read_and_per_unit_curves_say_how_flat_they_are() {
        let rows = results(CONSOLE, "entries");
        assert_eq!(rows.len(), 2);
        assert_eq!(results(CONSOLE, "segments").len(), 1);
        let c = Curve::of(&rows, "submission", "us/entry", "submit_us", |r| {
            num(r, "n")
        });
        assert_eq!(c.points, vec![(10, 47.0), (1000, 13.7)]);
        // Dearer per entry at 10 than at 1,000 (fixed costs): no growth.
        assert_eq!(c.spread(), 1.0);
        assert_eq!(c.json()["flat"], true);
        // A cost per unit that grows with the count is caught.
        let grows = results(
            "RESULT scale=segments n=10 lookup_us=100\nRESULT scale=segments n=1000 lookup_us=40000\n",
            "segments",
        );
        let c = Curve::of(&grows, "look-up", "us/segment", "lookup_us", |r| {
            num(r, "n")
        });
        assert_eq!(c.spread(), 4.0);
        assert_eq!(c.json()["flat"], false);
        let flat = Curve::of(&rows, "whole", "us/entry", "total_us", |r| num(r, "n"));
        assert!(flat.spread() <= FLAT, "{}", flat.spread());
    }
}
