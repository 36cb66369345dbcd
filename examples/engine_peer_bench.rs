//! The transfer engine's twin of Mooncake's `transfer_engine_bench`, with its parameters, so
//! that `cargo xtask bench --peers` runs both between the same two nodes and compares them
//! cell by cell (docs/performance.md, "Against Mooncake's transfer engine").
//!
//! * `--mode target`: an agent `target` whose control listener is `--local_server_name`
//!   (an `IP:PORT`; port 0 picks one) with one host segment `buffer` of `--buffer_size`
//!   bytes; it prints `listening on IP:PORT` (what the initiator's `--segment_id` names) and
//!   serves until it is killed.
//! * `--mode initiator`: an agent with a host segment of `--buffer_size` bytes, the target at
//!   `--segment_id`; after one untimed batch (connections and the descriptor made), each of
//!   `--threads` threads submits batches of `--batch_size` blocks of `--block_size` bytes
//!   (`--operation read` or `write`; thread t's blocks fill the range starting at t ×
//!   batch_size × block_size on both sides, as Mooncake's threads do) and waits for each, until
//!   `--duration` seconds have passed. It prints Mooncake's closing line, `Test completed:
//!   duration D, batch count N, throughput X MiB/s`, and
//!   `RESULT MiBps=X batches=N secs=D batch_lat_usec=L batch_lat_p50_usec=M`: the bandwidth
//!   (MiB/s, 2^20 bytes), the batches done, and a batch's latency as Mooncake's figures give it
//!   (threads × duration / batches), with the median of the batches' own times beside it.
//!
//! ```sh
//! engine_peer_bench --mode target --local_server_name 169.254.10.1:17800 --buffer_size 256M
//! engine_peer_bench --mode initiator --segment_id 169.254.10.1:17800 --buffer_size 256M \
//!     --operation write --block_size 64K --batch_size 128 --threads 1 --duration 5
//! ```
//! `RDMA_DEVICE` names the device (default: every device with an active port); the initiator
//! binds its control listener to `LOCAL_ADDR` when that is set.

use examples::Args;
use gpu_rdma_engine::{Agent, Batch, Settings};
use rdma_dmabuf::HostBuffer;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const USAGE: &str = "usage: engine_peer_bench --mode target --local_server_name IP:PORT \
                     --buffer_size N\n       \
                     engine_peer_bench --mode initiator --segment_id IP:PORT --buffer_size N \
                     --operation read|write --block_size N --batch_size N --threads N \
                     --duration S";
const OPTIONS: &[&str] = &[
    "mode",
    "local_server_name",
    "segment_id",
    "buffer_size",
    "operation",
    "block_size",
    "batch_size",
    "threads",
    "duration",
];
/// The target agent's name (Mooncake's segment is named by its address alone).
const TARGET: &str = "target";
/// The segment on both sides.
const SEGMENT: &str = "buffer";
/// How long one batch may take before the run fails.
const WAIT: Duration = Duration::from_secs(300);

/// The initiator's parameters.
struct Run {
    read: bool,
    block: u64,
    batch: u64,
    threads: u64,
    duration: Duration,
}

/// An agent on `RDMA_DEVICE` (or every active device) listening at `bind`.
fn agent(name: &str, bind: SocketAddr, buffer: u64) -> Res<Agent> {
    let settings = Settings {
        devices: std::env::var("RDMA_DEVICE").ok().map(|d| vec![d]),
        bind,
        ..Settings::default()
    };
    let a = Agent::new(name, settings)?;
    a.register(SEGMENT, HostBuffer::new(usize::try_from(buffer)?)?)?;
    Ok(a)
}

