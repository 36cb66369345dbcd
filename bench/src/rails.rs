//! `cargo xtask bench --rails`: the transfer engine's aggregate bandwidth over 1, 2 and 4
//! rails in one boot of the two-node testbed with four NICs and its PCIe topology, each
//! rail's share of the bytes (the links' own counters) beside its share of the link rates,
//! the vCPU use of both nodes (under the emulator the CPU, not the links, may bound it: the
//! table says which), and the time a rail cut mid-batch costs. The step is
//! `examples/engine_rails_bench.rs`; the table and `target/bench/rails.json` are made here.

use crate::loadavg;
use crate::workspace::Paths;
use dmabuf_testbed::sh::Result;
use dmabuf_testbed::ui::info;
use dmabuf_testbed::{fail, vm};
use serde_json::json;
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

/// One `RESULT` line's `key=value` words.
type Fields = BTreeMap<String, String>;

/// The `RESULT` lines of `console` that start with `kind` (`rails=`, `failover`, ...).
fn results<'a>(console: &'a str, kind: &'a str) -> impl Iterator<Item = Fields> + 'a {
    console.lines().filter_map(move |l| {
        let rest = l.split("RESULT ").nth(1)?;
        if !rest.starts_with(kind) {
            return None;
        }
        Some(
            rest.split_whitespace()
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    })
}

fn num(f: &Fields, k: &str) -> f64 {
    f.get(k).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

fn list(f: &Fields, k: &str) -> Vec<f64> {
    f.get(k)
        .map(|v| v.split(',').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default()
}

/// The median of `v` (NaN for none).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Each value's share of their sum, as percentages.
fn shares(v: &[f64]) -> String {
    let sum: f64 = v.iter().sum();
    v.iter()
        .map(|x| format!("{:.0}", 100.0 * x / sum))
        .collect::<Vec<_>>()
        .join("/")
}

/// Runs the step in the testbed and reports it; `args` are the step's own options.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    let example = paths.release_example("engine_rails_bench")?;
    let mut argv = vec![example.display().to_string()];
    argv.extend(args.iter().cloned());
    let opts = vm::Opts {
        nodes: 2,
        nics: 4,
        topology: true,
        timeout: Duration::from_secs(3600),
        expose: paths.vm_expose(),
        env: paths.cluster_env()?,
        ..vm::Opts::default()
    };
    let load_start = loadavg();
    let (nodes, _) = vm::run_past_emulator_fault(paths, &argv, &opts, false)?;
    let load_end = loadavg();
    let out = paths.target.join("bench");
    std::fs::create_dir_all(&out)?;
    let mut sender = String::new();
    let mut receiver = String::new();
    for n in &nodes {
        let file = out.join(format!("console-rails-{}.txt", n.node));
        std::fs::write(&file, &n.console)?;
        if !n.ok() {
            fail!(
                "node {}: the step ended with {:?}, kernel problems {:?} (console in {})",
                n.node,
                n.status,
                n.problems,
                file.display()
            );
        }
        match n.node {
            'b' => sender.clone_from(&n.console),
            _ => receiver.clone_from(&n.console),
        }
    }
    let rows: Vec<Fields> = results(&sender, "rails=").collect();
    let failover: Option<Fields> = results(&sender, "failover").next();
    let receiver_busy = results(&receiver, "receiver")
        .next()
        .map_or(f64::NAN, |f| num(&f, "vcpu_busy"));
    let mut counts: Vec<u64> = rows.iter().map(|r| num(r, "rails") as u64).collect();
    counts.dedup();
    if counts.is_empty() {
        fail!("no RESULT line from node b (consoles in {})", out.display());
    }
    println!(
        "\ntransfer engine over rails: two nodes, 1 MiB blocks; MiB/s of each batch (median, \
         min-max); bytes per link from tx_bytes"
    );
    println!(
        "{:>5}  {:>16}  {:>8}  {:>17}  {:>17}  {:>9}",
        "rails", "MiB/s", "x 1 rail", "bytes share %", "rate share %", "vCPU busy"
    );
    let mut table = Vec::new();
    let mut one = f64::NAN;
    for n in counts {
        let of_n: Vec<&Fields> = rows
            .iter()
            .filter(|r| num(r, "rails") as u64 == n)
            .collect();
        let bw: Vec<f64> = of_n.iter().map(|r| num(r, "MiBps")).collect();
        let (lo, hi) = (
            bw.iter().copied().fold(f64::INFINITY, f64::min),
            bw.iter().copied().fold(0.0, f64::max),
        );
        let med = median(bw.clone());
        if n == 1 {
            one = med;
        }
        let bytes: Vec<f64> = (0..n as usize)
            .map(|i| {
                median(
                    of_n.iter()
                        .filter_map(|r| list(r, "bytes").get(i).copied())
                        .collect(),
                )
            })
            .collect();
        let rates = list(of_n[0], "rates");
        let busy = median(of_n.iter().map(|r| num(r, "vcpu_busy")).collect());
        println!(
            "{n:>5}  {:>16}  {:>8.2}  {:>17}  {:>17}  {:>9.2}",
            format!("{med:.1} ({lo:.1}-{hi:.1})"),
            med / one,
            shares(&bytes),
            shares(&rates),
            busy
        );
        table.push(json!({
            "rails": n, "MiBps": bw, "median_MiBps": med, "vs_one_rail": med / one,
            "bytes_per_link": bytes, "link_rates_Mbps": rates, "sender_vcpu_busy": busy,
        }));
    }
    let bound = if rows.iter().any(|r| num(r, "vcpu_busy") >= 0.9) {
        "the sending node's vCPU (busy >= 0.9): the CPU, not the links, bounds the aggregate"
    } else {
        "no vCPU saturated: the links or the receiver bound the aggregate"
    };
    println!("receiving node's vCPU busy over the run: {receiver_busy:.2}; {bound}");
    if let Some(f) = &failover {
        println!(
            "failover ({} rails, rail 1 cut at half of the batch): half in {:.1} s, the rest \
             {:.1} s after the cut (uncut, the rest would take about {:.1} s at {:.1} MiB/s); \
             blocks done when the cut returned {}; bytes per link after the cut {}",
            f.get("rails").map_or("?", String::as_str),
            num(f, "half_s"),
            num(f, "rest_s"),
            num(f, "half_s"),
            num(f, "uncut_MiBps"),
            f.get("done_at_cut").map_or("?", String::as_str),
            f.get("cut_bytes").map_or("?", String::as_str)
        );
    }
    info(format!(
        "host load average (1, 5, 15 min) at start {load_start}, at end {load_end}"
    ));
    let doc = json!({
        "rails": table,
        "failover": failover,
        "receiver_vcpu_busy": receiver_busy,
        "load": [load_start, load_end],
    });
    let file = out.join("rails.json");
    std::fs::write(&file, serde_json::to_string_pretty(&doc)?)?;
    info(format!("every figure: {}", file.display()));
    Ok(ExitCode::SUCCESS)
}
