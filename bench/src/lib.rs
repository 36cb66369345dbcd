//! The benchmarks that `cargo xtask bench` runs in the testbed VM (xtask only dispatches to
//! [`main`]):
//!
//! * RDMA write bandwidth, message rate and latency of rdma-dmabuf beside perftest
//!   (`ib_write_bw`, `ib_write_lat`) on the same rxe device in the same boot, over host,
//!   udmabuf, system-heap and GPU (vgem) regions, and what registering each kind costs; the
//!   transfer engine's bandwidth and batch latency; on one node (rxe loopback) and across the
//!   two-node testbed's wire (`suite`);
//! * `--rails`: the engine over 1, 2 and 4 rails between two nodes (`rails`);
//! * `--peers`: the engine against Mooncake's (`peers`, its options and cells in
//!   `peers_plan`) or, with `--client nixl`, NIXL's (`nixl_peers`);
//! * `--sched-trace`: the one-node ping-pongs traced (`sched`; `trace` reads the traces);
//! * `--scale`: the engine's costs against its entries and segments (`scale`).
//!
//! The default run's parts, leaves first:
//!
//! * `units`: figures and sizes as the reports write them;
//! * `metric`, `series`: the metrics, the series and the goals;
//! * `plan`: the sizes, rounds and budgets, and the plan `bench.sh` runs;
//! * `results`: reading the consoles into samples and failures; min/median/max;
//! * `table`: the terminal report and the goals as ratios;
//! * `ins`: instructions per write beside the C loop's;
//! * `gates`: the bounds on deterministic counts that fail a run (the engine's allocations
//!   per chunk);
//! * `json`: the JSON file with every sample;
//! * `plot`: PNG and SVG plots.
//!
//! [`workspace`] holds what xtask shares with the bench: where things live, the release
//! builds of the programs the testbed runs, and a boot with the cluster key.
//!
//! Every step runs under its own time limit inside the VM; a failed step is named, and
//! everything else is still reported (and the command then exits non-zero). Everything is
//! written under `target/bench/`.

#![forbid(unsafe_code)]

mod gates;
mod ins;
mod json;
mod metric;
mod nixl_peers;
mod peers;
mod peers_plan;
mod plan;
mod plot;
mod rails;
mod results;
mod scale;
mod sched;
mod script;
mod series;
mod suite;
mod table;
mod trace;
mod units;
pub mod workspace;

use dmabuf_testbed::sh::Result;
use std::process::ExitCode;
use workspace::Paths;

/// `cargo xtask bench`'s lines of xtask's help: each mode and its options.
pub const USAGE: &str =
    "  bench [opts]          RDMA write bandwidth, message rate and latency beside perftest, over
                        host and dma-buf regions, and registration time; the transfer
                        engine's bandwidth and batch latency (4 KiB..4 MiB, one and three
                        peers) and its allocations per chunk (a gate); one node and two;
                        a table, target/bench/bench.json and plots (docs/performance.md)
      --quick             two sizes, three rounds, one node: a few minutes
      --nodes 1|2|both    which testbeds (default: both; --quick: 1)
      --rounds N          rounds of every step (default 3)
      --sizes 8,64K,1M    message sizes (default: 2 B to 8 MiB, powers of two)
      --only perftest,engine  only the series whose names start so
      --replot FILE       draw the plots of a run's bench.json again, into target/bench/
  bench --rails [opts]  the transfer engine over 1, 2 and 4 rails between two nodes (four
                        NICs, the PCIe topology): aggregate bandwidth, each rail's share,
                        vCPU use, a rail cut mid-batch; target/bench/rails.json
      --bytes 64M         each batch (default 64 MiB)
      --rounds N          batches per rail count (default 3)
      --rails 1,2,4       the rail counts
  bench --peers [opts]  the transfer engine against Mooncake's transfer_engine_bench (its
                        wheel unpacked by setup), two nodes, interleaved; a batch over
                        128 MiB is left out; target/bench/peers.json
      --sizes 64K,1M      block sizes (default 4 KiB..4 MiB)
      --batches 1,128     batch sizes (default 1,128)
      --threads 1,4       submitting threads (default 1,4)
      --ops write,read    operations (default both)
      --metadata MODE     p2p (the P2P handshake, default), etcd (an etcd on node a) or both
      --plot              draw the plots (target/bench/*-peers.png) again from peers.json
      --rounds N          rounds of every cell (default 3)
      --duration S        seconds of each run (default 5)
  bench --sched-trace [opts]  the one-node ping-pongs (ib_write_lat, rdma_bench lat and
                        lat-poll) under RUN_TO_PARITY and NO_RUN_TO_PARITY, each run traced
                        with the guest's scheduler tracepoints: per run, the median round trip
                        and the wake-ups of rxe's kworkers that waited a tick or more;
                        target/bench/sched-<time>/
      --runs N            runs of each program and setting (default 5)
      --iters N --size B  round trips per run (default 300), message size (default 2)
      --settings S,S      RUN_TO_PARITY, NO_RUN_TO_PARITY (default both)
      --host-load N       N busy threads on the host meanwhile (provokes the stalls)
      --stock             Debian's own rxe and rdma-core (host regions need no patch)
      --report DIR        print a previous run's report again
  bench --scale [opts]  the transfer engine's costs per unit against its scale, one node: a
                        batch's submission, whole time and peak memory against its entries;
                        a registration's time and memory and a peer's descriptor look-up
                        against an agent's segments (goal: flat, within 1.5x);
                        target/bench/scale.json and scale-*.png
      --entries 10,1000,100000   the batch sizes
      --segments 10,1000,10000   the segment counts
";

/// `cargo xtask bench ARGS`: `--rails`, `--peers`, `--sched-trace` or `--scale` first picks that mode
/// (the rest are its options); otherwise the default run (module `suite`). Builds what the mode
/// runs (release), boots the testbed, prints the report and writes its files under
/// `target/bench/`.
///
/// # Errors
/// An option is unknown or out of range, a build or a boot fails, or a file cannot be
/// written. A step that fails inside the VM is no error: it is reported, and the exit code
/// is then a failure.
pub fn main(paths: &Paths, args: &[String]) -> Result<ExitCode> {
    match args.split_first().map(|(a, r)| (a.as_str(), r)) {
        Some(("--rails", rest)) => rails::main(paths, rest),
        Some(("--peers", rest)) => peers::main(paths, rest),
        Some(("--sched-trace", rest)) => sched::main(paths, rest),
        Some(("--scale", rest)) => scale::main(paths, rest),
        _ => suite::main(paths, args),
    }
}

/// The host's load average (`/proc/loadavg`'s first three figures), said beside every run:
/// figures taken under load are noisy.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
