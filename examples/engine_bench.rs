//! The transfer engine's bandwidth and batch latency, in one process over rxe loopback (or
//! any device): an initiator agent writes blocks from host memory into one or three peer
//! agents' segments. Three forms:
//!
//! * a sweep (no subcommand): per block size (4 KiB..4 MiB) and peer count (1, 3), bandwidth
//!   (batches of `--bytes`, default 8 MiB, the best of `--rounds`, default 3; MB/s = 10^6
//!   bytes/s) and latency (the median of `--rounds` × 5 batches of one block per peer); one
//!   line `RESULT engine peers=P block=B bw_MBps=X lat_us=Y` each;
//! * `bw --peers P --size B --iters N`: one step of `cargo xtask bench` (series
//!   `engine/1peer`, `engine/3peers`): one batch of N blocks of B bytes spread over P peers,
//!   timed from `transfer` to `wait`'s return, then the median of [`LAT_BATCHES`] batches
//!   of one block per peer; one line `RESULT bw_MBps=X mpps=Y batch_lat_usec=Z peers=P`,
//!   bandwidth in MiB/s (2^20, as perftest's `MB/sec`) and message rate in million blocks/s;
//! * `alloc --size C --iters N`: the allocations of the whole process while a batch of 16
//!   entries cut into N chunks of C bytes runs, and while the same entries cut into 4N chunks
//!   run (the fewest of 5 batches each); one line `RESULT allocs_short=A allocs_long=B
//!   chunks_short=N chunks_long=4N allocs_per_chunk=X`, X = (B - A) / 3N. A count that
//!   timing does not move: a gate of `cargo xtask bench` (series `engine`);
//! * `cost --size C --iters N`: for an instruction counter (valgrind's callgrind with
//!   `--collect-atstart=no --toggle-collect='*measured_*'`): after an untimed batch, one
//!   batch of 16 entries of N chunks of C bytes each, of which only `Agent::transfer` is
//!   counted (`measured_transfer`: the checks, the plan that cuts the entries into chunks,
//!   the hand-over to a worker; on the caller's thread, which waits for nothing there); the
//!   wait for the batch is not. One line `RESULT cost_iters=N writes_per_iter=16`: `cargo
//!   xtask bench` counts N = 10 and 60 and divides the difference by 50 × 16, per chunk
//!   (series `engine/plan`, a gate).
//!
//! * `metrics --size B --iters N [--rounds R]`: the cost of the engine's metrics
//!   ([`Settings::metrics`]): two initiators in one process, one counting and one not,
//!   write batches of N blocks of B bytes to the same peer, in alternating rounds (R of
//!   each, default 3; on, off, off, on, ... so that a drift of the machine hits both
//!   alike); one line `RESULT metrics_on_MiBps=X metrics_off_MiBps=Y cost_pct=Z`, the
//!   medians, Z = 100 × (1 - X / Y).
//!
//! `cargo xtask bench` runs the two step forms beside perftest's `ib_write_bw` at the same
//! sizes and bytes in the same boot (docs/performance.md).
//!
//! ```sh
//! cargo run --release -p examples --example engine_bench -- [--bytes N] [--rounds N] [--sizes 4K,64K,4M]
//! cargo run --release -p examples --example engine_bench -- bw --peers 3 --size 64K --iters 128
//! cargo run --release -p examples --example engine_bench -- alloc --size 4K --iters 256
//! valgrind --tool=callgrind --collect-atstart=no '--toggle-collect=*measured_*' \
//!     target/release/examples/engine_bench cost --size 4K --iters 60
//! ```
//! (`RDMA_DEVICE=rxe0` picks the device; default: every device with an active port.)

use gpu_rdma_engine::{Agent, Batch, Settings};
use rdma_dmabuf::HostBuffer;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const WAIT: Duration = Duration::from_secs(600);
/// Batches of one block per peer whose median is a `bw` step's batch latency.
pub const LAT_BATCHES: usize = 5;
/// Entries of an `alloc` batch.
const ALLOC_ENTRIES: u64 = 16;
/// Batches of each size an `alloc` step runs; the fewest allocations count.
const ALLOC_RUNS: usize = 5;

