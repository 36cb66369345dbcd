//! `cargo xtask bench --peers --client nixl`: ours against NIXL (its pinned wheel, UCX
//! backend) on the same rxe devices of one two-node boot, both driven by one client that
//! uses only NIXL's agent API (`python/examples/nixl_bench.py`), the engines interleaved
//! round by round. Each cell (operation, descriptor size, descriptors per transfer) reports
//! MiB/s and the median time from `transfer` to `"DONE"`; the table gives ours/NIXL of the
//! rounds' medians. Written to `target/bench/nixl-peers.json`.

use crate::results::Spread;
use crate::workspace::Paths;
use dmabuf_testbed::sh::{self, Result};
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, programs, wheels};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::process::ExitCode;

/// The engines, in the table's order.
const ENGINES: [&str; 2] = ["nixl", "ours"];

/// Node a serves a target per step, node b runs the client against it; each step on its own
/// port, so that a step never reaches the last one's target.
const RUN: &str = r#"set -u
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
step=0
r=0
while [ "$r" -lt "$ROUNDS" ]; do
  r=$((r + 1))
  if [ $((r % 2)) = 1 ]; then order="nixl ours"; else order="ours nixl"; fi
  for e in $order; do
    step=$((step + 1))
    port=$((5600 + step))
    if [ "$e" = ours ]; then P="$OURS_PATH"; else P="$NIXL_PATH"; fi
    if [ "$NODE" = a ]; then
      PYTHONPATH="$P" timeout 900 /usr/bin/python3 "$CLIENT" target --port "$port" --buffer "$BUFFER" > /tmp/t-$step.log 2>&1
      echo "--- target $e round $r: exit $?"; grep -v " INFO " /tmp/t-$step.log | tail -5
    else
      /usr/bin/python3 -c "
import socket, sys, time
for _ in range(2400):
    try:
        socket.create_connection(('$PEER_ADDR', $port), 1).close(); break
    except OSError: time.sleep(0.25)
else: sys.exit('the target never listened')" || exit 1
      PYTHONPATH="$P" timeout 900 /usr/bin/python3 "$CLIENT" initiator --peer "$PEER_ADDR" --port "$port" --buffer "$BUFFER" --duration "$DURATION" > /tmp/i-$step.log 2>&1
      echo "--- initiator $e round $r: exit $?"
      sed -n "s/^NIXLBENCH /NIXLBENCH $e $r /p" /tmp/i-$step.log
      grep -v " INFO \|^NIXLBENCH" /tmp/i-$step.log | tail -5
    fi
  done
done
"#;

/// Whether `bench --peers`' arguments ask for this bench (`--client nixl`).
pub fn asked(args: &[String]) -> bool {
    args.windows(2)
        .any(|w| w[0] == "--client" && w[1] == "nixl")
}

/// The run's options.
struct Request {
    rounds: u32,
    duration: u32,
}

fn parse(args: &[String]) -> Result<Request> {
    let mut r = Request {
        rounds: 2,
        duration: 3,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let v = it.next().and_then(|v| v.parse::<u32>().ok());
        match (a.as_str(), v) {
            ("--client", _) => {} // nixl: how this module was reached
            ("--rounds", Some(n @ 1..=20)) => r.rounds = n,
            ("--duration", Some(n @ 1..=60)) => r.duration = n,
            _ => fail!(
                "bench --peers --client nixl [--rounds 1-20] [--duration 1-60]: {a:?} (its \
                 cells are fixed: WRITE and READ of 4 KiB, 64 KiB and 1 MiB descriptors, 1 and \
                 128 per transfer)"
            ),
        }
    }
    Ok(r)
}

/// One cell's samples: engine -> round -> (MiB/s, time to DONE in usec).
type Samples = BTreeMap<&'static str, BTreeMap<u32, (f64, f64)>>;

/// The `NIXLBENCH ENGINE ROUND {json}` lines of node b's console, by cell.
fn samples(console: &str) -> Result<BTreeMap<(String, u64, u64), Samples>> {
    let mut out: BTreeMap<(String, u64, u64), Samples> = BTreeMap::new();
    for line in console.lines() {
        let Some(rest) = line.split("NIXLBENCH ").nth(1) else {
            continue;
        };
        let mut w = rest.splitn(3, ' ');
        let (Some(engine), Some(round), Some(doc)) = (w.next(), w.next(), w.next()) else {
            continue;
        };
        let Some(engine) = ENGINES.iter().copied().find(|e| *e == engine) else {
            continue;
        };
        let v: Value = serde_json::from_str(doc).map_err(|e| format!("{line:?}: {e}"))?;
        let key = (
            v["op"].as_str().unwrap_or("?").to_string(),
            v["block"].as_u64().unwrap_or(0),
            v["batch"].as_u64().unwrap_or(0),
        );
        let round: u32 = round.parse().map_err(|_| format!("{line:?}: round"))?;
        let (bw, done) = (v["mibps"].as_f64(), v["done_usec"].as_f64());
        let (Some(bw), Some(done)) = (bw, done) else {
            fail!("{line:?}: no mibps or done_usec");
        };
        out.entry(key)
            .or_default()
            .entry(engine)
            .or_default()
            .insert(round, (bw, done));
    }
    Ok(out)
}

/// The median of `pick` over an engine's rounds.
fn med(s: &Samples, engine: &str, pick: fn(&(f64, f64)) -> f64) -> Option<f64> {
    Spread::of(&s.get(engine)?.values().map(pick).collect::<Vec<_>>()).map(|x| x.median)
}

