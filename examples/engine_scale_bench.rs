//! The transfer engine's costs against its scale, in one process over rxe loopback (or any
//! device): the step of `cargo xtask bench --scale`, which plots them. Two forms:
//!
//! * `entries --counts 10,1000,100000`: per count N, one batch of N writes of 64 bytes from an
//!   initiator's segment to a peer's (one chunk each), timed from the batch's first entry to
//!   `Agent::transfer`'s return (building it, the checks, the plan, the hand-over: the
//!   submission) and to `wait`'s return (the whole batch), and the resident memory it took
//!   at its peak (the process's high-water mark, reset before it, over its resident size
//!   before); the median of `--rounds` (default 3). One line
//!   `RESULT scale=entries n=N submit_us=S total_us=T peak_kib=P` each;
//! * `segments --counts 10,1000,10000`: per count N, a new agent registers N segments of 4
//!   KiB of host memory (each its own registration), timed in all and over its last tenth,
//!   with the resident memory they added; then its peer looks up its descriptor (which names
//!   every segment) through the metadata service, the median of 5 look-ups, and its size.
//!   One line `RESULT scale=segments n=N register_us=R last_register_us=L rss_kib=M
//!   lookup_us=K descriptor_segments=D` each.
//!
//! ```sh
//! RDMA_DEVICE=rxe0 cargo run --release -p examples --example engine_scale_bench -- entries --counts 10,1000,100000
//! RDMA_DEVICE=rxe0 cargo run --release -p examples --example engine_scale_bench -- segments --counts 10,1000,10000
//! ```

use gpu_rdma_engine::{Agent, Batch, Settings};
use rdma_dmabuf::HostBuffer;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const WAIT: Duration = Duration::from_secs(600);
/// An entry's bytes.
const ENTRY: u64 = 64;
/// A segment's bytes.
const SEGMENT: usize = 4096;

fn usage() -> ! {
    eprintln!(
        "usage: engine_scale_bench entries [--counts 10,1000,100000] [--rounds 3]\n       \
         engine_scale_bench segments [--counts 10,1000,10000]"
    );
    std::process::exit(2)
}

struct Args {
    mode: String,
    counts: Vec<u64>,
    rounds: usize,
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let mode = it.next().unwrap_or_else(|| usage());
    let mut a = Args {
        counts: match mode.as_str() {
            "entries" => vec![10, 1000, 100_000],
            "segments" => vec![10, 1000, 10_000],
            _ => usage(),
        },
        mode,
        rounds: 3,
    };
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--counts" => {
                a.counts = v
                    .split(',')
                    .map(|c| c.parse().unwrap_or_else(|_| usage()))
                    .collect()
            }
            "--rounds" => a.rounds = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if a.counts.is_empty() || a.counts.contains(&0) || a.rounds == 0 {
        usage();
    }
    a
}

fn settings() -> Settings {
    Settings {
        devices: std::env::var("RDMA_DEVICE").ok().map(|d| vec![d]),
        bind: "127.0.0.1:0".parse().expect("an address"),
        ..Settings::default()
    }
}

/// Agents `a` and `b`, each knowing the other.
fn pair(a: &str, b: &str) -> Res<(Agent, Agent)> {
    let a = Agent::new(a, settings())?;
    let b = Agent::new(b, settings())?;
    a.add_peer(b.name(), b.address());
    b.add_peer(a.name(), a.address());
    Ok((a, b))
}

/// A `kB:` field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(field)?
                    .split_whitespace()
                    .next()?
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// Resets the process's resident high-water mark (`VmHWM`) to its resident size now.
fn reset_peak() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn entries(a: &Args) -> Res<()> {
    let most = *a.counts.iter().max().expect("counts");
    let (init, peer) = pair("scale-a", "scale-b")?;
    let len = (most * ENTRY) as usize;
    init.register("src", HostBuffer::new(len)?)?;
    peer.register("dst", HostBuffer::new(len)?)?;
    init.wait_for_peer(peer.name(), Duration::from_secs(30))?;
    // One batch first, out of the count: queue pairs made, descriptors fetched.
    let warm = Batch::new().write("src", 0, peer.name(), "dst", 0, ENTRY);
    init.transfer(&warm)?.wait(WAIT)?;
    for &n in &a.counts {
        let (mut submit, mut total, mut peak) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            reset_peak();
            let before = status_kib("VmRSS:");
            let t0 = Instant::now();
            let batch = (0..n).fold(Batch::new(), |b, k| {
                b.write("src", k * ENTRY, peer.name(), "dst", k * ENTRY, ENTRY)
            });
            let t = init.transfer(&batch)?;
            let submitted = t0.elapsed();
            t.wait(WAIT)?;
            total.push(t0.elapsed().as_secs_f64() * 1e6);
            submit.push(submitted.as_secs_f64() * 1e6);
            peak.push(status_kib("VmHWM:").saturating_sub(before) as f64);
        }
        println!(
            "RESULT scale=entries n={n} submit_us={:.0} total_us={:.0} peak_kib={:.0}",
            median(submit),
            median(total),
            median(peak)
        );
    }
    Ok(())
}

fn segments(a: &Args) -> Res<()> {
    for (i, &n) in a.counts.iter().enumerate() {
        // A new pair per count: the registrations of the last one are gone.
        let (owner, peer) = pair(&format!("seg-a{i}"), &format!("seg-b{i}"))?;
        let buffers: Vec<HostBuffer> = (0..n)
            .map(|_| HostBuffer::new(SEGMENT))
            .collect::<Result<_, _>>()?;
        let before = status_kib("VmRSS:");
        let tail_from = n - (n / 10).max(1);
        let t0 = Instant::now();
        let mut tail = Duration::ZERO;
        for (k, b) in buffers.into_iter().enumerate() {
            let t = Instant::now();
            owner.register(&format!("s{k}"), b)?;
            if k as u64 >= tail_from {
                tail += t.elapsed();
            }
        }
        let all = t0.elapsed();
        let rss = status_kib("VmRSS:").saturating_sub(before);
        peer.wait_for_peer(owner.name(), Duration::from_secs(30))?;
        let mut lookups = Vec::new();
        let mut named = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let d = peer.peer_descriptor(owner.name())?;
            lookups.push(t.elapsed().as_secs_f64() * 1e6);
            named = d.segments.len();
        }
        println!(
            "RESULT scale=segments n={n} register_us={:.1} last_register_us={:.1} rss_kib={rss} \
             lookup_us={:.0} descriptor_segments={named}",
            all.as_secs_f64() * 1e6 / n as f64,
            tail.as_secs_f64() * 1e6 / (n - tail_from) as f64,
            median(lookups)
        );
    }
    Ok(())
}

fn main() -> Res<()> {
    let a = args();
    match a.mode.as_str() {
        "entries" => entries(&a),
        _ => segments(&a),
    }
}