fn target(args: &Args, buffer: u64) -> Res<()> {
    let bind: SocketAddr = args.get("local_server_name", "0.0.0.0:0".parse()?);
    let a = agent(TARGET, bind, buffer)?;
    println!("listening on {}", a.address());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Thread `t`'s batch: `batch` blocks from `t * batch * block`, the same range on both sides.
fn batch(r: &Run, t: u64) -> Batch {
    (0..r.batch).fold(Batch::new(), |b, i| {
        let at = (t * r.batch + i) * r.block;
        if r.read {
            b.read(SEGMENT, at, TARGET, SEGMENT, at, r.block)
        } else {
            b.write(SEGMENT, at, TARGET, SEGMENT, at, r.block)
        }
    })
}

/// One thread's loop: batches until `end`; their times.
fn submit(a: &Agent, b: &Batch, end: Instant) -> Result<Vec<Duration>, String> {
    let mut times = Vec::new();
    while Instant::now() < end {
        let t0 = Instant::now();
        a.transfer(b)
            .and_then(|t| t.wait(WAIT))
            .map_err(|e| e.to_string())?;
        times.push(t0.elapsed());
    }
    Ok(times)
}

fn initiator(args: &Args, buffer: u64) -> Res<()> {
    let Some(peer) = args.text("segment_id") else {
        examples::fail("--mode initiator needs --segment_id IP:PORT")
    };
    let peer: SocketAddr = peer
        .parse()
        .map_err(|e| format!("--segment_id {peer:?}: {e}"))?;
    let r = Run {
        read: match args.text("operation").as_deref() {
            Some("read") | None => true,
            Some("write") => false,
            Some(o) => examples::fail(&format!("--operation {o:?}: read or write")),
        },
        block: args.size("block_size", 65_536),
        batch: args.get("batch_size", 128u64),
        threads: args.get("threads", 1u64),
        duration: Duration::from_secs_f64(args.get("duration", 10.0f64)),
    };
    if r.block == 0 || r.batch == 0 || r.threads == 0 {
        examples::fail("--block_size, --batch_size and --threads must be at least 1");
    }
    if r.threads * r.batch * r.block > buffer {
        examples::fail(&format!(
            "--buffer_size {buffer} is less than threads x batch_size x block_size ({})",
            r.threads * r.batch * r.block
        ));
    }
    let local = std::env::var("LOCAL_ADDR").unwrap_or_else(|_| "0.0.0.0".into());
    let a = agent("initiator", format!("{local}:0").parse()?, buffer)?;
    a.add_peer(TARGET, peer);
    let batches: Vec<Batch> = (0..r.threads).map(|t| batch(&r, t)).collect();
    // Connections, queue pairs and the target's descriptor made before anything is timed.
    a.transfer(&batches[0])?.wait(WAIT)?;
    let start = Instant::now();
    let end = start + r.duration;
    let per_thread: Vec<Result<Vec<Duration>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = batches
            .iter()
            .map(|b| {
                let a = &a;
                s.spawn(move || submit(a, b, end))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let mut times = Vec::new();
    for t in per_thread {
        times.extend(t?);
    }
    times.sort();
    let n = times.len() as u64;
    let mib = (n * r.batch * r.block) as f64 / f64::from(1 << 20) / secs;
    let lat = if n == 0 {
        f64::NAN
    } else {
        r.threads as f64 * secs / n as f64 * 1e6
    };
    let p50 = times
        .get(times.len() / 2)
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1e6);
    println!("Test completed: duration {secs:.2}, batch count {n}, throughput {mib:.2} MiB/s");
    println!(
        "RESULT MiBps={mib:.3} batches={n} secs={secs:.3} batch_lat_usec={lat:.1} \
         batch_lat_p50_usec={p50:.1}"
    );
    Ok(())
}

fn main() -> Res<()> {
    let args = Args::parse(USAGE, OPTIONS);
    if let Some(w) = args.words.first() {
        eprintln!("error: unexpected word {w:?}\n\n{USAGE}");
        std::process::exit(2);
    }
    let buffer = args.size("buffer_size", 1 << 30);
    match args.text("mode").as_deref() {
        Some("target") => target(&args, buffer),
        Some("initiator") => initiator(&args, buffer),
        _ => {
            eprintln!("error: --mode target or --mode initiator\n\n{USAGE}");
            std::process::exit(2)
        }
    }
}
