//! Bandwidth and message rate: `ib_write_bw`'s measurement through owned posts.

use crate::waits::Waits;
use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{Access, Local, MemoryRegion, QueuePair, RemoteRegion};
use std::collections::VecDeque;
use std::time::Instant;

/// What the client measured.
#[derive(Clone, Copy, Debug)]
pub struct Bandwidth {
    /// MiB/s (2^20 bytes per second, as perftest's `MB/sec`).
    pub mbps: f64,
    /// Millions of messages per second.
    pub mpps: f64,
}

impl Bandwidth {
    /// `messages` of `size` bytes each, moved since `start`.
    pub fn since(start: Instant, messages: usize, size: usize) -> Bandwidth {
        let secs = start.elapsed().as_secs_f64().max(1e-9);
        let messages = messages as f64;
        Bandwidth {
            mbps: messages * size as f64 / secs / (1u64 << 20) as f64,
            mpps: messages / secs / 1e6,
        }
    }
}

/// Writes `run.iters` messages of `run.size` bytes into `remote`, keeping `run.window` in
/// flight, each from its own region (a posted region belongs to the NIC until it completes).
pub fn client<B: Backing>(
    qp: &QueuePair,
    remote: RemoteRegion,
    region: &impl Fn(Access) -> MemoryRegion<B>,
    run: &Run,
) -> Bandwidth {
    let len = run.size as u64;
    let free: Vec<_> = (0..run.window.min(run.iters))
        .map(|_| region(Access::empty()))
        .collect();
    let waits = Waits::new(run.awaited);
    let start = Instant::now();
    let regions = windowed(
        run.iters,
        free,
        |src| {
            qp.post_write(Local::new(src, 0..len), remote, None)
                .unwrap_or_else(|e| fail(&e.to_string()))
        },
        |p| {
            waits
                .finish(p)
                .unwrap_or_else(|e| fail(&e.to_string()))
                .region
        },
    );
    let bw = Bandwidth::since(start, run.iters, run.size);
    // Deregistered after the clock stopped: a dma-buf region's deregistration (vgem's
    // especially) costs far more than a host region's and is no part of a write.
    drop(regions);
    bw
}

/// Posts `iters` requests with `post`, each on a buffer of `free` (so at most `free.len()` are
/// in flight): once every buffer is lent, the oldest request is finished (`finish` waits for
/// it and gives its buffer back) before the next post. Allocates nothing after its start.
///
/// Gives every buffer back once the last request has finished, so that the caller stops its
/// clock before they are dropped: dropping a region deregisters it, which is no part of the
/// transfer (a vgem region's deregistration costs tens of writes on rxe).
#[must_use = "dropping the buffers deregisters them: stop the clock first"]
pub fn windowed<T, H>(
    iters: usize,
    mut free: Vec<T>,
    mut post: impl FnMut(T) -> H,
    mut finish: impl FnMut(H) -> T,
) -> Vec<T> {
    let mut inflight = VecDeque::with_capacity(free.len());
    for _ in 0..iters {
        let buf = match free.pop() {
            Some(b) => b,
            None => finish(
                inflight
                    .pop_front()
                    .unwrap_or_else(|| fail("no request in flight")),
            ),
        };
        inflight.push_back(post(buf));
    }
    // `free` was emptied (or never lent all it had) and has room for every buffer.
    for h in inflight {
        free.push(finish(h));
    }
    free
}
