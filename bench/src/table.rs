//! The terminal report: for each metric a table of medians with their spread, then the goals
//! as ratios of medians at every size.

use crate::results::{spreads, Sample, Spread};
use crate::series::{Goal, Metric, GOALS, SERIES};
use crate::units::{nodes_name, num, size};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What a figure is, with its unit, for titles.
pub fn label(value: &str) -> &'static str {
    match value {
        "bw_MBps" => "RDMA write bandwidth, MiB/s",
        "mpps" => "RDMA write message rate, millions of messages/s",
        "lat_usec" => "RDMA write latency, one way, mean, usec",
        "typ_usec" => "RDMA write latency, one way, median (perftest's t_typical), usec",
        "reg_usec" => "registration time, median of the step's calls, usec",
        "dereg_usec" => "deregistration time, median of the step's calls, usec",
        "ins_per_write" => "user-space instructions per RDMA write (callgrind)",
        "batch_lat_usec" => "transfer engine: batch latency, one block per peer, median, usec",
        "allocs_per_chunk" => "transfer engine: allocations per chunk, every thread",
        _ => "figure",
    }
}

/// `median (min-max)`.
fn cell(s: &Spread) -> String {
    if s.n < 2 {
        return num(s.median);
    }
    format!("{} ({}-{})", num(s.median), num(s.min), num(s.max))
}

/// A table of `value` for `metric` on `nodes` nodes: a row per size, a column per series.
pub fn values(samples: &[Sample], metric: Metric, nodes: u8, value: &str) -> String {
    let sp = spreads(samples, metric, nodes, value);
    if sp.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = SERIES
        .iter()
        .filter(|s| s.metric == metric && sp.keys().any(|(n, _)| n == &s.name))
        .map(|s| s.name)
        .collect();
    let sizes: Vec<u64> = {
        let mut v: Vec<u64> = sp.keys().map(|(_, s)| *s).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let rounds = sp.values().map(|s| s.n).max().unwrap_or(0);
    let mut t = format!(
        "{} [{value}], {}: median (min-max) of {rounds} rounds\n",
        label(value),
        nodes_name(nodes)
    );
    let w = 24;
    let _ = write!(t, "  {:>8}", "size");
    for n in &names {
        let _ = write!(t, "  {n:<w$}");
    }
    t.push('\n');
    for s in sizes {
        let _ = write!(t, "  {:>8}", size(s));
        for n in &names {
            let c = sp.get(&(*n, s)).map(cell).unwrap_or_else(|| "-".into());
            let _ = write!(t, "  {c:<w$}");
        }
        t.push('\n');
    }
    t
}

/// The ratio of `goal` at each size (where both series have samples): the medians' ratio.
pub fn ratios(samples: &[Sample], goal: &Goal, nodes: u8) -> BTreeMap<u64, f64> {
    per_size(samples, goal, nodes, |s, b| {
        (b.median > 0.0).then(|| s.median / b.median)
    })
}

/// The lowest and highest of the per-round ratios at each size: each round's sample of the
/// series over the same round's sample of the base (taken minutes apart in the same boot, so
/// that what the machine was doing meanwhile weighs on both).
pub fn ratio_ranges(samples: &[Sample], goal: &Goal, nodes: u8) -> BTreeMap<u64, (f64, f64)> {
    let of = |name: &str| -> BTreeMap<(u64, u32), f64> {
        samples
            .iter()
            .filter(|s| s.nodes == nodes && SERIES[s.series].metric == goal.metric)
            .filter(|s| SERIES[s.series].name == name)
            .filter_map(|s| Some(((s.size, s.round), *s.values.get(goal.value(s.size))?)))
            .collect()
    };
    let (series, base) = (of(goal.series), of(goal.base));
    let mut out: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (key, x) in series
        .into_iter()
        .filter(|((size, _), _)| goal.applies(*size))
    {
        let Some(&b) = base.get(&key).filter(|&&b| b > 0.0) else {
            continue;
        };
        let r = x / b;
        let e = out.entry(key.0).or_insert((r, r));
        *e = (e.0.min(r), e.1.max(r));
    }
    out
}

/// `f(series' spread, base's spread)` at each size where both have samples.
fn per_size<T>(
    samples: &[Sample],
    goal: &Goal,
    nodes: u8,
    f: impl Fn(&Spread, &Spread) -> Option<T>,
) -> BTreeMap<u64, T> {
    let by_value: BTreeMap<&str, _> = [goal.value(1), goal.value(u64::MAX)]
        .into_iter()
        .map(|v| (v, spreads(samples, goal.metric, nodes, v)))
        .collect();
    let mut out = BTreeMap::new();
    for (v, sp) in &by_value {
        for (&(name, size), s) in sp {
            if name != goal.series || goal.value(size) != *v || !goal.applies(size) {
                continue;
            }
            if let Some(x) = sp.get(&(goal.base, size)).and_then(|b| f(s, b)) {
                out.insert(size, x);
            }
        }
    }
    out
}

/// What a goal cell says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The medians' ratio meets the bound, and no round's ratio says otherwise.
    Met,
    /// It misses the bound, and no round's ratio says otherwise.
    NotMet,
    /// The round-to-round spread is wider than the margin: some rounds' ratios meet the
    /// bound and others miss it, so the cell says neither.
    WithinNoise,
}

impl Verdict {
    /// The verdict on `ratio` (the medians'), given the `range` of the per-round ratios.
    pub fn of(goal: &Goal, ratio: f64, range: Option<(f64, f64)>) -> Verdict {
        if range.is_some_and(|(lo, hi)| goal.met(lo) != goal.met(hi)) {
            Verdict::WithinNoise
        } else if goal.met(ratio) {
            Verdict::Met
        } else {
            Verdict::NotMet
        }
    }

