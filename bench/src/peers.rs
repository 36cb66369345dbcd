//! `cargo xtask bench --peers`: the transfer engine against Mooncake's transfer engine, cell by
//! cell, in one two-node boot. Mooncake's own `transfer_engine_bench` (from its pinned wheel,
//! [`dmabuf_testbed::wheels::MOONCAKE`]) and the engine's twin, `engine_peer_bench`, run with
//! the same parameters and metadata service (the P2P handshake, or an etcd on node a that both
//! publish in: `--metadata p2p|etcd|both`), a target on node a and an initiator on node b
//! (`peers.sh`), interleaved: in each round every cell runs both, the one that goes first
//! alternating from round to round. A cell is (metadata mode, operation, block size, batch
//! size, threads; `peers_plan.rs`); each
//! gets bandwidth (MiB/s) and a batch's latency (threads × duration / batches, as Mooncake's
//! figures give it) from the initiator's closing line, `Test completed: duration D, batch count
//! N, throughput X MiB/s`, which both print. The table has ours/Mooncake per cell, marked `~`
//! when the rounds' own ratios fall on both sides of 1; the JSON file is
//! `target/bench/peers.json`, and the plots `bw-peers` and `ratios-peers` (`--plot` draws
//! them again from that file).

use crate::peers_plan::{cells, limit, parse_args, plan_text, steps, Cell, Request, Step};
use crate::peers_plan::{Client, ALL_OPERATIONS, ENGINES, MAX_BATCH, METADATA};
use crate::results::{Failure, Spread};
use crate::script;
use crate::workspace::Paths;
use crate::{loadavg, plot, units};
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, vm, wheels};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Mooncake's bench, inside its unpacked wheel.
const MOONCAKE_BENCH: &str = "mooncake/transfer_engine_bench";

/// One step's figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// Index of its step.
    pub step: usize,
    /// MiB/s.
    pub mibps: f64,
    /// A batch's latency, usec: threads × duration / batches.
    pub lat_usec: f64,
}

/// A closing line's duration (s), batches and throughput (MiB/s).
type Completed = (f64, f64, f64);

/// `(duration, batches, throughput)` from a line holding `Test completed: duration D, batch
/// count N, throughput X ...`.
fn completed(line: &str) -> Option<Completed> {
    let rest = line.split_once("Test completed: duration ")?.1;
    let (d, rest) = rest.split_once(", batch count ")?;
    let (n, rest) = rest.split_once(", throughput ")?;
    let x = rest.split_whitespace().next()?;
    Some((
        d.trim().parse().ok()?,
        n.trim().parse().ok()?,
        x.parse().ok()?,
    ))
}

/// The samples of node b's console, and a failure for each step without one.
pub fn collect(cells: &[Cell], steps: &[Step], console: &str) -> (Vec<Sample>, Vec<Failure>) {
    let index: BTreeMap<&str, usize> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    // Per step: its closing line's figures, if any, and its exit status.
    let mut found: BTreeMap<usize, (Option<Completed>, String)> = BTreeMap::new();
    let mut open: Option<usize> = None;
    for line in console.lines().map(str::trim) {
        if let Some(id) = line
            .strip_prefix("### step ")
            .and_then(|l| l.strip_suffix(" begin"))
        {
            open = index.get(id).copied();
            if let Some(i) = open {
                found.insert(i, (None, "no end line".into()));
            }
        } else if let Some(rest) = line.strip_prefix("### step ") {
            let rc = rest.split_once(" rc=").map_or("", |(_, r)| r);
            let rc = rc.split_whitespace().next().unwrap_or("");
            if let Some(e) = open.and_then(|i| found.get_mut(&i)) {
                e.1 = rc.to_string();
            }
            open = None;
        } else if let Some(f) = completed(line) {
            if let Some(e) = open.and_then(|i| found.get_mut(&i)) {
                e.0 = Some(f);
            }
        }
    }
    let (mut samples, mut failures) = (Vec::new(), Vec::new());
    for (i, s) in steps.iter().enumerate() {
        let why = match found.get(&i) {
            None => "never started (the boot ended first?)".to_string(),
            Some((Some((d, n, _)), rc)) if rc == "0" && *n > 0.0 && *d > 0.0 => {
                // From the batches, not the printed throughput: both print two decimals,
                // which reads 0.00 for a few batches of 4 KiB.
                let c = &cells[s.cell];
                samples.push(Sample {
                    step: i,
                    mibps: n * (c.batch * c.block) as f64 / d / f64::from(1 << 20),
                    lat_usec: cells[s.cell].threads as f64 * d / n * 1e6,
                });
                continue;
            }
            Some((_, rc)) if rc == "ready" => "the target never said where it listens".into(),
            Some((_, rc)) if rc == "124" => "the initiator timed out".into(),
            Some((f, rc)) => format!(
                "the initiator ended with {rc}{}",
                if f.is_some() { "" } else { ", no closing line" }
            ),
        };
        failures.push(Failure {
            id: format!("peers/{}", s.id),
            why,
        });
    }
    (samples, failures)
}

