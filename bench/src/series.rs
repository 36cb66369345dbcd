//! What a bench run measures: the series (a column of the table and a line of a plot each, of
//! a [`Metric`]) and the goals, as ratios of two series.
//!
//! A new series is one entry in [`SERIES`] (and, if it needs one, a mode of `rdma_bench`).

pub use crate::metric::Metric;

/// One series.
#[derive(Debug)]
pub struct Series {
    /// Its name in the table, the plots and the JSON: `perftest`, or `ours/<region kind>`.
    pub name: &'static str,
    /// What it measures.
    pub metric: Metric,
    /// `ib_write_bw`, `ib_write_lat`, `rdma_bench`, [`ENGINE`], [`PYTHON_ENGINE`],
    /// `cost_floor` (`cost_floor.c`, which `bench.sh` compiles in the VM), or one of
    /// [`VERBS_CRATES`].
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

/// The write-cost loop written with `sideway`'s extended queue pair (`bench/verbs-crates`).
pub const SIDEWAY: &str = "sideway_cost";

/// The write-cost loop written with `sideway`'s basic queue pair (`bench/verbs-crates`).
pub const SIDEWAY_BASIC: &str = "sideway_basic_cost";

/// The write-cost loop written with rust-ibverbs (`bench/verbs-crates`).
pub const IBVERBS: &str = "ibverbs_cost";

/// Every program of `bench/verbs-crates`.
pub const VERBS_CRATES: [&str; 3] = [SIDEWAY, SIDEWAY_BASIC, IBVERBS];

/// The transfer engine's bench (`examples/engine_bench.rs`): an initiator and its peers in
/// one process.
pub const ENGINE: &str = "engine_bench";

/// The engine's bandwidth step from Python (`python/examples/engine_bench.py`, the package
/// `gpu_rdma` built in release): the same step as [`ENGINE`]'s `bw`, for the goal on what
/// Python costs over Rust.
pub const PYTHON_ENGINE: &str = "engine_bench.py";

/// The block sizes the engine's series run at: 4 KiB to 4 MiB.
pub const ENGINE_SIZES: std::ops::RangeInclusive<u64> = 4 << 10..=4 << 20;

/// The chunk size of the engine's counts (allocations, instructions), whatever the run's
/// sizes.
pub const ENGINE_COUNT_CHUNK: u64 = 4 << 10;

impl Series {
    /// Whether it is one process (registration, the engine) rather than a server and a
    /// client.
    pub fn local(&self) -> bool {
        self.metric == Metric::Registration || self.engine()
    }

    /// Whether it is one of the transfer engine's series, from Rust or Python (run at
    /// [`ENGINE_SIZES`] only).
    pub fn engine(&self) -> bool {
        self.program == ENGINE || self.program == PYTHON_ENGINE
    }