    /// As the JSON writes it.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "not met",
            Verdict::WithinNoise => "within noise",
        }
    }
}

/// Each size's ratio and verdict for `goal`.
pub fn verdicts(samples: &[Sample], goal: &Goal, nodes: u8) -> BTreeMap<u64, (f64, Verdict)> {
    let ranges = ratio_ranges(samples, goal, nodes);
    ratios(samples, goal, nodes)
        .into_iter()
        .map(|(size, x)| (size, (x, Verdict::of(goal, x, ranges.get(&size).copied()))))
        .collect()
}

/// A goal's ratio and verdict at each message size.
type BySize = BTreeMap<u64, (f64, Verdict)>;

/// The goals on `nodes` nodes: a row per size, a column per goal (`!` marks a miss, `~` a
/// cell within noise), then one line per goal saying where it is not met and where the
/// rounds cannot tell.
pub fn goals(samples: &[Sample], nodes: u8) -> String {
    let per: Vec<(&Goal, BySize)> = GOALS
        .iter()
        .map(|g| (g, verdicts(samples, g, nodes)))
        .filter(|(_, r)| !r.is_empty())
        .collect();
    if per.is_empty() {
        return String::new();
    }
    let mut t = format!(
        "goals, {}: ratios of medians, same boot (! not met; ~ within noise: some rounds' \
         ratios meet the bound, others miss it)\n",
        nodes_name(nodes)
    );
    for (i, (g, _)) in per.iter().enumerate() {
        let _ = writeln!(t, "  [{}] {}", i + 1, g.describe());
    }
    let _ = write!(t, "  {:>8}", "size");
    for i in 0..per.len() {
        let _ = write!(t, "  {:>7}", format!("[{}]", i + 1));
    }
    t.push('\n');
    let mut sizes: Vec<u64> = per.iter().flat_map(|(_, r)| r.keys().copied()).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for s in sizes {
        let _ = write!(t, "  {:>8}", size(s));
        for (_, r) in &per {
            let c = match r.get(&s) {
                Some(&(x, v)) => format!(
                    "{x:.2}{}",
                    match v {
                        Verdict::Met => " ",
                        Verdict::NotMet => "!",
                        Verdict::WithinNoise => "~",
                    }
                ),
                None => "-".into(),
            };
            let _ = write!(t, "  {c:>7}");
        }
        t.push('\n');
    }
    for (i, (_, r)) in per.iter().enumerate() {
        let at = |want: Verdict| -> Vec<String> {
            r.iter()
                .filter(|(_, &(_, v))| v == want)
                .map(|(&s, &(x, _))| format!("{} ({x:.2})", size(s)))
                .collect()
        };
        let (missed, noise) = (at(Verdict::NotMet), at(Verdict::WithinNoise));
        let met = r.len() - missed.len() - noise.len();
        let mut verdict = if missed.is_empty() && noise.is_empty() {
            format!("met at all {} sizes", r.len())
        } else if missed.is_empty() {
            format!("met at {met} of {} sizes", r.len())
        } else {
            format!(
                "NOT met at {} of {} sizes: {}",
                missed.len(),
                r.len(),
                missed.join(", ")
            )
        };
        if !noise.is_empty() {
            let _ = write!(
                verdict,
                "; within noise at {}: {}",
                noise.len(),
                noise.join(", ")
            );
        }
        let _ = writeln!(t, "  [{}] {verdict}", i + 1);
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(series: &str, metric: Metric, size: u64, round: u32, x: f64) -> Sample {
        let i = SERIES
            .iter()
            .position(|s| s.name == series && s.metric == metric)
            .unwrap();
        Sample {
            id: format!("{series}/{size}/{round}"),
            series: i,
            nodes: 1,
            size,
            round,
            iters: 5,
            values: [
                (metric.value().to_string(), x),
                ("mpps".to_string(), x / size as f64),
            ]
            .into_iter()
            .collect(),
        }
    }

    #[test]
    fn tables_show_spreads_and_goals_mark_misses() {
        let bw = Metric::Bandwidth;
        let s = vec![
            sample("perftest", bw, 8, 1, 10.0),
            sample("perftest", bw, 8, 2, 12.0),
            sample("perftest", bw, 8, 3, 11.0),
            sample("ours/host", bw, 8, 1, 9.0),
            sample("ours/host", bw, 8, 2, 10.0),
            sample("ours/host", bw, 8, 3, 8.0),
            sample("perftest", bw, 1 << 20, 1, 50.0),
            sample("ours/host", bw, 1 << 20, 1, 55.0),
        ];
        let t = values(&s, bw, 1, "bw_MBps");
        assert!(t.contains("11.00 (10.00-12.00)"), "{t}");
        assert!(t.contains("1 MiB"), "{t}");
        let g = goals(&s, 1);
        assert!(g.contains("0.82!"), "{g}");
        assert!(g.contains("1.10 "), "{g}");
        assert!(g.contains("NOT met at 1 of 2 sizes: 8 B (0.82)"), "{g}");
        // Rounds whose spread reaches across the bound say neither met nor missed.
        let mut n = s.clone();
        n[3] = sample("ours/host", bw, 8, 1, 10.5);
        let g = goals(&n, 1);
        assert!(g.contains("0.91~"), "{g}");
        assert!(
            g.contains("met at 1 of 2 sizes; within noise at 1: 8 B (0.91)"),
            "{g}"
        );
        assert_eq!(values(&s, Metric::Latency, 1, "lat_usec"), "");
        assert!(
            t.starts_with("RDMA write bandwidth, MiB/s [bw_MBps], one node"),
            "{t}"
        );
    }
}
