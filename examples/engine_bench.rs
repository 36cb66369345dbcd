//! The transfer engine's bandwidth and batch latency, in one process over rxe loopback (or
//! any device): an initiator agent writes blocks of 4 KiB..4 MiB from host memory into one
//! or three peer agents' segments.
//!
//! * bandwidth: batches of `--bytes` (default 8 MiB) cut into blocks of the size, spread
//!   over the peers; MB/s = bytes moved / time from `transfer` to `wait`'s return, the best
//!   of `--rounds` batches (default 3);
//! * latency: a batch of one block per peer, transferred and waited for; the median of
//!   `--rounds` × 5 batches.
//!
//! Each result is one line, `RESULT engine peers=P block=B bw_MBps=X lat_us=Y`.
//! `examples/engine_bench.sh` runs perftest's `ib_write_bw` at the same sizes in the same
//! boot, for the engine's overhead.
//!
//! ```sh
//! cargo run --release -p examples --example engine_bench -- [--bytes N] [--rounds N] [--sizes 4K,64K,4M]
//! ```
//! (`RDMA_DEVICE=rxe0` picks the device; default: every device with an active port.)

use gpu_rdma_engine::{Agent, Batch, Settings};
use rdma_dmabuf::HostBuffer;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const WAIT: Duration = Duration::from_secs(600);

struct Args {
    bytes: u64,
    rounds: u32,
    sizes: Vec<u64>,
}

fn usage() -> ! {
    eprintln!("usage: engine_bench [--bytes N] [--rounds N] [--sizes 4K,64K,1M]");
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
        bytes: 8 << 20,
        rounds: 3,
        sizes: [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20].to_vec(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--bytes" => a.bytes = size(&v),
            "--rounds" => a.rounds = v.parse::<u32>().unwrap_or_else(|_| usage()).max(1),
            "--sizes" => a.sizes = v.split(',').map(size).collect(),
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

fn main() -> Res<()> {
    let a = args();
    let settings = Settings {
        devices: std::env::var("RDMA_DEVICE").ok().map(|d| vec![d]),
        bind: "127.0.0.1:0".parse()?,
        ..Settings::default()
    };
    let largest = a.sizes.iter().copied().max().unwrap_or(1);
    let span = a.bytes.max(3 * largest);
    let init = Agent::new("init", settings.clone())?;
    init.register("src", HostBuffer::new(span as usize)?)?;
    let mut peers = Vec::new();
    for p in 0..3 {
        let agent = Agent::new(&format!("p{p}"), settings.clone())?;
        agent.register("dst", HostBuffer::new(span as usize)?)?;
        init.add_peer(agent.name(), agent.address());
        peers.push(agent);
    }
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
                let t0 = Instant::now();
                init.transfer(&big)?.wait(WAIT)?;
                best = best.min(t0.elapsed());
            }
            let small = batch(peers, block, block * peers as u64);
            let mut lat: Vec<Duration> = (0..a.rounds * 5)
                .map(|_| {
                    let t0 = Instant::now();
                    init.transfer(&small)?.wait(WAIT)?;
                    Ok(t0.elapsed())
                })
                .collect::<Res<_>>()?;
            lat.sort();
            println!(
                "RESULT engine peers={peers} block={block} bw_MBps={:.2} lat_us={:.0}",
                moved as f64 / best.as_secs_f64() / 1e6,
                lat[lat.len() / 2].as_secs_f64() * 1e6
            );
        }
    }
    Ok(())
}
