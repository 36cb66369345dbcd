//! Latency: `ib_write_lat`'s ping-pong through owned posts. Each side writes into the other's
//! region with an immediate, whose receive completion tells the other side to answer.
//!
//! As perftest does, a side does not wait for its own write's completion (the peer's
//! acknowledgement) before it waits for the answer: the write's region comes back just
//! before the next write needs it, by which time the answer, sent after the write arrived,
//! has long implied that acknowledgement.

use crate::waits::Waits;
use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{Access, InlinePending, Local, MemoryRegion, Pending, QueuePair, RemoteRegion};
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

/// A write in flight: its region comes back with its completion.
enum InFlight<'q, B: Backing> {
    Owned(Pending<'q, B>),
    Inline(InlinePending<'q>),
}

/// This side's writes: the source region, or the write that holds it.
struct Pinger<'q, B: Backing> {
    qp: &'q QueuePair,
    remote: RemoteRegion,
    len: u64,
    /// Some(bytes) for inline writes.
    payload: Option<Vec<u8>>,
    idle: Option<MemoryRegion<B>>,
    busy: Option<InFlight<'q, B>>,
}

impl<'q, B: Backing> Pinger<'q, B> {
    /// Waits for the previous write, if any, and takes its region back.
    fn settle(&mut self, waits: &Waits) {
        match self.busy.take() {
            Some(InFlight::Owned(p)) => {
                let done = waits.finish(p).unwrap_or_else(|e| fail(&e.to_string()));
                self.idle = Some(done.region);
            }
            Some(InFlight::Inline(p)) => {
                waits.finish(p).unwrap_or_else(|e| fail(&e.to_string()));
            }
            None => {}
        }
    }

    /// Posts the next write (with an immediate), after the previous one has completed.
    fn ping(&mut self, waits: &Waits) {
        self.settle(waits);
        let posted = match &self.payload {
            Some(data) => self
                .qp
                .post_write_inline(data, self.remote, Some(1))
                .map(InFlight::Inline)
                .map_err(|e| e.to_string()),
            None => {
                let region = self.idle.take().unwrap_or_else(|| fail("no source region"));
                self.qp
                    .post_write(Local::new(region, 0..self.len), self.remote, Some(1))
                    .map(InFlight::Owned)
                    .map_err(|e| e.to_string())
            }
        };
        self.busy = Some(posted.unwrap_or_else(|e| fail(&e)));
    }
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
    let mut recvs: VecDeque<_> = (0..2)
        .map(|_| {
            qp.post_recv(region(Access::LOCAL_WRITE))
                .unwrap_or_else(|e| fail(&e.to_string()))
        })
        .collect();
    let mut pinger = Pinger {
        qp,
        remote,
        len: run.size as u64,
        payload: run.inline.then(|| vec![0x5au8; run.size]),
        idle: Some(region(Access::empty())),
        busy: None,
    };
    let waits = Waits::new(run.awaited);
    // One slot per round trip, made before the clock starts: the loop allocates nothing.
    let mut rtt_ns: Vec<u64> = Vec::with_capacity(run.iters);
    let start = Instant::now();
    for _ in 0..run.iters {
        let t0 = Instant::now();
        if client {
            pinger.ping(&waits);
        }
        let r = recvs
            .pop_front()
            .unwrap_or_else(|| fail("no receive posted"));
        let buf = waits
            .finish(r)
            .unwrap_or_else(|e| fail(&e.to_string()))
            .region;
        recvs.push_back(qp.post_recv(buf).unwrap_or_else(|e| fail(&e.to_string())));
        if !client {
            pinger.ping(&waits);
        }
        rtt_ns.push(t0.elapsed().as_nanos() as u64);
    }
    let total = start.elapsed().as_secs_f64();
    pinger.settle(&waits);
    drop(recvs);
    client.then(|| Latency::of(total, rtt_ns))
}

impl Latency {
    /// From the round trips' times (`rtt_ns`, one per round trip) and their total in seconds.
    pub fn of(total_secs: f64, mut rtt_ns: Vec<u64>) -> Latency {
        rtt_ns.sort_unstable();
        Latency {
            avg_usec: total_secs * 1e6 / (2 * rtt_ns.len().max(1)) as f64,
            typical_usec: rtt_ns.get(rtt_ns.len() / 2).copied().unwrap_or(0) as f64 / 2e3,
        }
    }
}
