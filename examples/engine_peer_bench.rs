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
//!
//! `--metadata_server` is `P2PHANDSHAKE` (the default: the initiator is given the target's
//! address and asks it for its segments) or, built with the `etcd` feature, an etcd's client
//! address `IP:PORT` (or `etcd://IP:PORT`, `http://IP:PORT`), as Mooncake's takes it: then the
//! target's agent is named by its `--local_server_name` and published in etcd, and the
//! initiator's `--segment_id` is that name, looked up in etcd (the untimed first batch waits
//! until it is there).

use examples::Args;
use gpu_rdma_engine::{Agent, Batch, Error, MetadataService, Settings};
use rdma_dmabuf::HostBuffer;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const USAGE: &str = "usage: engine_peer_bench --mode target --local_server_name IP:PORT \
                     --buffer_size N\n       \
                     engine_peer_bench --mode initiator --segment_id IP:PORT --buffer_size N \
                     --operation read|write --block_size N --batch_size N --threads N \
                     --duration S\n       \
                     (both: --metadata_server P2PHANDSHAKE|IP:PORT of an etcd)";
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
    "metadata_server",
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

/// Where agents find each other: the P2P handshake, or an etcd's client URL.
fn etcd_url(args: &Args) -> Option<String> {
    let m = args
        .text("metadata_server")
        .unwrap_or_else(|| "P2PHANDSHAKE".into());
    if m == "P2PHANDSHAKE" {
        return None;
    }
    let host = m
        .strip_prefix("etcd://")
        .or_else(|| m.strip_prefix("http://"))
        .unwrap_or(&m);
    Some(format!("http://{host}"))
}

/// The etcd backend at `url`, retried for a minute (the target's node may start it late).
#[cfg(feature = "etcd")]
fn etcd(url: String) -> Res<Arc<dyn MetadataService>> {
    use gpu_rdma_engine::{EtcdMetadata, EtcdSettings};
    let settings = EtcdSettings {
        endpoints: vec![url],
        // A guest under TCG answers slowly, and a busy one may renew its lease late: a
        // killed target's keys outlive it by a minute, its name is the step's own.
        timeout: Duration::from_secs(5),
        lease_ttl: Duration::from_secs(60),
        ..EtcdSettings::default()
    };
    let t0 = Instant::now();
    loop {
        match EtcdMetadata::new(settings.clone()) {
            Ok(m) => return Ok(Arc::new(m)),
            Err(_) if t0.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(not(feature = "etcd"))]
fn etcd(url: String) -> Res<Arc<dyn MetadataService>> {
    Err(format!("--metadata_server {url}: built without the etcd feature").into())
}

/// An agent `name` on `RDMA_DEVICE` (or every active device) listening at `bind`, with its
/// segment; published in the etcd at `url` when there is one.
fn agent(name: &str, bind: SocketAddr, buffer: u64, url: Option<String>) -> Res<Agent> {
    let settings = Settings {
        devices: examples::args::env("RDMA_DEVICE").map(|d| vec![d]),
        bind,
        ..Settings::default()
    };
    let a = match url {
        None => Agent::new(name, settings)?,
        Some(url) => Agent::with_metadata(name, settings, etcd(url)?)?,
    };
    a.register(SEGMENT, HostBuffer::new(usize::try_from(buffer)?)?)?;
    Ok(a)
}

fn target(args: &Args, buffer: u64) -> Res<()> {
    let url = etcd_url(args);
    let name = args
        .text("local_server_name")
        .unwrap_or_else(|| "0.0.0.0:0".into());
    let bind: SocketAddr = name
        .parse()
        .map_err(|e| format!("--local_server_name {name:?}: {e}"))?;
    // In etcd, the target is known by its name (Mooncake's segment is its server name).
    let a = agent(
        if url.is_some() { &name } else { TARGET },
        bind,
        buffer,
        url,
    )?;
    println!("listening on {}", a.address());
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// Thread `t`'s batch to agent `to`: `batch` blocks from `t * batch * block`, the same range
/// on both sides.
fn batch(r: &Run, t: u64, to: &str) -> Batch {
    (0..r.batch).fold(Batch::new(), |b, i| {
        let at = (t * r.batch + i) * r.block;
        if r.read {
            b.read(SEGMENT, at, to, SEGMENT, at, r.block)
        } else {
            b.write(SEGMENT, at, to, SEGMENT, at, r.block)
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
    let url = etcd_url(args);
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
    let span = r
        .threads
        .checked_mul(r.batch)
        .and_then(|n| n.checked_mul(r.block));
    if span.is_none_or(|n| n > buffer) {
        examples::fail(&format!(
            "--buffer_size {buffer} is less than threads x batch_size x block_size \
             ({} x {} x {})",
            r.threads, r.batch, r.block
        ));
    }
    let local = examples::args::env("LOCAL_ADDR").unwrap_or_else(|| "0.0.0.0".into());
    let bind = format!("{local}:0").parse()?;
    let to = if url.is_some() { peer.as_str() } else { TARGET };
    let batches: Vec<Batch> = (0..r.threads).map(|t| batch(&r, t, to)).collect();
    let a = if url.is_some() {
        let me = format!("initiator-{}", std::process::id());
        agent(&me, bind, buffer, url)?
    } else {
        let addr: SocketAddr = peer
            .parse()
            .map_err(|e| format!("--segment_id {peer:?}: {e}"))?;
        let a = agent("initiator", bind, buffer, None)?;
        a.add_peer(TARGET, addr);
        a
    };
    // Connections, queue pairs and the target's descriptor made before anything is timed; in
    // etcd, the target may not be published yet.
    let t0 = Instant::now();
    loop {
        match a.transfer(&batches[0]) {
            Err(Error::UnknownAgent(_) | Error::UnknownSegment { .. })
                if t0.elapsed() < Duration::from_secs(60) =>
            {
                std::thread::sleep(Duration::from_millis(200));
            }
            t => {
                t?.wait(WAIT)?;
                break;
            }
        }
    }
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
