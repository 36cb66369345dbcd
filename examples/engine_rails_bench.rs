//! The transfer engine's aggregate bandwidth over 1, 2 and 4 rails between two nodes, in one
//! boot, and how long a rail cut mid-batch costs: the step `cargo xtask bench --rails` runs in
//! the two-node testbed with four NICs and its PCIe topology (`--nics 4 --topology`).
//!
//! Node `a` holds one agent per rail count (on its first N devices, port 18800 + N) with a
//! segment of `--bytes`; node `b` writes batches of 1 MiB blocks into it and prints, per rail
//! count and round, one line
//! `RESULT rails=N round=R MiBps=X bytes=b0,b1,b2,b3 rates=r0,... vcpu_busy=F`: the batch's
//! bandwidth (MiB/s, from `transfer` to `wait`'s return), the bytes each link sent meanwhile
//! (the kernel's `tx_bytes` of each netdev, not the engine's counts), each link's rate in
//! Mb/s and the sending node's vCPU busy fraction over the batch (`/proc/stat`), so that a
//! reader sees whether the links or the CPU bound it. Then, over every rail, one batch with
//! rail 1's link taken down when half its blocks have landed (by an agent with a window of
//! 8 chunks per queue pair, so that most of the batch is not yet posted at the cut):
//! `RESULT failover rails=N half_s=H rest_s=S uncut_MiBps=U done_at_cut=D/T cut_bytes=c0,...`:
//! the time to the half, the time from the cut to the batch's end, the blocks done when the
//! cut returned (a cut that lands late has little or nothing to fail over), and the bytes each
//! link sent after the cut. Every rail is listed nearest host memory (`Settings::nics`), so
//! that the topology's NUMA ranking does not leave rail 3 out.
//!
//! ```sh
//! engine_rails_bench [--bytes 64M] [--rounds 3] [--rails 1,2,4]
//! ```
//! It reads the testbed's environment: `NODE`, `RDMA_DEVICES`, `NETDEVS`, `LOCAL_ADDR`,
//! `PEER_ADDR` and `TESTBED_NIC_SPEEDS`.

use examples::Args;
use gpu_rdma_engine::{Agent, Batch, EntryStatus, Settings};
use rdma_dmabuf::HostBuffer;
use std::time::{Duration, Instant};

type Res<T> = Result<T, Box<dyn std::error::Error>>;
const BLOCK: u64 = 1 << 20;
const PORT: u16 = 18_800;
const WAIT: Duration = Duration::from_secs(900);
const USAGE: &str = "usage: engine_rails_bench [--bytes 64M] [--rounds 3] [--rails 1,2,4]";

/// The testbed's variable `k`, split into words.
fn words(k: &str) -> Vec<String> {
    let v = examples::args::env(k).unwrap_or_else(|| examples::fail(&format!("{k} is not set")));
    v.split_whitespace().map(str::to_string).collect()
}

/// An agent on `devices`, every one of them listed nearest any memory.
fn agent(name: &str, devices: &[String], bind: String) -> Res<Agent> {
    let settings = Settings {
        devices: Some(devices.to_vec()),
        bind: bind.parse()?,
        nics: Some(format!("*={}", devices.join(",")).parse()?),
        ..Settings::default()
    };
    Ok(Agent::new(name, settings)?)
}

