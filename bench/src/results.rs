//! Reading what `bench.sh` printed: each step's status and figures, as samples and failures,
//! and the spread (min, median, max) of a set of samples.

use crate::plan::Step;
use crate::series::{Metric, SERIES};
use std::collections::BTreeMap;

/// One step's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The step's id.
    pub id: String,
    /// Index in [`SERIES`].
    pub series: usize,
    /// Node count.
    pub nodes: u8,
    /// Message size.
    pub size: u64,
    /// Round, from 1.
    pub round: u32,
    /// Iterations.
    pub iters: u64,
    /// Figures by name (`bw_MBps`, `mpps`, `lat_usec`, `typ_usec`, `reg_usec`, `dereg_usec`),
    /// and `step_secs`, the step's wall time (processes started, connected, measured).
    pub values: BTreeMap<String, f64>,
}

/// A step that failed, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    /// The step's id.
    pub id: String,
    /// What went wrong.
    pub why: String,
}

/// What one step printed on one node.
#[derive(Debug, Default, PartialEq)]
struct Printed {
    lines: Vec<String>,
    /// `client=` and `server=` of the end line; `None` until the end line is seen.
    end: Option<(String, String)>,
    /// `secs=` of the end line: the step's wall time on this node.
    secs: Option<f64>,
}

/// Every step's output on one node's console, by id.
fn printed(console: &str) -> BTreeMap<String, Printed> {
    let mut out: BTreeMap<String, Printed> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in console.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(rest) = line.strip_prefix("### step ") {
            let mut w = rest.split_whitespace();
            let (Some(id), Some(what)) = (w.next(), w.next()) else {
                continue;
            };
            let entry = out.entry(id.to_string()).or_default();
            if what == "end" {
                let field = |name: &str| {
                    rest.split_whitespace()
                        .find_map(|x| x.strip_prefix(name))
                        .unwrap_or("?")
                        .to_string()
                };
                entry.end = Some((field("client="), field("server=")));
                entry.secs = field("secs=").parse().ok();
                current = None;
            } else {
                current = Some(id.to_string());
            }
        } else if let Some(id) = &current {
            if let Some(p) = out.get_mut(id) {
                p.lines.push(line.to_string());
            }
        }
    }
    out
}

/// Why a status is a failure (`-`: that side did not run on this node).
fn bad(side: &str, rc: &str) -> Option<String> {
    match rc {
        "0" | "-" => None,
        "124" | "137" => Some(format!("{side} timed out")),
        "ready" => Some("the server never became ready".into()),
        other => Some(format!("{side} exited with status {other}")),
    }
}

/// The samples and failures of `steps`, read from the consoles of a run (one per node; with
/// two nodes, node a's first: it runs the servers, node b the clients).
pub fn collect(steps: &[Step], consoles: &[&str]) -> (Vec<Sample>, Vec<Failure>) {
    let nodes: Vec<_> = consoles.iter().map(|c| printed(c)).collect();
    let mut samples = Vec::new();
    let mut failures = Vec::new();
    for st in steps {
        let mut why = Vec::new();
        let mut client_lines: &[String] = &[];
        let mut secs = None;
        for (n, node) in nodes.iter().enumerate() {
            match node
                .get(&st.id)
                .and_then(|p| p.end.as_ref().map(|e| (p, e)))
            {
                None => why.push(if nodes.len() > 1 {
                    format!("did not finish on node {}", ['a', 'b'][n.min(1)])
                } else {
                    "did not finish (the VM stopped first)".into()
                }),
                Some((p, (client, server))) => {
                    why.extend(bad("client", client));
                    why.extend(bad("server", server));
                    if client != "-" {
                        client_lines = &p.lines;
                        secs = p.secs;
                    }
                }
            }
        }
        if why.is_empty() {
            match values(
                SERIES[st.series].metric,
                SERIES[st.series].program,
                st.size,
                client_lines,
            ) {
                Ok(mut values) => samples.push(Sample {
                    values: {
                        values.extend(secs.map(|t| ("step_secs".to_string(), t)));
                        values
                    },
                    id: st.id.clone(),
                    series: st.series,
                    nodes: st.nodes,
                    size: st.size,
                    round: st.round,
                    iters: st.iters,
                }),
                Err(e) => why.push(e),
            }
        }
        if !why.is_empty() {
            why.dedup();
            failures.push(Failure {
                id: st.id.clone(),
                why: why.join("; "),
            });
        }
    }
    (samples, failures)
}