/// Counts every allocation and reallocation of the process (the `alloc` form reads it).
struct Counting;
static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// What to run.
enum Mode {
    Sweep,
    Bw,
    Alloc,
    Cost,
    Metrics,
}

struct Args {
    mode: Mode,
    bytes: u64,
    rounds: u32,
    sizes: Vec<u64>,
    peers: usize,
    size: u64,
    iters: u64,
}

fn usage() -> ! {
    eprintln!(
        "usage: engine_bench [--bytes N] [--rounds N] [--sizes 4K,64K,1M]\n       \
         engine_bench bw --peers 1|3 --size N --iters N\n       \
         engine_bench alloc --size N --iters N\n       \
         engine_bench cost --size N --iters N\n       \
         engine_bench metrics --size N --iters N [--rounds N]"
    );
    std::process::exit(2)
}

fn size(w: &str) -> u64 {
    let (d, shift) = match w.as_bytes().last() {
        Some(b'K' | b'k') => (&w[..w.len() - 1], 10),
        Some(b'M' | b'm') => (&w[..w.len() - 1], 20),
        _ => (w, 0),
    };
    match d.parse::<u64>() {
        Ok(n) if n > 0 => n << shift,
        _ => usage(),
    }
}

fn args() -> Args {
    let mut a = Args {
        mode: Mode::Sweep,
        bytes: 8 << 20,
        rounds: 3,
        sizes: [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20].to_vec(),
        peers: 1,
        size: 64 << 10,
        iters: 128,
    };
    let mut it = std::env::args().skip(1).peekable();
    match it.peek().map(String::as_str) {
        Some("bw") => a.mode = Mode::Bw,
        Some("alloc") => a.mode = Mode::Alloc,
        Some("cost") => a.mode = Mode::Cost,
        Some("metrics") => a.mode = Mode::Metrics,
        _ => {}
    }
    if !matches!(a.mode, Mode::Sweep) {
        it.next();
    }
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        let count = || v.parse::<u64>().ok().filter(|&n| n > 0);
        match k.as_str() {
            "--bytes" => a.bytes = size(&v),
            "--rounds" => a.rounds = count().unwrap_or_else(|| usage()).min(100) as u32,
            "--sizes" => a.sizes = v.split(',').map(size).collect(),
            "--peers" => match v.as_str() {
                "1" => a.peers = 1,
                "3" => a.peers = 3,
                _ => usage(),
            },
            "--size" => a.size = size(&v),
            "--iters" => a.iters = count().unwrap_or_else(|| usage()),
            _ => usage(),
        }
    }
    a
}

/// A batch of `bytes` in blocks of `block`, block j to peer j % peers.
fn batch(peers: usize, block: u64, bytes: u64) -> Batch {
    let n = (bytes / block).max(peers as u64);
    (0..n).fold(Batch::new(), |b, j| {
        let p = (j % peers as u64) as usize;
        let at = (j / peers as u64) * block;
        b.write("src", j * block, &format!("p{p}"), "dst", at, block)
    })
}

/// The device from `RDMA_DEVICE` (default: every active one), loopback control channels.
fn settings() -> Res<Settings> {
    Ok(Settings {
        devices: examples::args::env("RDMA_DEVICE").map(|d| vec![d]),
        bind: "127.0.0.1:0".parse()?,
        ..Settings::default()
    })
}

/// An initiator with a `src` segment of `src` bytes and `peers` agents `p0`.. with a `dst`
/// segment of `dst` bytes each, known to the initiator.
fn agents(settings: &Settings, peers: usize, src: u64, dst: u64) -> Res<(Agent, Vec<Agent>)> {
    let init = Agent::new("init", settings.clone())?;
    init.register("src", HostBuffer::new(src as usize)?)?;
    let mut out = Vec::new();
    for p in 0..peers {
        let agent = Agent::new(&format!("p{p}"), settings.clone())?;
        agent.register("dst", HostBuffer::new(dst as usize)?)?;
        init.add_peer(agent.name(), agent.address());
        out.push(agent);
    }
    Ok((init, out))
}

