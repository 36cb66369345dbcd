//! Bandwidth with batched completions (`--mode batch`): the writes of `bw.rs`, posted
//! [`BATCH`] at a time with `post_write_batch`, only the last of each batch signalled, as
//! perftest's `ib_write_bw` signals one write in a hundred. Every region still comes back
//! with a completion: its batch's.

use crate::bw::{windowed, Bandwidth};
use crate::waits::Waits;
use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{Access, Local, MemoryRegion, QueuePair, RemoteRegion};
use std::time::Instant;

/// Writes per batch (one completion each).
pub const BATCH: usize = 16;

/// Writes `run.iters` messages (rounded up to whole batches) of `run.size` bytes into
/// `remote`, keeping `run.window` writes in flight (whole batches, at least one), each from
/// its own region.
pub fn client<B: Backing>(
    qp: &QueuePair,
    remote: RemoteRegion,
    region: &impl Fn(Access) -> MemoryRegion<B>,
    run: &Run,
) -> Bandwidth {
    let len = run.size as u64;
    let batches = run.iters.div_ceil(BATCH);
    let free: Vec<[Local<B>; BATCH]> = (0..(run.window / BATCH).clamp(1, batches))
        .map(|_| std::array::from_fn(|_| Local::new(region(Access::empty()), 0..len)))
        .collect();
    let waits = Waits::new(run.awaited);
    let start = Instant::now();
    let regions = windowed(
        batches,
        free,
        |parts| {
            qp.post_write_batch(parts, [remote; BATCH])
                .unwrap_or_else(|e| fail(&e.to_string()))
        },
        |p| {
            waits
                .finish(p)
                .unwrap_or_else(|e| fail(&e.to_string()))
                .parts
        },
    );
    let bw = Bandwidth::since(start, batches * BATCH, run.size);
    drop(regions); // deregistered after the clock stopped (see `windowed`)
    bw
}