/// The figures in a client's output: perftest's result row (the line that starts with the
/// message size) or rdma_bench's `RESULT key=value ...` line.
fn values(
    metric: Metric,
    program: &str,
    size: u64,
    lines: &[String],
) -> Result<BTreeMap<String, f64>, String> {
    let mut v = BTreeMap::new();
    if program.starts_with("ib_write_") {
        let size = size.to_string();
        let row = lines
            .iter()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|c| c.first() == Some(&size.as_str()) && c.len() >= 5)
            .ok_or_else(|| format!("no result row for {size} B in {program}'s output"))?;
        // ib_write_bw: #bytes #iterations BW-peak BW-average MsgRate[Mpps]
        // ib_write_lat: #bytes #iterations t_min t_max t_typical t_avg ...
        let cols: &[(&str, usize)] = match metric {
            Metric::Bandwidth => &[("bw_MBps", 3), ("mpps", 4)],
            _ => &[("typ_usec", 4), ("lat_usec", 5)],
        };
        for &(name, at) in cols {
            let x: f64 = row
                .get(at)
                .and_then(|c| c.parse().ok())
                .ok_or_else(|| format!("{program}'s row has no number in column {at}: {row:?}"))?;
            if !x.is_finite() {
                // perftest times with the CPU's cycle counter, calibrated at start; under load
                // the calibration can fail ("Correlation coefficient r^2: ... < 0.9").
                return Err(format!(
                    "{program} printed {x} for {name} (its CPU-clock calibration failed, as \
                     happens under load)"
                ));
            }
            v.insert(name.to_string(), x);
        }
    } else {
        let line = lines
            .iter()
            .rev()
            .find_map(|l| l.trim().strip_prefix("RESULT "))
            .ok_or("no RESULT line in rdma_bench's output")?;
        for (k, x) in line.split_whitespace().filter_map(|w| w.split_once('=')) {
            if let Ok(x) = x.parse::<f64>() {
                v.insert(k.to_string(), x);
            }
        }
        if metric == Metric::Instructions {
            let per_write = per_write(&v)?;
            v.insert(metric.value().to_string(), per_write);
        }
    }
    if !v.get(metric.value()).is_some_and(|x| x.is_finite()) {
        return Err(format!("no {} in the output", metric.value()));
    }
    Ok(v)
}

/// Instructions per write from a `cost` step's two counts (`bench.sh`): the difference of the
/// counts over the difference of the iterations, over the writes an iteration posts.
fn per_write(v: &BTreeMap<String, f64>) -> Result<f64, String> {
    let get = |k: &str| {
        v.get(k)
            .copied()
            .ok_or(format!("no {k} in the count's RESULT line"))
    };
    let (short, long) = (get("ins_short")?, get("ins_long")?);
    let iters = get("iters_long")? - get("iters_short")?;
    let writes = v.get("writes_per_iter").copied().unwrap_or(1.0);
    if !(long > short && short > 0.0 && iters > 0.0 && writes >= 1.0) {
        return Err(format!(
            "callgrind counted {short} then {long} instructions over {iters} more iterations"
        ));
    }
    Ok((long - short) / iters / writes)
}

/// Min, median and max of a set of figures.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// The smallest.
    pub min: f64,
    /// The median (the mean of the middle two for an even count).
    pub median: f64,
    /// The largest.
    pub max: f64,
    /// How many.
    pub n: usize,
}

impl Spread {
    /// The spread of `v`; `None` if it is empty.
    pub fn of(v: &[f64]) -> Option<Spread> {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return None;
        }
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Some(Spread {
            min: s[0],
            median,
            max: s[n - 1],
            n,
        })
    }
}

