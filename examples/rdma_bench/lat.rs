//! Latency: `ib_write_lat`'s ping-pong through owned posts. Each side writes into the other's
//! region with an immediate, whose receive completion tells the other side to answer.

use crate::Run;
use examples::fail;
use rdma_dmabuf::mr::Backing;
use rdma_dmabuf::{Access, Local, MemoryRegion, QueuePair, RemoteRegion};
use std::collections::VecDeque;
use std::time::Instant;

/// What the client measured (one-way: half a round trip).
#[derive(Clone, Copy, Debug)]
pub struct Latency {
    /// The mean.
    pub avg_usec: f64,
    /// The median (perftest's `t_typical`).
    pub typical_usec: f64,
}

/// Runs `run.iters` round trips; the client pings first. Returns the client's figures (the
/// server's are `None`).
pub fn run<B: Backing>(
    qp: &QueuePair,
    remote: RemoteRegion,
    region: &impl Fn(Access) -> MemoryRegion<B>,
    run: &Run,
    client: bool,
) -> Option<Latency> {
    let len = run.size as u64;
    let mut recvs: VecDeque<_> = (0..2)
        .map(|_| {
            qp.post_recv(region(Access::LOCAL_WRITE))
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect();
    let mut src = Some(region(Access::empty()));
    let payload = vec![0x5au8; if run.inline { run.size } else { 0 }];
    // One slot per round trip, made before the clock starts: the loop allocates nothing.
    let mut rtt_ns: Vec<u64> = Vec::with_capacity(run.iters);
    let ping = |src: &mut Option<MemoryRegion<B>>| {
        if run.inline {
            qp.post_write_inline(&payload, remote, Some(1))
                .and_then(|p| p.wait())
                .unwrap_or_else(|e| fail(&e.to_string()));
            return;
        }
        let region = src.take().unwrap_or_else(|| fail("no source region"));
        let p = qp
            .post_write(Local::new(region, 0..len), remote, Some(1))
            .unwrap_or_else(|e| fail(&e.to_string()));
        *src = Some(p.wait().unwrap_or_else(|e| fail(&e.to_string())).region);
    };
    let start = Instant::now();
    for _ in 0..run.iters {
        let t0 = Instant::now();
        if client {
            ping(&mut src);
        }
        let r = recvs
            .pop_front()
            .unwrap_or_else(|| fail("no receive posted"));
        let buf = r.wait().unwrap_or_else(|e| fail(&e.to_string())).region;
        recvs.push_back(qp.post_recv(buf).unwrap_or_else(|e| fail(&e.to_string())));
        if !client {
            ping(&mut src);
        }
        rtt_ns.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed().as_secs_f64();
    drop(recvs);
    if !client {
        return None;
    }
    rtt_ns.sort_unstable();
    Some(Latency {
        avg_usec: total * 1e6 / (2 * run.iters) as f64,
        typical_usec: rtt_ns[rtt_ns.len() / 2] as f64 / 2e3,
    })
}