/// Per cell and engine, each round's (MiB/s, latency).
type ByCell = BTreeMap<(usize, usize), BTreeMap<u32, (f64, f64)>>;

fn by_cell(steps: &[Step], samples: &[Sample]) -> ByCell {
    let mut out = ByCell::new();
    for x in samples {
        let s = &steps[x.step];
        out.entry((s.cell, s.engine))
            .or_default()
            .insert(s.round, (x.mibps, x.lat_usec));
    }
    out
}

/// Ours/Mooncake of the medians of `pick`, the per-round ratios' range, and `~` when that
/// range has ratios on both sides of 1.
fn ratio(
    m: &BTreeMap<u32, (f64, f64)>,
    o: &BTreeMap<u32, (f64, f64)>,
    pick: fn(&(f64, f64)) -> f64,
) -> Option<(f64, (f64, f64), bool)> {
    let med = |x: &BTreeMap<u32, (f64, f64)>| {
        Spread::of(&x.values().map(pick).collect::<Vec<_>>()).map(|s| s.median)
    };
    let (mm, om) = (med(m)?, med(o)?);
    if mm <= 0.0 {
        return None;
    }
    let per_round: Vec<f64> = o
        .iter()
        .filter_map(|(r, x)| Some(pick(x) / pick(m.get(r)?)))
        .filter(|r| r.is_finite())
        .collect();
    let lo = per_round.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per_round.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let noise = !per_round.is_empty() && lo < 1.0 && hi >= 1.0;
    Some((om / mm, (lo, hi), noise))
}

fn spread_text(x: Option<&BTreeMap<u32, (f64, f64)>>, pick: fn(&(f64, f64)) -> f64) -> String {
    let Some(s) = x.and_then(|x| Spread::of(&x.values().map(pick).collect::<Vec<_>>())) else {
        return "-".into();
    };
    if s.n < 2 {
        return units::num(s.median);
    }
    format!(
        "{} ({}-{})",
        units::num(s.median),
        units::num(s.min),
        units::num(s.max)
    )
}

fn bw(x: &(f64, f64)) -> f64 {
    x.0
}

fn lat(x: &(f64, f64)) -> f64 {
    x.1
}

/// The terminal table: a row per cell.
pub fn report(cells: &[Cell], steps: &[Step], samples: &[Sample], req: &Request) -> String {
    let by = by_cell(steps, samples);
    let by_whom = match req.client {
        Client::Programs => "Mooncake's transfer_engine_bench and ours",
        Client::Python => "one Python client over TransferEngine's API, with each engine",
    };
    let mut t = format!(
        "ours against Mooncake's transfer engine ({by_whom}), two nodes (emulated wire), {} s \
         per run: median (min-max) of {} rounds; ratios ours/Mooncake of the medians \
         (~: the rounds' ratios fall on both sides of 1)\n",
        req.duration, req.rounds
    );
    let _ = writeln!(
        t,
        "{:<4} {:<11} {:>8} {:>5} {:>3} | {:>22} {:>22} {:>7} | {:>22} {:>22} {:>7}",
        "meta",
        "op",
        "block",
        "batch",
        "thr",
        "Mooncake MiB/s",
        "ours MiB/s",
        "ratio",
        "Mooncake batch usec",
        "ours batch usec",
        "ratio"
    );
    let empty = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        let (m, o) = (by.get(&(i, 0)), by.get(&(i, 1)));
        let r = |pick| match ratio(m.unwrap_or(&empty), o.unwrap_or(&empty), pick) {
            Some((x, _, noise)) => format!("{:.2}{}", x, if noise { "~" } else { "" }),
            None => "-".into(),
        };
        let _ = writeln!(
            t,
            "{:<4} {:<11} {:>8} {:>5} {:>3} | {:>22} {:>22} {:>7} | {:>22} {:>22} {:>7}",
            c.meta,
            c.op,
            units::size(c.block),
            c.batch,
            c.threads,
            spread_text(m, bw),
            spread_text(o, bw),
            r(bw),
            spread_text(m, lat),
            spread_text(o, lat),
            r(lat)
        );
    }
    t
}

