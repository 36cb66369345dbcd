//! What a bench run measures: the series (a column of the table and a line of a plot each),
//! the goals, the sizes, rounds and budgets, and the plan file that `bench.sh` runs.
//!
//! A new series is one entry in [`SERIES`] (and, if it needs one, a mode of `rdma_bench`).

use std::fmt::Write as _;

/// What a series measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// RDMA write bandwidth (and message rate), one way.
    Bandwidth,
    /// RDMA write latency, one way (half a ping-pong's round trip).
    Latency,
    /// Memory-region registration (and deregistration) time.
    Registration,
}

impl Metric {
    /// Every metric, in report order.
    pub const ALL: [Metric; 3] = [Metric::Bandwidth, Metric::Latency, Metric::Registration];

    /// Short name, used in step ids, files and JSON.
    pub fn key(self) -> &'static str {
        match self {
            Metric::Bandwidth => "bw",
            Metric::Latency => "lat",
            Metric::Registration => "reg",
        }
    }

    /// The sample value the table, the plots and the goals use.
    pub fn value(self) -> &'static str {
        match self {
            Metric::Bandwidth => "bw_MBps",
            Metric::Latency => "lat_usec",
            Metric::Registration => "reg_usec",
        }
    }

    /// The value's unit.
    pub fn unit(self) -> &'static str {
        match self {
            Metric::Bandwidth => "MiB/s",
            Metric::Latency | Metric::Registration => "usec",
        }
    }

    /// What the value is, for titles.
    pub fn title(self) -> &'static str {
        match self {
            Metric::Bandwidth => "RDMA write bandwidth",
            Metric::Latency => "RDMA write latency (one way, mean)",
            Metric::Registration => "memory-region registration time (median)",
        }
    }
}

/// One series.
#[derive(Debug)]
pub struct Series {
    /// Its name in the table, the plots and the JSON: `perftest`, or `ours/<region kind>`.
    pub name: &'static str,
    /// What it measures.
    pub metric: Metric,
    /// `ib_write_bw`, `ib_write_lat` or `rdma_bench`.
    pub program: &'static str,
    /// Arguments for both sides (for a local step: all of its arguments).
    pub args: &'static str,
    /// Whether the two-node run has it too (it moves bytes over the emulated wire, where
    /// every byte counts: see docs/testbed.md, "Emulator faults").
    pub two_node: bool,
    /// Whether `--quick` runs it (host memory and the GPU stand-in; the other dma-buf kinds
    /// and variants only in full runs).
    pub quick: bool,
}

impl Series {
    /// Whether it is one process (registration) rather than a server and a client.
    pub fn local(&self) -> bool {
        self.metric == Metric::Registration
    }
}

/// Where a series runs besides full one-node runs.
#[derive(Clone, Copy)]
enum Also {
    /// Nowhere else.
    No,
    /// In `--quick` runs.
    Quick,
    /// In `--quick` runs and across two nodes.
    QuickTwoNode,
}

const fn series(
    name: &'static str,
    metric: Metric,
    program: &'static str,
    args: &'static str,
    also: Also,
) -> Series {
    Series {
        name,
        metric,
        program,
        args,
        two_node: matches!(also, Also::QuickTwoNode),
        quick: !matches!(also, Also::No),
    }
}

use Also::{No, Quick, QuickTwoNode};
use Metric::{Bandwidth, Latency, Registration};

/// Every series, in the order each round runs them at each size: perftest first, ours beside
/// it, then the dma-buf kinds.
pub const SERIES: &[Series] = &[
    series("perftest", Bandwidth, "ib_write_bw", "", QuickTwoNode),
    series(
        "ours/host",
        Bandwidth,
        "rdma_bench",
        "--mode bw --region host",
        QuickTwoNode,
    ),
    series(
        "ours/udmabuf",
        Bandwidth,
        "rdma_bench",
        "--mode bw --region udmabuf",
        No,
    ),
    series(
        "ours/heap",
        Bandwidth,
        "rdma_bench",
        "--mode bw --region heap",
        No,
    ),
    series(
        "ours/gpu",
        Bandwidth,
        "rdma_bench",
        "--mode bw --region gpu",
        QuickTwoNode,
    ),
    // Each write gathers 16 blocks of the size (the shards of one region), beside one write
    // per block (ours/host above, whose message rate counts the same blocks).
    series(
        "ours/host+gather16",
        Bandwidth,
        "rdma_bench",
        "--mode gather --region host",
        Quick,
    ),
    // Batched completions: 16 writes a post, only the last signalled, every region back with
    // its batch's completion (perftest signals one write in a hundred).
    series(
        "ours/host+batch",
        Bandwidth,
        "rdma_bench",
        "--mode batch --region host",
        QuickTwoNode,
    ),
    // The same writes awaited on a tokio runtime (woken by the completion channel) instead
    // of busy-polled: the async path's cost (issue 16).
    series(
        "ours/host+async",
        Bandwidth,
        "rdma_bench",
        "--mode bw --async yes --region host",
        Quick,
    ),
    // perftest sends nothing inline on rxe ("Max inline data : 0[B]"), so neither do we;
    // ours/host+inline shows what inline pings would change.
    series("perftest", Latency, "ib_write_lat", "", QuickTwoNode),
    series(
        "ours/host",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --region host",
        QuickTwoNode,
    ),
    // No receive completion: each side watches the last byte of its region for the peer's
    // sequence number, as ib_write_lat polls its buffer.
    series(
        "ours/host+poll",
        Latency,
        "rdma_bench",
        "--mode lat-poll --inline no --region host",
        QuickTwoNode,
    ),
    series(
        "ours/host+async",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --async yes --region host",
        Quick,
    ),
    series(
        "ours/host+inline",
        Latency,
        "rdma_bench",
        "--mode lat --inline auto --region host",
        No,
    ),
    series(
        "ours/udmabuf",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --region udmabuf",
        No,
    ),
    series(
        "ours/heap",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --region heap",
        No,
    ),
    series(
        "ours/gpu",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --region gpu",
        QuickTwoNode,
    ),
    series(
        "ours/host",
        Registration,
        "rdma_bench",
        "reg --region host",
        Quick,
    ),
    series(
        "ours/udmabuf",
        Registration,
        "rdma_bench",
        "reg --region udmabuf",
        No,
    ),
    series(
        "ours/heap",
        Registration,
        "rdma_bench",
        "reg --region heap",
        No,
    ),
    series(
        "ours/gpu",
        Registration,
        "rdma_bench",
        "reg --region gpu",
        Quick,
    ),
];

