//! The transfer engine end to end, in one process: N agents over the same RDMA device(s);
//! agent 0 holds source segments from vgem, udmabuf, the system heap and host memory; a
//! batch of scattered 64 KiB blocks is written into the other agents' segments, read back
//! into a host segment, and every byte is checked.
//!
//! ```sh
//! cargo run -p examples --example engine_transfer -- [--agents N] [--blocks N]
//! ```
//! (`RDMA_DEVICE=rxe0` picks the device; default: every device with an active port.) The
//! agents authenticate each other with a cluster key made for the run.

use drm_export::{DmaBuf, DmaHeap, DrmDevice, DumbBuffer, NodeKind, Udmabuf};
use gpu_rdma_engine::{Agent, Auth, Batch, ClusterKey, Memory, Settings};
use rdma_dmabuf::HostBuffer;
use std::time::{Duration, Instant};

const BLOCK: u64 = 64 << 10;
const SRC: u64 = 4 << 20;
type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn usage() -> ! {
    eprintln!("usage: engine_transfer [--agents N (2..16)] [--blocks N]");
    std::process::exit(2)
}

fn args() -> (usize, u64) {
    let (mut agents, mut blocks) = (2usize, 1024u64);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let v = it
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| usage());
        match a.as_str() {
            "--agents" if (2..=16).contains(&v) => agents = v as usize,
            "--blocks" if v > 0 => blocks = v,
            _ => usage(),
        }
    }
    (agents, blocks)
}

fn pattern(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// A dma-buf from each exporter, and host memory, each filled with its pattern.
fn sources() -> Res<Vec<(String, Memory, Vec<u8>)>> {
    let card = DrmDevice::open_driver("vgem", NodeKind::Card)?;
    let dmabufs: [(&str, DmaBuf); 3] = [
        (
            "vgem",
            DumbBuffer::new(&std::sync::Arc::new(card), SRC)?.export()?,
        ),
        ("udmabuf", Udmabuf::new(SRC)?.into_parts().1),
        ("system-heap", DmaHeap::system()?.allocate(SRC)?),
    ];
    let mut out = Vec::new();
    for (k, (name, mut d)) in dmabufs.into_iter().enumerate() {
        let p = pattern(SRC, k as u8 + 1);
        d.map()?.write()?.write_at(0, &p)?;
        out.push((name.to_string(), Memory::DmaBuf(d), p));
    }
    let p = pattern(SRC, 9);
    out.push(("host".into(), Memory::Host(HostBuffer::from_slice(&p)?), p));
    Ok(out)
}

fn bytes(m: Memory) -> Res<Vec<u8>> {
    Ok(match m {
        Memory::Host(h) => h.as_slice().to_vec(),
        Memory::DmaBuf(mut d) => d.map()?.read()?.to_vec(),
        other => return Err(format!("no bytes to read in {other:?}").into()),
    })
}

fn main() -> Res<()> {
    let (n, blocks) = args();
    // Every agent of a cluster holds its key; these are all in this process, so one made
    // here serves (a cluster keeps one in a file: ClusterKey::from_file, or the
    // GPU_RDMA_CLUSTER_KEY_FILE variable that Settings::default() reads).
    let settings = Settings {
        devices: std::env::var("RDMA_DEVICE").ok().map(|d| vec![d]),
        bind: "127.0.0.1:0".parse()?,
        auth: Auth::ClusterKey(ClusterKey::generate()?),
        ..Settings::default()
    };
    let agents: Vec<Agent> = (0..n)
        .map(|i| Agent::new(&format!("agent{i}"), settings.clone()))
        .collect::<Result<_, _>>()?;
    let (a, peers) = agents.split_first().expect("two or more");
    let per_peer = blocks.div_ceil(peers.len() as u64);
    for p in peers {
        a.add_peer(p.name(), p.address());
        p.register("dst", HostBuffer::new((per_peer * BLOCK) as usize)?)?;
    }
    let mut patterns = Vec::new();
    for (name, memory, p) in sources()? {
        a.register(&name, memory)?;
        patterns.push((name, p));
    }
    a.register("back", HostBuffer::new((blocks * BLOCK) as usize)?)?;
    // Block j: source j % 4 at a scattered offset, to peer j % (n-1) at a scattered slot.
    let src = |j: u64| ((j % 4) as usize, ((j * 7) % (SRC / BLOCK)) * BLOCK);
    let dst = |j: u64| {
        let p = (j % peers.len() as u64) as usize;
        (p, ((j / peers.len() as u64 * 37) % per_peer) * BLOCK)
    };
    let (mut write, mut read) = (Batch::new(), Batch::new());
    for j in 0..blocks {
        let ((s, so), (p, slot)) = (src(j), dst(j));
        write = write.write(&patterns[s].0, so, peers[p].name(), "dst", slot, BLOCK);
        read = read.read("back", j * BLOCK, peers[p].name(), "dst", slot, BLOCK);
    }
    let limit = Duration::from_secs(600);
    let t0 = Instant::now();
    a.transfer(&write.notify(b"written".to_vec()))?
        .wait(limit)?;
    let wrote = t0.elapsed();
    for p in peers {
        p.wait_notification(Duration::from_secs(10))
            .ok_or("no notification")?;
    }
    let t1 = Instant::now();
    a.transfer(&read)?.wait(limit)?;
    let read_t = t1.elapsed();
    let back = bytes(a.unregister("back")?)?;
    for j in 0..blocks {
        let (s, so) = src(j);
        let want = &patterns[s].1[so as usize..(so + BLOCK) as usize];
        if back[(j * BLOCK) as usize..((j + 1) * BLOCK) as usize] != *want {
            return Err(format!("block {j}: read back differs").into());
        }
    }
    let mib = (blocks * BLOCK) as f64 / (1 << 20) as f64;
    println!("agents: {n} on {:?}", a.devices());
    println!(
        "sources: {}",
        patterns
            .iter()
            .map(|p| p.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("blocks: {blocks} x 64 KiB ({mib:.0} MiB), scattered");
    println!(
        "write: {wrote:.2?} ({:.1} MiB/s)",
        mib / wrote.as_secs_f64()
    );
    println!(
        "read back: {read_t:.2?} ({:.1} MiB/s)",
        mib / read_t.as_secs_f64()
    );
    println!("verified: every byte");
    Ok(())
}
