//! `cargo xtask bench`: RDMA write bandwidth and latency of rdma-dmabuf against perftest
//! (`ib_write_bw`, `ib_write_lat`) on the same rxe device in the same VM boot, as ratios.

use crate::sh::Result;
use crate::ui::info;
use crate::{fail, programs, script, vm, Paths};
use std::process::ExitCode;

// Rounds (interleaved perftest/ours), message size, iterations.
const ROUNDS: u32 = 3;
const SIZE: u32 = 65536;
const BW_ITERS: u32 = 2000;
const LAT_ITERS: u32 = 500;

/// Builds the bench (release), runs it beside perftest in one VM, prints the ratios.
pub fn main(paths: &Paths) -> Result<ExitCode> {
    let bench = paths.release_example("rdma_bench")?;
    let file = paths.testbed.join("bench.sh");
    programs::write_script(&file, script::BENCH)?;
    let argv: Vec<String> = [
        "sh".to_string(),
        file.display().to_string(),
        bench.display().to_string(),
        ROUNDS.to_string(),
        SIZE.to_string(),
        BW_ITERS.to_string(),
        LAT_ITERS.to_string(),
    ]
    .to_vec();
    let results = vm::run(paths, &argv, &vm::Opts::default())?;
    let r = &results[0];
    if !r.ok() {
        fail!("the bench run failed (see above)");
    }
    let m = parse(&r.console);
    let row = |name: &str, ours: &[f64], theirs: &[f64], unit: &str| -> Result<f64> {
        if ours.len() != ROUNDS as usize || theirs.len() != ROUNDS as usize {
            fail!("{name}: expected {ROUNDS} results each, got ours {ours:?}, perftest {theirs:?}");
        }
        let (o, t) = (median(ours), median(theirs));
        info(format!(
            "{name:<22} ours {o:>9.2} {unit:<6} perftest {t:>9.2} {unit:<6} ratio {:.3}",
            o / t
        ));
        Ok(o / t)
    };
    println!();
    info(format!(
        "RDMA write, {SIZE} B messages, rxe loopback, median of {ROUNDS} interleaved rounds"
    ));
    let bw = row("bandwidth", &m.ours_bw, &m.perf_bw, "MB/s")?;
    let lat = row("latency (one-way avg)", &m.ours_lat, &m.perf_lat, "usec")?;
    info(format!(
        "targets: bandwidth ratio >= 0.95 ({}), latency ratio <= 1.05 ({})",
        if bw >= 0.95 { "met" } else { "NOT met" },
        if lat <= 1.05 { "met" } else { "NOT met" }
    ));
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Default, PartialEq)]
struct Measured {
    perf_bw: Vec<f64>,
    ours_bw: Vec<f64>,
    perf_lat: Vec<f64>,
    ours_lat: Vec<f64>,
}

/// Reads the script's console: `### round N <who> <what>` headers, then perftest's result row
/// (the line starting with the message size) or our `RESULT` line.
fn parse(console: &str) -> Measured {
    let mut m = Measured::default();
    let mut section = String::new();
    for line in console.lines() {
        let line = line.trim();
        if let Some(h) = line.strip_prefix("### ") {
            section = h.to_string();
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        let perftest_row = cols.first() == Some(&SIZE.to_string().as_str()) && cols.len() >= 4;
        if section.ends_with("perftest bw") && perftest_row {
            // #bytes #iterations BW-peak BW-average MsgRate
            if let Ok(v) = cols[3].parse() {
                m.perf_bw.push(v);
            }
        } else if section.ends_with("perftest lat") && perftest_row && cols.len() >= 6 {
            // #bytes #iterations t_min t_max t_typical t_avg ...
            if let Ok(v) = cols[5].parse() {
                m.perf_lat.push(v);
            }
        } else if let Some(v) = line.strip_prefix("RESULT bw_MBps=") {
            m.ours_bw.extend(v.parse::<f64>().ok());
        } else if let Some(v) = line.strip_prefix("RESULT lat_usec=") {
            m.ours_lat.extend(v.parse::<f64>().ok());
        }
    }
    m
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_perftest_and_our_results() {
        let console = "\
### round 1 perftest bw
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             80.10              78.85              0.001262
### round 1 ours bw
RESULT bw_MBps=77.5
### round 1 perftest lat
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]
 65536       500          900.1        2000.0       950.2             960.5          10.0
### round 1 ours lat
RESULT lat_usec=990.0
";
        let m = parse(console);
        assert_eq!(m.perf_bw, [78.85]);
        assert_eq!(m.ours_bw, [77.5]);
        assert_eq!(m.perf_lat, [960.5]);
        assert_eq!(m.ours_lat, [990.0]);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
    }
}
