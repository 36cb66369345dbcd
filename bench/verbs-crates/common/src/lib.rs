//! What the write-cost loops of `examples/rdma_bench/cost_floor.c` written with the Rust verbs
//! crates share: `sideway` (programs `sideway_cost` and `sideway_basic_cost`, its extended and
//! its basic queue pair) and rust-ibverbs (crate `ibverbs`, program `ibverbs_cost`), one
//! package each. Each program counts under valgrind's callgrind, run with
//! `--collect-atstart=no --toggle-collect='*measured_*'`, as the C loop and `rdma_bench cost`
//! are: its post is in a function named `measured_post` and its completion in one named
//! `measured_complete`, both `#[inline(never)]`.
//!
//! Neither crate lets a program sleep on a completion channel (sideway 0.4 creates one but has
//! no call that arms a queue or reads its event; rust-ibverbs 0.9 creates its queues without
//! one), so the loop waits out of the count another way: it watches the bytes land (or the
//! receive complete) and then sleeps [`SETTLE`], after which the sender's completion is in its
//! queue. The measured completion polls once; when the queue was still empty (a miss), the
//! loop sleeps again and polls again, and the `RESULT` line reports the misses: a run with
//! misses has extra empty polls in its count.
//!
//! This workspace is outside the project's (its own `Cargo.lock`), so that the project's builds
//! do not build these crates.

use std::time::Duration;

/// How long the loop sleeps, after it saw the write land, before it polls for the completion.
pub const SETTLE: Duration = Duration::from_millis(20);

/// The command line: `DEVICE GID_INDEX SIZE ITERS`, as `cost_floor`'s.
pub struct Args {
    /// The RDMA device's name (`rxe0`).
    pub device: String,
    /// The GID index both queue pairs use.
    pub gid_index: u32,
    /// Bytes per write (at least 8: the loop writes the iteration's number).
    pub size: usize,
    /// Iterations (one write each).
    pub iters: u64,
}

/// Reads [`Args`] or exits with a usage line.
pub fn args(program: &str) -> Args {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = || -> ! {
        eprintln!("usage: {program} DEVICE GID_INDEX SIZE ITERS");
        std::process::exit(2)
    };
    if a.len() != 4 {
        usage();
    }
    let (Ok(gid_index), Ok(size), Ok(iters)) = (a[1].parse(), a[2].parse(), a[3].parse()) else {
        usage()
    };
    if size < 8 {
        usage();
    }
    Args {
        device: a[0].clone(),
        gid_index,
        size,
        iters,
    }
}

/// Prints `what` and exits with status 1.
pub fn die(what: impl std::fmt::Display) -> ! {
    eprintln!("{what}");
    std::process::exit(1)
}

/// Prints the `RESULT` line of `series`.
pub fn result(args: &Args, series: &str, misses: u64) {
    println!(
        "RESULT cost_iters={} size={} series={series} misses={misses}",
        args.iters, args.size
    );
}