    /// The step kind `bench.sh` runs it as: `pair` (a server and a client), `local` (one
    /// process) or `cost` (one process under callgrind, twice).
    pub fn kind(&self) -> &'static str {
        match self.metric {
            Metric::Instructions => "cost",
            _ if self.local() => "local",
            _ => "pair",
        }
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
use Metric::{Allocations, Bandwidth, Instructions, Latency, Registration};

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
    // The transfer engine: one batch of the step's blocks from host memory, spread
    // over one or three peer agents of the same process, the same bytes as perftest's step;
    // each sample also holds the batch latency of one block per peer (`batch_lat_usec`).
    series("engine/1peer", Bandwidth, ENGINE, "bw --peers 1", Quick),
    series("engine/3peers", Bandwidth, ENGINE, "bw --peers 3", Quick),
    // The same batch as `engine/1peer`, submitted and waited for from Python.
    series(
        "python/1peer",
        Bandwidth,
        PYTHON_ENGINE,
        "bw --peers 1",
        Quick,
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
    // of busy-polled: the async path's cost.
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
    // The receive-completion ping-pong with nothing between polls (`SpinPolicy::Dedicated`),
    // as perftest's loops: what the default's PAUSE and yield cost it here
    // (docs/performance-gaps.md).
    series(
        "ours/host+dedicated",
        Latency,
        "rdma_bench",
        "--mode lat --inline no --spin dedicated --region host",
        No,
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
    // The same with a CPU mapping of each buffer held across its registration: vgem's pages
    // are then held already, so the registration does not pay vgem's own page pinning and
    // write-combining (docs/performance-dmabuf.md): what rxe and the core do.
    series(
        "ours/gpu+held",
        Registration,
        "rdma_bench",
        "reg --region gpu --hold-map yes",
        Quick,
    ),
    // Instructions per write (`rdma_bench cost`, `cost_floor.c`; tests/tests/rdma/rdma_cost.rs):
    // the C loop over libibverbs first, then each of our layers, then a chain of 16 writes
    // with one completion, ours and the C loop's (cost_floor's last argument: writes a chain).
    series("c", Instructions, "cost_floor", "1", Quick),
    series(
        "ours/owned",
        Instructions,
        "rdma_bench",
        "cost --series owned",
        Quick,
    ),
    series(
        "ours/scoped",
        Instructions,
        "rdma_bench",
        "cost --series scoped",
        Quick,
    ),
    series(
        "ours/awaited",
        Instructions,
        "rdma_bench",
        "cost --series awaited",
        Quick,
    ),
    series(
        "ours/batch",
        Instructions,
        "rdma_bench",
        "cost --series batch",
        Quick,
    ),
    series("c/batch", Instructions, "cost_floor", "16", Quick),
    // The C loop over the extended verbs (`ibv_wr_*`, `ibv_start_poll`), sideway's calls: the
    // provider's share of a write there, for reference.
    series(
        "c/extended",
        Instructions,
        "cost_floor",
        "1 extended",
        Quick,
    ),
    series(
        "c/extended/batch",
        Instructions,
        "cost_floor",
        "16 extended",
        Quick,
    ),
    // The same loop written with the Rust verbs crates (bench/verbs-crates): sideway's
    // extended post and poll, its basic ones, rust-ibverbs' post_send and poll (a SEND: it
    // has no RDMA write).
    series("sideway", Instructions, SIDEWAY, "", Quick),
    series("sideway/basic", Instructions, SIDEWAY_BASIC, "", Quick),
    series("ibverbs/send", Instructions, IBVERBS, "", Quick),
    // The engine's allocations per chunk: batches of 16 entries cut into N and 4N chunks of
    // ENGINE_COUNT_CHUNK (the step's iterations: N), the difference over 3N.
    series("engine", Allocations, ENGINE, "alloc", Quick),
    // The engine's instructions per chunk on the caller's thread (`Agent::transfer`: checks,
    // plan, hand-over), batches of 16 entries of 10 and of 60 chunks of ENGINE_COUNT_CHUNK.
    series("engine/plan", Instructions, ENGINE, "cost", Quick),
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
    /// The smallest size it holds at (0: every size).
    pub from: u64,
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

    /// Whether it holds at `size`.
    pub fn applies(&self, size: u64) -> bool {
        size >= self.from
    }

    /// `bw ours/host / perftest >= 1.00`, `bw engine/1peer / perftest >= 0.95 from 64 KiB`.
    pub fn describe(&self) -> String {
        let from = if self.from > 0 {
            format!(" from {}", crate::units::size(self.from))
        } else {
            String::new()
        };
        format!(
            "{} {} / {} {} {:.2}{from}",
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
        from: 0,
    }
}

/// A goal that holds from size `from` on.
const fn goal_from(
    metric: Metric,
    series: &'static str,
    base: &'static str,
    bound: f64,
    from: u64,
) -> Goal {
    Goal {
        from,
        ..goal(metric, series, base, bound)
    }
}

/// The goals, as ratios of medians taken in the same boot: our writes against perftest's,
/// the dma-buf regions against host memory, the async path, batched completions, latency
/// without a receive completion, our owned write's instructions against the C loop's, the
/// engine's bandwidth against perftest's from 64 KiB, and the engine from Python against the
/// engine from Rust from 64 KiB.
/// A goal is reported, never failed on: under TCG its ratio moves by more than its margin
/// from run to run; a deterministic count is gated instead ([`GATES`]).
pub const GOALS: &[Goal] = &[
    goal(Bandwidth, "ours/host", "perftest", 1.00),
    goal(Latency, "ours/host", "perftest", 1.00),
    goal(Bandwidth, "ours/udmabuf", "ours/host", 0.98),
    goal(Bandwidth, "ours/heap", "ours/host", 0.98),
    goal(Bandwidth, "ours/gpu", "ours/host", 0.98),
    goal(Registration, "ours/udmabuf", "ours/host", 1.10),
    goal(Registration, "ours/heap", "ours/host", 1.10),
    goal(Registration, "ours/gpu", "ours/host", 1.10),
    goal(Registration, "ours/gpu+held", "ours/host", 1.10),
    goal(Bandwidth, "ours/host+async", "ours/host", 0.95),
    goal(Bandwidth, "ours/host+batch", "perftest", 1.00),
    goal(Latency, "ours/host+poll", "perftest", 1.00),
    goal(Instructions, "ours/owned", "c", 1.10),
    goal_from(Bandwidth, "engine/1peer", "perftest", 0.95, 64 << 10),
    goal_from(Bandwidth, "engine/3peers", "perftest", 0.95, 64 << 10),
    goal_from(Bandwidth, "python/1peer", "engine/1peer", 0.95, 64 << 10),
];

/// A gate: a bound on a deterministic count, which the run fails on when missed (a count
/// that timing cannot move does not flake).
#[derive(Debug)]
pub struct Gate {
    /// What is counted.
    pub metric: Metric,
    /// The series counted.
    pub series: &'static str,
    /// The most it may be.
    pub most: f64,
    /// Why the bound is what it is.
    pub why: &'static str,
}

impl Gate {
    /// `alloc engine <= 0.01`.
    pub fn describe(&self) -> String {
        format!("{} {} <= {}", self.metric.key(), self.series, self.most)
    }
}

/// The gates of a run: the engine allocates per batch, never per chunk (one allocation per
/// chunk would be 1.0; the bound leaves one per hundred chunks for whatever else a thread
/// of the process does meanwhile); its caller's work per chunk (`Agent::transfer`) stays
/// within 10% of what it was counted at (183 instructions: raise the bound
/// deliberately, in the change that costs more, with the reason).
pub const GATES: &[Gate] = &[
    Gate {
        metric: Allocations,
        series: "engine",
        most: 0.01,
        why: "the engine allocates per batch, never per chunk",
    },
    Gate {
        metric: Instructions,
        series: "engine/plan",
        most: 200.0,
        why: "instructions per chunk in Agent::transfer: 183 counted, plus 10%",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_names_are_unique_per_metric_and_goals_name_real_series() {
        for (i, a) in SERIES.iter().enumerate() {
            for b in &SERIES[i + 1..] {
                assert!(a.metric != b.metric || a.name != b.name, "{} twice", a.name);
            }
            assert!(!a.name.contains(char::is_whitespace));
        }
        for g in GATES {
            assert!(SERIES
                .iter()
                .any(|s| s.metric == g.metric && s.name == g.series && s.metric.counted()));
        }
        for g in GOALS {
            for name in [g.series, g.base] {
                assert!(
                    SERIES
                        .iter()
                        .any(|s| s.metric == g.metric && s.name == name),
                    "{}: no series {name}",
                    g.describe()
                );
            }
        }
    }

    #[test]
    fn bandwidth_goals_compare_the_finer_figure() {
        assert_eq!(GOALS[0].value(8), "mpps");
        assert_eq!(GOALS[0].value(8 << 20), "bw_MBps");
        assert_eq!(GOALS[1].value(8), "lat_usec");
    }
}
