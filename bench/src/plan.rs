//! How a bench run measures: the sizes, rounds and budgets of a profile, and the plan of steps
//! that `bench.sh` runs ([`crate::series`] holds what is measured).

use crate::series::{Metric, Series, ENGINE_COUNT_CHUNK, ENGINE_SIZES, SERIES, VERBS_CRATES};
use std::fmt::Write as _;

/// How much a run measures.
#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// 1: rxe loopback in one VM; 2: two VMs and the emulated wire.
    pub nodes: u8,
    /// Message sizes in bytes.
    pub sizes: Vec<u64>,
    /// Rounds: each runs every series at every size once.
    pub rounds: u32,
    /// Bytes a bandwidth step moves (iterations: this over the size, within the bounds).
    pub bw_bytes: u64,
    /// Most messages in a bandwidth step.
    pub bw_max: u64,
    /// Bytes a latency step moves each way.
    pub lat_bytes: u64,
    /// Most round trips in a latency step.
    pub lat_max: u64,
    /// Registrations in a registration step.
    pub reg_iters: u64,
    /// The sizes of `sizes` whose instructions per write are counted (none on two nodes).
    /// Counted in the first round only: the count is deterministic.
    pub cost_sizes: Vec<u64>,
    /// Only the series marked for `--quick`.
    pub quick: bool,
    /// Only the series whose name starts with one of these (`--only`); empty: every series.
    pub only: Vec<String>,
}

/// perftest takes no fewer iterations.
const MIN_ITERS: u64 = 5;
/// Every size of a full run, as powers of two: 2 B to 8 MiB.
pub const ALL_SIZES: std::ops::RangeInclusive<u32> = 1..=23;
/// The largest message of the two-node run: 8 MiB, as in the one-node run (the testbed's
/// QEMU 10 has not shown the emulator fault that grows with the bytes moved; docs/testbed.md).
pub const TWO_NODE_MAX: u64 = 8 << 20;
/// The largest size whose instructions per write a one-node run counts.
pub const COST_MAX: u64 = 64 << 10;
/// The smallest write the Rust verbs crates' loops (`bench/verbs-crates`) take: each writes
/// its iteration's number, 8 bytes.
pub const VERBS_CRATES_MIN_SIZE: u64 = 8;
/// The sizes a full one-node run counts at: a few, since each count is two runs under
/// callgrind (tens of seconds each in the emulated VM) and the count barely moves with size.
pub const FULL_COST_SIZES: [u64; 5] = [8, 64, 512, 4 << 10, COST_MAX];
/// Iterations of the two runs of a count (`bench.sh`'s `cost` step): a write's count is the
/// difference over the difference, so that start-up and tear-down drop out (as in
/// tests/tests/rdma/rdma_cost.rs).
pub const COST_ITERS: [u64; 2] = [10, 60];
/// Chunks of the short batch of the engine's allocation count (the long one has four times
/// as many).
pub const ENGINE_COUNT_CHUNKS: u64 = 256;

impl Profile {
    /// Every power of two from 2 B to 8 MiB, three rounds (one node); every other power of
    /// two from 2 B to 8 MiB with small budgets (two nodes).
    pub fn full(nodes: u8) -> Profile {
        if nodes > 1 {
            return Profile {
                nodes,
                sizes: ALL_SIZES
                    .step_by(2)
                    .map(|p| 1 << p)
                    .filter(|&s| s <= TWO_NODE_MAX)
                    .collect(),
                rounds: 3,
                bw_bytes: 1 << 20,
                bw_max: 500,
                lat_bytes: 256 << 10,
                lat_max: 100,
                reg_iters: 0,
                cost_sizes: Vec::new(),
                quick: false,
                only: Vec::new(),
            };
        }
        Profile {
            nodes,
            sizes: ALL_SIZES.map(|p| 1 << p).collect(),
            rounds: 3,
            bw_bytes: 32 << 20,
            bw_max: 2000,
            lat_bytes: 4 << 20,
            lat_max: 300,
            reg_iters: 10,
            cost_sizes: FULL_COST_SIZES.to_vec(),
            quick: false,
            only: Vec::new(),
        }
    }

    /// A small message and a large one, three rounds, small budgets, host and GPU regions
    /// only: minutes on two cores.
    pub fn quick(nodes: u8) -> Profile {
        Profile {
            nodes,
            sizes: vec![8, 64 << 10],
            rounds: 3,
            bw_bytes: 4 << 20,
            bw_max: 300,
            lat_bytes: 512 << 10,
            lat_max: 40,
            reg_iters: if nodes > 1 { 0 } else { 5 },
            cost_sizes: if nodes > 1 { vec![] } else { vec![8, 64 << 10] },
            quick: true,
            only: Vec::new(),
        }
    }

    /// Iterations of a `metric` step at `size`.
    pub fn iters(&self, metric: Metric, size: u64) -> u64 {
        let fit =
            |bytes: u64, most: u64| (bytes / size.max(1)).clamp(MIN_ITERS, most.max(MIN_ITERS));
        match metric {
            Metric::Bandwidth => fit(self.bw_bytes, self.bw_max),
            Metric::Latency => fit(self.lat_bytes, self.lat_max),
            Metric::Registration => self.reg_iters.max(1),
            Metric::Instructions => COST_ITERS[1],
            Metric::Allocations => ENGINE_COUNT_CHUNKS,
        }
    }