/// The command.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let req = parse(args)?;
    dmabuf_testbed::setup::packages()?;
    let staged = crate::workspace::python::stage_release(paths)?;
    let nixl_path = format!(
        "{}:{}",
        wheels::NIXL.fetch(paths)?.display(),
        wheels::NIXL_CU12.fetch(paths)?.display()
    );
    let ours_path = format!(
        "{}:{}",
        staged.join("gpu_rdma/_nixl_compat").display(),
        staged.display()
    );
    let out = paths.target.join("bench");
    std::fs::create_dir_all(&out)?;
    let script = out.join("nixl-peers.sh");
    programs::write_script(&script, RUN)?;
    let client = paths.root.join("python/examples/nixl_bench.py");
    let env = [
        ("ROUNDS".to_string(), req.rounds.to_string()),
        ("DURATION".to_string(), req.duration.to_string()),
        ("BUFFER".to_string(), (128u64 << 20).to_string()),
        ("CLIENT".to_string(), client.display().to_string()),
        ("OURS_PATH".to_string(), ours_path),
        ("NIXL_PATH".to_string(), nixl_path),
    ];
    info(format!(
        "ours against NIXL {} (UCX), one client over NIXL's agent API, {} rounds of {} s per cell",
        wheels::NIXL_CU12.version,
        req.rounds,
        req.duration
    ));
    let results = crate::workspace::boot(paths, &script, 2, None, &env)?;
    let b = results
        .iter()
        .find(|r| r.node == 'b')
        .ok_or("no node b in the run")?;
    let cells = samples(&b.console)?;
    if cells.is_empty() {
        fail!("bench --peers --client nixl: no sample came back (see the consoles above)");
    }
    let (table, doc) = report(&cells, &req);
    print!("{table}");
    let file = out.join("nixl-peers.json");
    sh::write(&file, &serde_json::to_string_pretty(&doc)?)?;
    info(format!("written to {}", file.display()));
    Ok(ExitCode::SUCCESS)
}

fn ratio(s: &Samples, pick: fn(&(f64, f64)) -> f64) -> Option<f64> {
    Some(med(s, "ours", pick)? / med(s, "nixl", pick)?)
}

fn text(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.2}"))
}

/// The terminal table and the JSON document.
fn report(cells: &BTreeMap<(String, u64, u64), Samples>, req: &Request) -> (String, Value) {
    let mut t = format!(
        "ours against NIXL {} (UCX backend), one client over NIXL's agent API, two nodes \
         (emulated wire), {} s per cell, medians of {} rounds; ratios ours/NIXL (MiB/s: above \
         1 is ours faster; time to DONE: below 1 is ours sooner)\n",
        wheels::NIXL_CU12.version,
        req.duration,
        req.rounds
    );
    let _ = writeln!(
        t,
        "{:<5} {:>8} {:>5} | {:>10} {:>10} {:>6} | {:>12} {:>12} {:>6}",
        "op",
        "block",
        "descs",
        "NIXL MiB/s",
        "ours MiB/s",
        "ratio",
        "NIXL usec",
        "ours usec",
        "ratio"
    );
    let bw = |x: &(f64, f64)| x.0;
    let done = |x: &(f64, f64)| x.1;
    let mut rows = Vec::new();
    for ((op, block, batch), s) in cells {
        let _ = writeln!(
            t,
            "{:<5} {:>8} {:>5} | {:>10} {:>10} {:>6} | {:>12} {:>12} {:>6}",
            op,
            crate::units::size(*block),
            batch,
            text(med(s, "nixl", bw)),
            text(med(s, "ours", bw)),
            text(ratio(s, bw)),
            text(med(s, "nixl", done)),
            text(med(s, "ours", done)),
            text(ratio(s, done)),
        );
        let side = |e: &str| {
            let x = s.get(e);
            json!({
                "rounds": x.map(|x| x.keys().copied().collect::<Vec<_>>()),
                "mibps": x.map(|x| x.values().map(bw).collect::<Vec<_>>()),
                "done_usec": x.map(|x| x.values().map(done).collect::<Vec<_>>()),
            })
        };
        rows.push(json!({
            "op": op, "block": block, "descriptors": batch,
            "nixl": side("nixl"), "ours": side("ours"),
            "ratio_mibps": ratio(s, bw), "ratio_done_usec": ratio(s, done),
        }));
    }
    let doc = json!({
        "what": "cargo xtask bench --peers --client nixl: ours against NIXL's UCX backend, \
                 python/examples/nixl_bench.py over each nixl package, two nodes",
        "nixl": {"wheel": wheels::NIXL_CU12.name, "version": wheels::NIXL_CU12.version,
                 "sha256": wheels::NIXL_CU12.sha256},
        "duration_s": req.duration,
        "rounds": req.rounds,
        "cells": rows,
    });
    (t, doc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_read_from_the_client_lines_by_engine_round_and_cell() {
        let console = "[b] noise\n\
            [b] NIXLBENCH ours 1 {\"op\": \"WRITE\", \"block\": 4096, \"batch\": 1, \"mibps\": 2.0, \"done_usec\": 10.0}\n\
            [b] NIXLBENCH nixl 1 {\"op\": \"WRITE\", \"block\": 4096, \"batch\": 1, \"mibps\": 1.0, \"done_usec\": 20.0}\n\
            [b] NIXLBENCH ours 2 {\"op\": \"WRITE\", \"block\": 4096, \"batch\": 1, \"mibps\": 4.0, \"done_usec\": 30.0}\n";
        let c = samples(console).unwrap();
        let s = &c[&("WRITE".to_string(), 4096, 1)];
        assert_eq!(med(s, "ours", |x| x.0), Some(3.0));
        assert_eq!(ratio(s, |x| x.0), Some(3.0));
        assert_eq!(ratio(s, |x| x.1), Some(1.0));
        assert!(samples("NIXLBENCH ours 1 {").is_err());
    }
}
