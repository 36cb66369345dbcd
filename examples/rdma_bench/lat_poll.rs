//! Latency without a receive completion (`--mode lat-poll`): `ib_write_lat`'s ping-pong,
//! each side learning that the peer's write landed by watching the last byte of its own
//! region (`MemoryRegion::read_volatile`), where each write carries a sequence number, as
//! perftest polls the last byte of its buffer. No write carries an immediate and no receive
//! is posted; each write is still owned and its region comes back with its completion
//! (taken before the next write, long after it arrived).

use crate::lat::Latency;
use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{
    Access, DmaBuf, HostBuffer, Local, MemoryRegion, Pending, QueuePair, RemoteRegion,
};
use std::time::Instant;

/// A region this side can watch for the peer's sequence byte: host memory only.
pub trait Watch {
    /// The byte at `at`, read with a volatile read.
    fn byte(&self, at: u64) -> u8;
    /// Sets the byte at `at` (of a region that is not remotely writable).
    fn stamp(&mut self, at: u64, value: u8);
}

impl Watch for MemoryRegion<HostBuffer> {
    fn byte(&self, at: u64) -> u8 {
        let mut b = [0u8];
        self.read_volatile(at, &mut b)
            .unwrap_or_else(|e| fail(&e.to_string()));
        b[0]
    }
    fn stamp(&mut self, at: u64, value: u8) {
        match self.bytes_mut() {
            Ok(bytes) => bytes[at as usize] = value,
            Err(e) => fail(&e.to_string()),
        }
    }
}

impl Watch for MemoryRegion<DmaBuf> {
    fn byte(&self, _: u64) -> u8 {
        fail("--mode lat-poll watches host regions only (--region host)")
    }
    fn stamp(&mut self, _: u64, _: u8) {
        fail("--mode lat-poll writes from host regions only (--region host)")
    }
}

/// The sequence byte of round trip `i`: never 0, the value the regions start with.
fn seq(i: usize) -> u8 {
    (i % 255) as u8 + 1
}

/// Runs `run.iters` round trips watching `target`; the client pings first. Returns the
/// client's figures (the server's are `None`).
pub fn run<B: Backing>(
    qp: &QueuePair,
    remote: RemoteRegion,
    target: &MemoryRegion<B>,
    region: &impl Fn(Access) -> MemoryRegion<B>,
    run: &Run,
    client: bool,
) -> Option<Latency>
where
    MemoryRegion<B>: Watch,
{
    let last = run.size as u64 - 1;
    let mut idle = Some(region(Access::empty()));
    let mut busy: Option<Pending<'_, B>> = None;
    let mut ping = |i: usize| {
        if let Some(p) = busy.take() {
            idle = Some(p.spin().unwrap_or_else(|e| fail(&e.to_string())).region);
        }
        let mut src = idle.take().unwrap_or_else(|| fail("no source region"));
        src.stamp(last, seq(i));
        let p = qp
            .post_write(Local::new(src, 0..last + 1), remote, None)
            .unwrap_or_else(|e| fail(&e.to_string()));
        busy = Some(p);
    };
    let landed = |i: usize| {
        // No `spin_loop()` (PAUSE) between reads, as perftest's loop has none: under the
        // testbed's emulator (QEMU TCG) a PAUSE leaves the emulated CPU's loop, which made
        // this wait about twice as long as perftest's (docs/performance.md, "One-node
        // latency and PAUSE").
        while target.byte(last) != seq(i) {}
    };
    let mut rtt_ns: Vec<u64> = Vec::with_capacity(run.iters);
    let start = Instant::now();
    for i in 0..run.iters {
        let t0 = Instant::now();
        if client {
            ping(i);
            landed(i);
        } else {
            landed(i);
            ping(i);
        }
        rtt_ns.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed().as_secs_f64();
    if let Some(p) = busy {
        p.spin().unwrap_or_else(|e| fail(&e.to_string()));
    }
    client.then(|| Latency::of(total, rtt_ns))
}