/// A goal: the median of `series` over the median of `base`, at every size.
#[derive(Debug)]
pub struct Goal {
    /// What is compared.
    pub metric: Metric,
    /// The series measured.
    pub series: &'static str,
    /// The series it is measured against.
    pub base: &'static str,
    /// The bound on the ratio.
    pub bound: f64,
    /// Whether the ratio must be at least (`true`) or at most (`false`) the bound.
    pub at_least: bool,
}

impl Goal {
    /// The figure compared at `size`. For bandwidth below 4 KiB, the message rate: at one
    /// size it is the same ratio, and perftest prints it to six decimals where its MB/s has
    /// two (0.01 MB/s steps for the smallest messages); from 4 KiB on, MB/s, whose two decimals
    /// are then finer than the message rate's six (one message a second is 0.000001 Mpps).
    pub fn value(&self, size: u64) -> &'static str {
        match self.metric {
            Metric::Bandwidth if size < 4096 => "mpps",
            m => m.value(),
        }
    }

    /// Whether `ratio` meets it.
    pub fn met(&self, ratio: f64) -> bool {
        if self.at_least {
            ratio >= self.bound
        } else {
            ratio <= self.bound
        }
    }

    /// `ours/host / perftest >= 1.00`.
    pub fn describe(&self) -> String {
        format!(
            "{} {} / {} {} {:.2}",
            self.metric.key(),
            self.series,
            self.base,
            if self.at_least { ">=" } else { "<=" },
            self.bound
        )
    }
}

const fn goal(metric: Metric, series: &'static str, base: &'static str, bound: f64) -> Goal {
    Goal {
        metric,
        series,
        base,
        bound,
        at_least: matches!(metric, Metric::Bandwidth),
    }
}

/// The goals of issues 17, 16 (async) and 28 (batched completions, latency without a receive
/// completion), as ratios of medians taken in the same boot.
pub const GOALS: &[Goal] = &[
    goal(Bandwidth, "ours/host", "perftest", 1.00),
    goal(Latency, "ours/host", "perftest", 1.00),
    goal(Bandwidth, "ours/udmabuf", "ours/host", 0.98),
    goal(Bandwidth, "ours/heap", "ours/host", 0.98),
    goal(Bandwidth, "ours/gpu", "ours/host", 0.98),
    goal(Registration, "ours/udmabuf", "ours/host", 1.10),
    goal(Registration, "ours/heap", "ours/host", 1.10),
    goal(Registration, "ours/gpu", "ours/host", 1.10),
    goal(Bandwidth, "ours/host+async", "ours/host", 0.95),
    goal(Bandwidth, "ours/host+batch", "perftest", 1.00),
    goal(Latency, "ours/host+poll", "perftest", 1.00),
];

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
    /// Only the series marked for `--quick`.
    pub quick: bool,
}

/// perftest takes no fewer iterations.
const MIN_ITERS: u64 = 5;
/// Every size of issue 17: 2 B to 8 MiB.
pub const ALL_SIZES: std::ops::RangeInclusive<u32> = 1..=23;
/// The largest message of the two-node run: 8 MiB, as in the one-node run (it was 1 MiB while
/// QEMU 7.2's TCG fault grew with the bytes moved; docs/testbed.md).
pub const TWO_NODE_MAX: u64 = 8 << 20;

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
                quick: false,
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
            quick: false,
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
            quick: true,
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
        }
    }

    /// Seconds a step may take (each of its processes, and the wait for its server): a minute
    /// to start, plus its bytes at 0.5 MiB/s, plus 50 ms a round trip; at most ten minutes.
    pub fn limit(&self, metric: Metric, size: u64) -> u64 {
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
/// so that perftest and ours run side by side in time.
pub fn steps(profile: &Profile) -> Vec<Step> {
    let mut out = Vec::new();
    for round in 1..=profile.rounds {
        for &size in &profile.sizes {
            for (i, s) in SERIES.iter().enumerate() {
                if (profile.nodes > 1 && (!s.two_node || s.local())) || (profile.quick && !s.quick)
                {
                    continue;
                }
                let iters = profile.iters(s.metric, size);
                if s.local() && profile.reg_iters == 0 {
                    continue;
                }
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

/// The plan file `bench.sh` reads: one line per step.
pub fn plan_text(profile: &Profile, steps: &[Step]) -> String {
    let mut t = String::from("# kind id limit program size iters args\n");
    for st in steps {
        let s = &SERIES[st.series];
        let _ = writeln!(
            t,
            "{} {} {} {} {} {} {}",
            if s.local() { "local" } else { "pair" },
            st.id,
            profile.limit(s.metric, st.size),
            s.program,
            st.size,
            st.iters,
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