/// The time from `transfer` to `wait`'s return.
fn timed(init: &Agent, b: &Batch) -> Res<Duration> {
    let t0 = Instant::now();
    init.transfer(b)?.wait(WAIT)?;
    Ok(t0.elapsed())
}

/// The median of `n` batches `b`.
fn median(init: &Agent, b: &Batch, n: usize) -> Res<Duration> {
    let mut lat = (0..n).map(|_| timed(init, b)).collect::<Res<Vec<_>>>()?;
    lat.sort();
    Ok(lat[lat.len() / 2])
}

fn sweep(a: &Args) -> Res<()> {
    let settings = settings()?;
    let largest = a.sizes.iter().copied().max().unwrap_or(1);
    let span = a.bytes.max(3 * largest);
    let (init, _peers) = agents(&settings, 3, span, span)?;
    // Connections and descriptors made before anything is timed.
    init.transfer(&batch(3, largest, 3 * largest))?.wait(WAIT)?;
    println!(
        "# engine: chunk {} KiB, {} queue pairs per peer, window {} per queue pair, {} bytes per bandwidth batch",
        settings.chunk_size >> 10,
        settings.queue_pairs,
        settings.in_flight,
        a.bytes
    );
    for &peers in &[1usize, 3] {
        for &block in &a.sizes {
            let big = batch(peers, block, a.bytes);
            let moved = big.entries.iter().map(|e| e.len).sum::<u64>();
            let mut best = Duration::MAX;
            for _ in 0..a.rounds {
                best = best.min(timed(&init, &big)?);
            }
            let lat = median(
                &init,
                &batch(peers, block, block * peers as u64),
                a.rounds as usize * 5,
            )?;
            println!(
                "RESULT engine peers={peers} block={block} bw_MBps={:.2} lat_us={:.0}",
                moved as f64 / best.as_secs_f64() / 1e6,
                lat.as_secs_f64() * 1e6
            );
        }
    }
    Ok(())
}

/// One `cargo xtask bench` bandwidth step.
fn bw(a: &Args) -> Res<()> {
    let blocks = a.iters.max(a.peers as u64);
    let per_peer = blocks.div_ceil(a.peers as u64);
    let (init, _peers) = agents(&settings()?, a.peers, blocks * a.size, per_peer * a.size)?;
    let small = batch(a.peers, a.size, a.size * a.peers as u64);
    // Connections and descriptors made before anything is timed.
    init.transfer(&small)?.wait(WAIT)?;
    let big = batch(a.peers, a.size, blocks * a.size);
    let t = timed(&init, &big)?;
    let lat = median(&init, &small, LAT_BATCHES)?;
    println!(
        "RESULT bw_MBps={:.3} mpps={:.6} batch_lat_usec={:.1} peers={}",
        (blocks * a.size) as f64 / t.as_secs_f64() / f64::from(1 << 20),
        blocks as f64 / t.as_secs_f64() / 1e6,
        lat.as_secs_f64() * 1e6,
        a.peers
    );
    Ok(())
}

/// Allocations of the process while `b` is transferred and waited for (the fewest of
/// [`ALLOC_RUNS`] batches).
fn allocations(init: &Agent, b: &Batch) -> Res<usize> {
    let mut fewest = usize::MAX;
    for _ in 0..ALLOC_RUNS {
        let before = ALLOCATIONS.load(Ordering::SeqCst);
        let t = init.transfer(b)?;
        t.wait(WAIT)?;
        drop(t);
        fewest = fewest.min(ALLOCATIONS.load(Ordering::SeqCst) - before);
    }
    Ok(fewest)
}

/// [`ALLOC_ENTRIES`] writes of `len` bytes each, scattered, to `p0`.
fn entries(len: u64) -> Batch {
    (0..ALLOC_ENTRIES).fold(Batch::new(), |b, j| {
        let at = ((j * 7) % ALLOC_ENTRIES) * len;
        b.write("src", j * len, "p0", "dst", at, len)
    })
}

/// An initiator and one peer whose segments hold [`ALLOC_ENTRIES`] entries of `chunks`
/// chunks of `chunk` bytes, chunks of that size.
fn chunked(chunk: u64, chunks: u64) -> Res<(Agent, Vec<Agent>)> {
    let settings = Settings {
        chunk_size: chunk,
        ..settings()?
    };
    let span = ALLOC_ENTRIES * chunks * chunk;
    agents(&settings, 1, span, span)
}