/// The plots of a run against block size, a line per (metadata, operation, batch, threads):
/// `bw`, each engine's MiB/s (median, min-max; ours solid, Mooncake dashed), and `ratios`,
/// ours/Mooncake of each round's MiB/s (median, min-max), with 1 marked.
pub fn charts(
    cells: &[Cell],
    steps: &[Step],
    samples: &[Sample],
) -> Vec<(&'static str, plot::Chart)> {
    let by = by_cell(steps, samples);
    let mut bw_lines: BTreeMap<(String, usize), Vec<(u64, Spread)>> = BTreeMap::new();
    let mut ratio_lines: BTreeMap<String, Vec<(u64, Spread)>> = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        let key = format!("{} {} b{} t{}", c.meta, c.op, c.batch, c.threads);
        for e in 0..ENGINES.len() {
            let s = by
                .get(&(i, e))
                .and_then(|x| Spread::of(&x.values().map(bw).collect::<Vec<_>>()));
            if let Some(s) = s {
                bw_lines
                    .entry((key.clone(), e))
                    .or_default()
                    .push((c.block, s));
            }
        }
        if let (Some(m), Some(o)) = (by.get(&(i, 0)), by.get(&(i, 1))) {
            let r: Vec<f64> = o
                .iter()
                .filter_map(|(k, x)| Some(x.0 / m.get(k)?.0))
                .filter(|r| r.is_finite())
                .collect();
            if let Some(s) = Spread::of(&r) {
                ratio_lines.entry(key).or_default().push((c.block, s));
            }
        }
    }
    let bw_chart = plot::Chart {
        title: "ours (solid) and Mooncake (dashed), two nodes".into(),
        y_label: "MiB/s".into(),
        lines: bw_lines
            .into_iter()
            .map(|((key, e), points)| plot::Line {
                label: format!("{} {key}", ENGINES[e]),
                points,
                dashed: e == 0,
            })
            .collect(),
        reference: None,
    };
    let ratio_chart = plot::Chart {
        title: "ours / Mooncake, MiB/s of each round".into(),
        y_label: "ours / Mooncake".into(),
        lines: ratio_lines
            .into_iter()
            .map(|(label, points)| plot::Line {
                label,
                points,
                dashed: false,
            })
            .collect(),
        reference: Some(1.0),
    };
    vec![("bw", bw_chart), ("ratios", ratio_chart)]
}

/// The JSON document: every sample by cell, the ratios, what was left out and what failed.
pub fn document(
    cells: &[Cell],
    skipped: &[Cell],
    steps: &[Step],
    samples: &[Sample],
    failures: &[Failure],
    req: &Request,
    load: [String; 2],
) -> Value {
    let by = by_cell(steps, samples);
    let empty = BTreeMap::new();
    let side = |x: Option<&BTreeMap<u32, (f64, f64)>>| {
        let x = x.unwrap_or(&empty);
        json!({
            "rounds": x.keys().collect::<Vec<_>>(),
            "mibps": x.values().map(bw).collect::<Vec<_>>(),
            "batch_lat_usec": x.values().map(lat).collect::<Vec<_>>(),
        })
    };
    let ratio_json = |m: Option<&BTreeMap<u32, (f64, f64)>>,
                      o: Option<&BTreeMap<u32, (f64, f64)>>,
                      pick| {
        match ratio(m.unwrap_or(&empty), o.unwrap_or(&empty), pick) {
            Some((x, (lo, hi), noise)) => {
                json!({"median_ratio": x, "round_min": lo, "round_max": hi, "within_noise": noise})
            }
            None => Value::Null,
        }
    };
    let cell_json = |c: &Cell| {
        json!({"metadata": c.meta, "op": c.op, "block": c.block, "batch": c.batch,
                          "threads": c.threads})
    };
    json!({
        "what": "cargo xtask bench --peers: the transfer engine (ours) against Mooncake's, \
                 two nodes; each cell's metadata: p2p (the P2P handshake) or etcd (an etcd on \
                 node a)",
        "client": match req.client {
            Client::Programs => "transfer_engine_bench and engine_peer_bench",
            Client::Python => "python/examples/mooncake_bench.py over each mooncake.engine",
        },
        "metadata": req.metadata,
        "max_batch_bytes": MAX_BATCH,
        "mooncake": {"wheel": wheels::MOONCAKE.name, "version": wheels::MOONCAKE.version,
                     "sha256": wheels::MOONCAKE.sha256},
        "duration_s": req.duration,
        "rounds": req.rounds,
        "batch_latency": "threads x duration / batches, usec",
        "host_load_average": {"start": load[0], "end": load[1]},
        "cells": cells.iter().enumerate().map(|(i, c)| {
            let (m, o) = (by.get(&(i, 0)), by.get(&(i, 1)));
            let mut v = cell_json(c);
            v["mooncake"] = side(m);
            v["ours"] = side(o);
            v["ratio_mibps"] = ratio_json(m, o, bw);
            v["ratio_batch_lat"] = ratio_json(m, o, lat);
            v
        }).collect::<Vec<_>>(),
        "left_out": skipped.iter().map(|c| {
            let mut v = cell_json(c);
            v["why"] = json!(c.too_large());
            v
        }).collect::<Vec<_>>(),
        "failures": failures.iter().map(|f| json!({"id": f.id, "why": f.why})).collect::<Vec<_>>(),
    })
}