/// Bytes each of `netdevs` has sent so far.
fn sent(netdevs: &[String]) -> Vec<u64> {
    netdevs
        .iter()
        .map(|d| {
            std::fs::read_to_string(format!("/sys/class/net/{d}/statistics/tx_bytes"))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// (busy, total) jiffies of every CPU so far (`/proc/stat`'s first line; idle and iowait
/// are not busy).
fn cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    let total: u64 = v.iter().sum();
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn joined(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// One batch writing every block of `bytes`, in a scattered order.
fn batch(bytes: u64) -> Batch {
    let blocks = bytes / BLOCK;
    (0..blocks).fold(Batch::new(), |b, j| {
        let k = (j * 7) % blocks;
        b.write("src", k * BLOCK, "a", "dst", k * BLOCK, BLOCK)
    })
}

/// `b.transfer(batch)`, retried while node a is still starting.
fn submit(b: &Agent, batch: &Batch) -> Res<gpu_rdma_engine::Transfer> {
    let start = Instant::now();
    loop {
        match b.transfer(batch) {
            Ok(t) => return Ok(t),
            Err(e) if start.elapsed() < Duration::from_secs(120) => {
                eprintln!("waiting for node a: {e}");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Node a: one agent per rail count, each with a segment, until node b has notified each.
fn serve(devices: &[String], rails: &[usize], bytes: u64) -> Res<()> {
    let local = std::env::var("LOCAL_ADDR")?;
    let mut agents = Vec::new();
    for &n in rails {
        let a = agent("a", &devices[..n], format!("{local}:{}", PORT + n as u16))?;
        a.register("dst", HostBuffer::new(bytes as usize)?)?;
        agents.push(a);
    }
    let (busy0, total0) = cpu();
    for a in &agents {
        a.wait_notification(WAIT).ok_or("node b never finished")?;
    }
    let (busy1, total1) = cpu();
    println!(
        "RESULT receiver vcpu_busy={:.2}",
        (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64
    );
    Ok(())
}

/// Node b: the rounds per rail count, then the failover batch over the most rails.
fn send(devices: &[String], rails: &[usize], bytes: u64, rounds: u32) -> Res<()> {
    let (local, peer) = (std::env::var("LOCAL_ADDR")?, std::env::var("PEER_ADDR")?);
    let netdevs = words("NETDEVS");
    let rates = words("TESTBED_NIC_SPEEDS");
    let blocks = batch(bytes);
    let mut uncut = 0.0;
    for &n in rails {
        let b = agent("b", &devices[..n], format!("{local}:0"))?;
        b.add_peer("a", format!("{peer}:{}", PORT + n as u16).parse()?);
        b.register("src", HostBuffer::new(bytes as usize)?)?;
        submit(&b, &batch(4 * BLOCK))?.wait(WAIT)?;
        for round in 0..rounds {
            let (before, (busy0, total0)) = (sent(&netdevs), cpu());
            let start = Instant::now();
            b.transfer(&blocks)?.wait(WAIT)?;
            let secs = start.elapsed().as_secs_f64();
            let (busy1, total1) = cpu();
            let moved: Vec<u64> = sent(&netdevs)
                .iter()
                .zip(&before)
                .map(|(a, b)| a - b)
                .collect();
            let mibps = bytes as f64 / secs / f64::from(1 << 20);
            println!(
                "RESULT rails={n} round={round} MiBps={mibps:.2} bytes={} rates={} vcpu_busy={:.2}",
                joined(&moved),
                rates[..n].join(","),
                (busy1 - busy0) as f64 / (total1 - total0).max(1) as f64
            );
            if n == *rails.last().expect("a rail count") {
                uncut = f64::max(uncut, mibps);
            }
        }
        if n == *rails.last().expect("a rail count") && n > 1 {
            // A window of 8 chunks per queue pair (16 MiB in flight over four rails), so
            // that most of the batch is still to be posted when the rail is cut.
            let f = Agent::new(
                "b-failover",
                Settings {
                    in_flight: 8,
                    devices: Some(devices[..n].to_vec()),
                    bind: format!("{local}:0").parse()?,
                    nics: Some(format!("*={}", devices[..n].join(",")).parse()?),
                    ..Settings::default()
                },
            )?;
            f.add_peer("a", format!("{peer}:{}", PORT + n as u16).parse()?);
            f.register("src", HostBuffer::new(bytes as usize)?)?;
            submit(&f, &batch(4 * BLOCK))?.wait(WAIT)?;
            failover(&f, &blocks, &netdevs, uncut)?;
        }
        b.transfer(
            &Batch::new()
                .write("src", 0, "a", "dst", 0, BLOCK)
                .notify(b"done".to_vec()),
        )?
        .wait(WAIT)?;
    }
    Ok(())
}

/// One batch over every rail with rail 1's link cut when half its blocks have landed.
fn failover(b: &Agent, blocks: &Batch, netdevs: &[String], uncut: f64) -> Res<()> {
    let start = Instant::now();
    let t = b.transfer(blocks)?;
    let half = t.status().len() / 2;
    while t
        .status()
        .iter()
        .filter(|s| **s == EntryStatus::Done)
        .count()
        < half
    {
        if start.elapsed() > WAIT {
            return Err("half the batch never landed".into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let half_s = start.elapsed().as_secs_f64();
    examples::link::set_link(&netdevs[1], false)?;
    let at_cut = sent(netdevs);
    let status = t.status();
    let done_at_cut = status.iter().filter(|s| **s == EntryStatus::Done).count();
    let ended = t.wait(WAIT);
    let rest_s = start.elapsed().as_secs_f64() - half_s;
    let moved: Vec<u64> = sent(netdevs)
        .iter()
        .zip(&at_cut)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    examples::link::set_link(&netdevs[1], true)?;
    ended?;
    println!(
        "RESULT failover rails={} half_s={half_s:.2} rest_s={rest_s:.2} uncut_MiBps={uncut:.2} \
         done_at_cut={done_at_cut}/{} cut_bytes={}",
        netdevs.len(),
        status.len(),
        joined(&moved)
    );
    // The rail back before the next step (it is left out for `rail_probe_after` anyway).
    let state = format!(
        "/sys/class/infiniband/{}/ports/1/state",
        words("RDMA_DEVICES")[1]
    );
    let back = Instant::now();
    while !std::fs::read_to_string(&state).is_ok_and(|s| s.contains("ACTIVE")) {
        if back.elapsed() > Duration::from_secs(30) {
            return Err("rail 1 stayed down".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn main() -> Res<()> {
    let args = Args::parse(USAGE, &["bytes", "rounds", "rails"]);
    let bytes = args.size("bytes", 64 << 20).div_ceil(BLOCK) * BLOCK;
    let rounds: u32 = args.get("rounds", 3);
    let devices = words("RDMA_DEVICES");
    let rails: Vec<usize> = args
        .text("rails")
        .unwrap_or_else(|| "1,2,4".into())
        .split(',')
        .map(|w| w.parse().unwrap_or_else(|_| examples::fail(USAGE)))
        .filter(|&n| n > 0 && n <= devices.len())
        .collect();
    if rails.is_empty() || rounds == 0 || bytes < 8 * BLOCK {
        examples::fail(&format!(
            "{USAGE}\n(no rail count fits {} devices, or too little)",
            devices.len()
        ));
    }
    match std::env::var("NODE").as_deref() {
        Ok("a") => serve(&devices, &rails, bytes),
        Ok("b") => send(&devices, &rails, bytes, rounds),
        _ => examples::fail("NODE is not a or b: run it in the two-node testbed"),
    }
}