/// The work of `transfer` on the caller's thread, and nothing else: the function callgrind's
/// `--toggle-collect='*measured_*'` counts in.
#[inline(never)]
fn measured_transfer(
    init: &Agent,
    b: &Batch,
) -> gpu_rdma_engine::Result<gpu_rdma_engine::Transfer> {
    init.transfer(b)
}

/// One `cargo xtask bench` instruction count: `--iters` chunks of `--size` per entry.
fn cost(a: &Args) -> Res<()> {
    let (init, _peers) = chunked(a.size, a.iters)?;
    let b = entries(a.iters * a.size);
    // Connections, queue pairs and descriptors made, outside the count.
    init.transfer(&b)?.wait(WAIT)?;
    let t = measured_transfer(&init, &b)?;
    t.wait(WAIT)?;
    println!(
        "RESULT cost_iters={} size={} writes_per_iter={ALLOC_ENTRIES}",
        a.iters, a.size
    );
    Ok(())
}

/// One `cargo xtask bench` allocation step: chunks of `--size`, `--iters` of them in the
/// short batch, four times as many in the long one, the same 16 entries scattered.
fn alloc(a: &Args) -> Res<()> {
    let per_entry = a.iters.div_ceil(ALLOC_ENTRIES);
    let (init, _peers) = chunked(a.size, 4 * per_entry)?;
    let (short, long) = (entries(per_entry * a.size), entries(4 * per_entry * a.size));
    // Warm: the descriptor fetched, the connections and queue pairs made.
    allocations(&init, &long)?;
    let (at_short, at_long) = (allocations(&init, &short)?, allocations(&init, &long)?);
    let chunks = ALLOC_ENTRIES * per_entry;
    println!(
        "RESULT allocs_short={at_short} allocs_long={at_long} chunks_short={chunks} \
         chunks_long={} allocs_per_chunk={:.4}",
        4 * chunks,
        (at_long as f64 - at_short as f64).max(0.0) / (3 * chunks) as f64
    );
    Ok(())
}

/// The metrics' cost: alternating rounds of an initiator that counts and one that does not.
fn metrics(a: &Args) -> Res<()> {
    let span = a.iters * a.size;
    let (on, peers) = agents(&settings()?, 1, span, span)?;
    let quiet = Settings {
        metrics: false,
        ..settings()?
    };
    let off = Agent::new("init-off", quiet)?;
    off.register("src", HostBuffer::new(span as usize)?)?;
    off.add_peer(peers[0].name(), peers[0].address());
    let big = batch(1, a.size, span);
    // Connections and descriptors made before anything is timed.
    for init in [&on, &off] {
        init.transfer(&big)?.wait(WAIT)?;
    }
    let mib = |t: Duration| span as f64 / t.as_secs_f64() / f64::from(1 << 20);
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for r in 0..a.rounds {
        let order = if r % 2 == 0 {
            [true, false]
        } else {
            [false, true]
        };
        for counting in order {
            if counting {
                with.push(mib(timed(&on, &big)?));
            } else {
                without.push(mib(timed(&off, &big)?));
            }
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (x, y) = (median(&mut with), median(&mut without));
    let counted = on
        .metrics()
        .rails
        .iter()
        .map(|r| r.write_requests)
        .sum::<u64>();
    assert!(
        counted > 0 && off.metrics().rails.is_empty(),
        "one counts, one does not"
    );
    println!(
        "RESULT metrics_on_MiBps={x:.3} metrics_off_MiBps={y:.3} cost_pct={:.2} rounds={} size={} iters={}",
        100.0 * (1.0 - x / y),
        a.rounds,
        a.size,
        a.iters
    );
    Ok(())
}

fn main() -> Res<()> {
    let a = args();
    match a.mode {
        Mode::Sweep => sweep(&a),
        Mode::Bw => bw(&a),
        Mode::Alloc => alloc(&a),
        Mode::Cost => cost(&a),
        Mode::Metrics => metrics(&a),
    }
}