/// A run's cells, steps and samples again, from its JSON document (`--plot`).
pub fn from_json(doc: &Value) -> Result<(Vec<Cell>, Vec<Step>, Vec<Sample>)> {
    let (mut cells, mut steps, mut samples) = (Vec::new(), Vec::new(), Vec::new());
    let word = |v: &Value, of: &[&'static str]| of.iter().copied().find(|w| v == *w);
    for c in doc["cells"].as_array().into_iter().flatten() {
        let (Some(meta), Some(op)) = (
            word(&c["metadata"], &METADATA),
            word(&c["op"], &ALL_OPERATIONS),
        ) else {
            fail!("a cell without a known metadata mode and operation: {c}")
        };
        let n = |k: &str| {
            c[k].as_u64()
                .ok_or_else(|| format!("a cell without {k}: {c}"))
        };
        let cell = Cell {
            meta,
            op,
            block: n("block")?,
            batch: n("batch")?,
            threads: n("threads")?,
        };
        for (engine, name) in ENGINES.iter().enumerate() {
            let side = &c[*name];
            let rounds = side["rounds"].as_array().into_iter().flatten();
            let bw = side["mibps"].as_array().into_iter().flatten();
            let lat = side["batch_lat_usec"].as_array().into_iter().flatten();
            for ((r, x), l) in rounds.zip(bw).zip(lat) {
                let round = r.as_u64().and_then(|r| u32::try_from(r).ok()).unwrap_or(0);
                samples.push(Sample {
                    step: steps.len(),
                    mibps: x.as_f64().unwrap_or(f64::NAN),
                    lat_usec: l.as_f64().unwrap_or(f64::NAN),
                });
                steps.push(Step {
                    id: format!("{}-{name}-r{round}", cell.name()),
                    cell: cells.len(),
                    engine,
                    round,
                });
            }
        }
        cells.push(cell);
    }
    Ok((cells, steps, samples))
}

/// Draws the plots of `charts` as `NAME-peers.png` and `.svg` in `out`.
fn draw(out: &std::path::Path, cells: &[Cell], steps: &[Step], samples: &[Sample]) {
    let mut blocks: Vec<u64> = cells.iter().map(|c| c.block).collect();
    blocks.dedup();
    if blocks.len() < 2 {
        // plotters' logarithmic axis finds no end of key points over a single size.
        info("no plots: one block size");
        return;
    }
    for (name, chart) in charts(cells, steps, samples) {
        match plot::draw(&chart, &out.join(format!("{name}-peers"))) {
            Ok(files) => info(format!("plot: {}", files[0].display())),
            Err(e) => info(format!("no {name} plot: {e}")),
        }
    }
}

/// Runs the comparison in a two-node boot, prints the table, writes `target/bench/peers.json`.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    if crate::nixl_peers::asked(args) {
        return crate::nixl_peers::main(paths, args);
    }
    if args.first().is_some_and(|a| a == "--plot") {
        // The plots again from the last run's JSON file, without a boot.
        let out = paths.target.join("bench");
        let file = out.join("peers.json");
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let (cells, steps, samples) = from_json(&serde_json::from_str(&text)?)?;
        draw(&out, &cells, &steps, &samples);
        return Ok(ExitCode::SUCCESS);
    }
    let req = parse_args(args)?;
    let (cells, skipped) = cells(&req);
    if cells.is_empty() {
        fail!("bench --peers: every cell asked is too large (see MAX_BUFFER, MAX_BATCH)");
    }
    let steps = steps(&cells, req.rounds);
    let mooncake = wheels::MOONCAKE.program(paths, MOONCAKE_BENCH)?;
    // With the etcd backend whatever the mode: the same program in every cell.
    let ours = paths.release_example_with("engine_peer_bench", &["etcd"])?;
    let out = paths.target.join("bench");
    std::fs::create_dir_all(&out)?;
    let plan_file = out.join("plan-peers.txt");
    std::fs::write(
        &plan_file,
        plan_text(&cells, &steps, req.duration, req.client),
    )?;
    let script_file = paths.testbed.join("peers.sh");
    programs::write_script(&script_file, script::PEERS)?;
    for c in &skipped {
        info(format!(
            "left out: {} ({})",
            c.name(),
            c.too_large().unwrap_or_default()
        ));
    }
    info(format!(
        "bench --peers: {} cells x 2 engines x {} rounds = {} runs of {} s (plan in {})",
        cells.len(),
        req.rounds,
        steps.len(),
        req.duration,
        plan_file.display()
    ));
    // The Python client's script, and the PYTHONPATHs under which `mooncake` is Mooncake's
    // (the wheel) or ours (the compatibility package before the staged gpu_rdma).
    let client = paths.root.join("python/examples/mooncake_bench.py");
    let (theirs_py, ours_py) = if req.client == Client::Python {
        let staged = crate::workspace::python::stage_release(paths)?;
        let compat = staged.join("gpu_rdma/_compat");
        let wheel = wheels::MOONCAKE.fetch(paths)?;
        (
            wheel,
            format!("{}:{}", compat.display(), staged.display()).into(),
        )
    } else {
        (PathBuf::new(), PathBuf::new())
    };
    let argv: Vec<String> = [
        &script_file,
        &plan_file,
        &mooncake,
        &ours,
        &client,
        &theirs_py,
        &ours_py,
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect();
    let argv = [vec!["sh".to_string()], argv].concat();
    let most: u64 = steps
        .iter()
        .map(|s| 2 * limit(req.duration, &cells[s.cell]))
        .sum();
    let opts = vm::Opts {
        nodes: 2,
        // Mooncake's Python engine registers a 2 GiB pool at its first buffer.
        mem_mib: if req.client == Client::Python {
            8192
        } else {
            vm::Opts::default().mem_mib
        },
        timeout: Duration::from_secs(most + 300),
        expose: paths.vm_expose(),
        env: paths.cluster_env()?,
        ..vm::Opts::default()
    };
    let load_start = loadavg();
    let (results, rebooted) = vm::run_past_emulator_fault(paths, &argv, &opts, false)?;
    let load_end = loadavg();
    if rebooted {
        info("(the first boot hit an emulator fault: see docs/testbed.md)");
    }
    let mut failures = Vec::new();
    let mut console_b = String::new();
    for r in &results {
        let file = out.join(format!("console-peers-{}.txt", r.node));
        std::fs::write(&file, &r.console)?;
        if r.node == 'b' {
            console_b.clone_from(&r.console);
        }
        for problem in &r.problems {
            failures.push(Failure {
                id: format!("peers/vm/{}", r.node),
                why: format!("kernel: {problem} (console in {})", file.display()),
            });
        }
        if r.status != Some(0) {
            failures.push(Failure {
                id: format!("peers/vm/{}", r.node),
                why: format!("the VM's command ended with {:?}", r.status),
            });
        }
    }
    let (samples, f) = collect(&cells, &steps, &console_b);
    failures.extend(f);
    println!();
    println!("{}", report(&cells, &steps, &samples, &req));
    info(format!(
        "host load average (1, 5, 15 min) at start {load_start}, at end {load_end}"
    ));
    let doc = document(
        &cells,
        &skipped,
        &steps,
        &samples,
        &failures,
        &req,
        [load_start, load_end],
    );
    draw(&out, &cells, &steps, &samples);
    let json_file = out.join("peers.json");
    std::fs::write(&json_file, serde_json::to_string_pretty(&doc)?)?;
    info(format!("every sample: {}", json_file.display()));
    if failures.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for f in &failures {
        println!("FAILED {}: {}", f.id, f.why);
    }
    Ok(ExitCode::FAILURE)
}

#[cfg(test)]
#[path = "peers_tests.rs"]
mod tests;