    /// Whether `--only` lets `series` run.
    pub fn picks(&self, series: &Series) -> bool {
        self.only.is_empty()
            || self
                .only
                .iter()
                .any(|o| series.name.starts_with(o.as_str()))
    }

    /// Seconds a step of `series` at `size` may take: [`Profile::limit`], and for the
    /// engine's bandwidth its latency batches' bytes at the same rate and its agents' start.
    pub fn step_limit(&self, series: &Series, size: u64) -> u64 {
        let base = self.limit(series.metric, size);
        if series.engine() && series.metric == Metric::Bandwidth {
            (base + 30 + 3 * 6 * size / (512 << 10)).min(600)
        } else {
            base
        }
    }

    /// Seconds a step may take (each of its processes, and the wait for its server): a minute
    /// to start, plus its bytes at 0.5 MiB/s, plus 50 ms a round trip; at most ten minutes.
    /// A count: five minutes for each run under callgrind.
    pub fn limit(&self, metric: Metric, size: u64) -> u64 {
        if metric.counted() {
            return 300;
        }
        let iters = self.iters(metric, size);
        let bytes = iters * size * if metric == Metric::Latency { 2 } else { 1 };
        let trips = if metric == Metric::Latency {
            iters / 20
        } else {
            0
        };
        (60 + bytes / (512 << 10) + trips).min(600)
    }
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Unique in the plan: `<nodes>n/r<round>/<metric>/<series>/<size>`.
    pub id: String,
    /// Index in [`SERIES`].
    pub series: usize,
    /// Message size.
    pub size: u64,
    /// Round, from 1.
    pub round: u32,
    /// Iterations.
    pub iters: u64,
    /// Node count.
    pub nodes: u8,
}

/// The steps of `profile`: round after round, size after size, every series in table order,
/// so that perftest and ours run side by side in time. The engine's series run at
/// [`ENGINE_SIZES`]; its counts (allocations, instructions) once, in the first round at the
/// first of them, with chunks of [`ENGINE_COUNT_CHUNK`].
pub fn steps(profile: &Profile) -> Vec<Step> {
    let mut out = Vec::new();
    let first_engine_size = profile
        .sizes
        .iter()
        .copied()
        .find(|s| ENGINE_SIZES.contains(s));
    for round in 1..=profile.rounds {
        for &size in &profile.sizes {
            for (i, s) in SERIES.iter().enumerate() {
                if (profile.nodes > 1 && (!s.two_node || s.local()))
                    || (profile.quick && !s.quick)
                    || !profile.picks(s)
                {
                    continue;
                }
                if s.metric == Metric::Registration && profile.reg_iters == 0 {
                    continue;
                }
                if s.engine() && !ENGINE_SIZES.contains(&size) {
                    continue;
                }
                if s.metric == Metric::Instructions
                    && !s.engine()
                    && (round > 1 || !profile.cost_sizes.contains(&size))
                {
                    continue;
                }
                // The Rust verbs crates' loops write the iteration's number: 8 bytes at least.
                if VERBS_CRATES.contains(&s.program) && size < VERBS_CRATES_MIN_SIZE {
                    continue;
                }
                let size = if s.engine() && s.metric.counted() {
                    if round > 1 || Some(size) != first_engine_size {
                        continue;
                    }
                    ENGINE_COUNT_CHUNK
                } else {
                    size
                };
                let iters = profile.iters(s.metric, size);
                out.push(Step {
                    id: format!(
                        "{}n/r{round}/{}/{}/{size}",
                        profile.nodes,
                        s.metric.key(),
                        s.name
                    ),
                    series: i,
                    size,
                    round,
                    iters,
                    nodes: profile.nodes,
                });
            }
        }
    }
    out
}

/// The plan file `bench.sh` reads: one line per step (a count's iterations are those of its
/// two runs, `10,60`).
pub fn plan_text(profile: &Profile, steps: &[Step]) -> String {
    let mut t = String::from("# kind id limit program size iters args\n");
    for st in steps {
        let s = &SERIES[st.series];
        let iters = match s.metric {
            Metric::Instructions => format!("{},{}", COST_ITERS[0], st.iters),
            _ => st.iters.to_string(),
        };
        let _ = writeln!(
            t,
            "{} {} {} {} {} {iters} {}",
            s.kind(),
            st.id,
            profile.step_limit(s, st.size),
            s.program,
            st.size,
            s.args
        );
    }
    t
}

/// Parses `--sizes 8,64K,1M` (bytes with an optional K or M suffix, powers of 1024).
///
/// # Errors
/// A size that does not parse, is 0 or is past 8 MiB.
pub fn parse_sizes(list: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for w in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let (digits, shift) = match w.to_ascii_uppercase() {
            u if u.ends_with('K') => (w[..w.len() - 1].to_string(), 10),
            u if u.ends_with('M') => (w[..w.len() - 1].to_string(), 20),
            _ => (w.to_string(), 0),
        };
        let n: u64 = digits
            .parse()
            .map_err(|_| format!("--sizes: {w:?} is not a size like 8, 64K or 1M"))?;
        let n = n << shift;
        if n == 0 || n > 8 << 20 {
            return Err(format!("--sizes: {w} is outside 1 B..8 MiB"));
        }
        out.push(n);
    }
    if out.is_empty() {
        return Err("--sizes: no size given".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