/// The spread of `value` for each (series name, size) of `metric` on `nodes` nodes.
pub fn spreads(
    samples: &[Sample],
    metric: Metric,
    nodes: u8,
    value: &str,
) -> BTreeMap<(&'static str, u64), Spread> {
    let mut by: BTreeMap<(&'static str, u64), Vec<f64>> = BTreeMap::new();
    for s in samples
        .iter()
        .filter(|s| s.nodes == nodes && SERIES[s.series].metric == metric)
    {
        if let Some(&x) = s.values.get(value) {
            by.entry((SERIES[s.series].name, s.size))
                .or_default()
                .push(x);
        }
    }
    by.into_iter()
        .filter_map(|(k, v)| Some((k, Spread::of(&v)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{steps, Profile};

    const CONSOLE: &str = "\
### step 1n/r1/bw/perftest/8 begin
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 8          300              0.10               0.08               0.010485
### step 1n/r1/bw/perftest/8 end client=0 server=0
### step 1n/r1/bw/ours/host/8 begin
RESULT bw_MBps=0.090 mpps=0.011796 region=host
### step 1n/r1/bw/ours/host/8 end client=0 server=0 secs=2.05
### step 1n/r1/lat/perftest/8 begin
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]
 8       40          69.42          24509.25      4023.26  	       4854.90     	3605.50
### step 1n/r1/lat/perftest/8 end client=0 server=0
### step 1n/r1/lat/ours/host/8 begin
Couldn't connect to 169.254.20.1:18803
### step 1n/r1/lat/ours/host/8 end client=124 server=1
  server| error: side channel
### step 1n/r1/reg/ours/heap/8 begin
RESULT reg_usec=31.5 dereg_usec=12.25 region=heap
### step 1n/r1/reg/ours/heap/8 end client=0 server=-
### step 1n/r1/bw/ours/gpu/8 begin
RESULT nothing=1
### step 1n/r1/bw/ours/gpu/8 end client=0 server=0
### step 1n/r1/lat/ours/heap/8 begin
### step 1n/r1/lat/ours/udmabuf/8 begin
 8       40          inf            inf          inf      	       inf         	-nan
### step 1n/r1/lat/ours/udmabuf/8 end client=0 server=0 secs=9.84
### step 1n/r1/ins/ours/batch/8 begin
RESULT ins_short=58500 ins_long=300500 iters_short=10 iters_long=60 writes_per_iter=16
### step 1n/r1/ins/ours/batch/8 end client=0 server=- secs=40.12
### step 1n/r1/ins/c/8 begin
  cost 10| valgrind: failed to start tool 'callgrind'
bench.sh: no count of cost_floor under callgrind (status 1)
### step 1n/r1/ins/c/8 end client=1 server=- secs=1.50
### step 1n/r1/ins/ours/owned/8 begin
RESULT ins_short=9000 ins_long=9000 iters_short=10 iters_long=60 writes_per_iter=1
### step 1n/r1/ins/ours/owned/8 end client=0 server=- secs=30.00
";

    #[test]
    fn samples_and_failures_are_read_from_the_console() {
        let st = steps(&Profile::full(1));
        let wanted: Vec<_> = st
            .iter()
            .filter(|s| s.round == 1 && s.size == 8)
            .cloned()
            .collect();
        let (samples, failures) = collect(&wanted, &[CONSOLE]);
        let get = |id: &str| {
            samples
                .iter()
                .find(|s| s.id == id)
                .map(|s| s.values.clone())
        };
        let pt = get("1n/r1/bw/perftest/8").unwrap();
        assert_eq!(pt["bw_MBps"], 0.08);
        assert_eq!(pt["mpps"], 0.010485);
        assert_eq!(get("1n/r1/bw/ours/host/8").unwrap()["bw_MBps"], 0.09);
        assert_eq!(get("1n/r1/bw/ours/host/8").unwrap()["step_secs"], 2.05);
        let lat = get("1n/r1/lat/perftest/8").unwrap();
        assert_eq!((lat["typ_usec"], lat["lat_usec"]), (4023.26, 4854.90));
        assert_eq!(get("1n/r1/reg/ours/heap/8").unwrap()["dereg_usec"], 12.25);
        let why = |id: &str| failures.iter().find(|f| f.id == id).map(|f| f.why.clone());
        assert_eq!(
            why("1n/r1/lat/ours/host/8").unwrap(),
            "client timed out; server exited with status 1"
        );
        assert_eq!(
            why("1n/r1/bw/ours/gpu/8").unwrap(),
            "no bw_MBps in the output"
        );
        assert_eq!(
            why("1n/r1/lat/ours/heap/8").unwrap(),
            "did not finish (the VM stopped first)"
        );
        // (A perftest row under an rdma_bench step's id: read as rdma_bench's, no RESULT.)
        assert_eq!(
            why("1n/r1/lat/ours/udmabuf/8").unwrap(),
            "no RESULT line in rdma_bench's output"
        );
        let inf = [" 8 40 1.0 2.0 inf inf".to_string()];
        let e = values(Metric::Latency, "ib_write_lat", 8, &inf).unwrap_err();
        assert!(e.contains("printed inf for typ_usec"), "{e}");
        // A count: the difference over 50 iterations of 16 writes; a failed or empty one named.
        assert_eq!(
            get("1n/r1/ins/ours/batch/8").unwrap()["ins_per_write"],
            242000.0 / 50.0 / 16.0
        );
        assert_eq!(why("1n/r1/ins/c/8").unwrap(), "client exited with status 1");
        assert_eq!(
            why("1n/r1/ins/ours/owned/8").unwrap(),
            "callgrind counted 9000 then 9000 instructions over 50 more iterations"
        );
        // Every step is a sample or a failure.
        assert_eq!(samples.len() + failures.len(), wanted.len());
    }

    #[test]
    fn two_nodes_take_figures_from_the_client_and_status_from_both() {
        let a = "### step x begin\n### step x end client=- server=0\n\
                 ### step y begin\n### step y end client=- server=124\n";
        let b = "### step x begin\nRESULT bw_MBps=5 mpps=1\n### step x end client=0 server=-\n\
                 ### step y begin\nRESULT bw_MBps=5\n### step y end client=0 server=-\n";
        let mk = |id: &str| Step {
            id: id.into(),
            series: 1,
            size: 8,
            round: 1,
            iters: 5,
            nodes: 2,
        };
        let (s, f) = collect(&[mk("x"), mk("y"), mk("z")], &[a, b]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].values["bw_MBps"], 5.0);
        assert_eq!(f[0].why, "server timed out");
        assert_eq!(
            f[1].why,
            "did not finish on node a; did not finish on node b"
        );
    }

    #[test]
    fn spreads_are_min_median_max() {
        assert_eq!(Spread::of(&[]), None);
        let s = Spread::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.n), (1.0, 2.0, 3.0, 3));
        assert_eq!(Spread::of(&[4.0, 1.0]).unwrap().median, 2.5);
        assert_eq!(Spread::of(&[f64::NAN, 1.0]).unwrap().n, 1);
    }
}
