//! Gather writes: each RDMA write gathers [`PARTS`] blocks of `--size` bytes, the shards of one
//! region, into one message, against `bw.rs`'s one write per block.

use crate::bw::{windowed, Bandwidth};
use crate::waits::Waits;
use crate::Run;
use examples::fail;
use rdma_dmabuf::Backing;
use rdma_dmabuf::{Access, MemoryRegion, QueuePair, RemoteRegion, Shard};
use std::time::Instant;

/// Blocks per write.
pub const PARTS: usize = 16;

/// Writes `run.iters` messages of [`PARTS`] blocks of `run.size` bytes into `remote`, keeping
/// `run.window` in flight, each from its own region split into [`PARTS`] shards. Bandwidth
/// counts every byte; the message rate counts blocks, to set beside one write per block.
pub fn client<B: Backing>(
    qp: &QueuePair,
    remote: RemoteRegion,
    region: &impl Fn(Access) -> MemoryRegion<B>,
    run: &Run,
) -> Bandwidth {
    let block = run.size as u64;
    let free: Vec<[Shard<B>; PARTS]> = (0..run.window.min(run.iters))
        .map(|_| blocks(region(Access::empty()), block))
        .collect();
    let waits = Waits::new(run.awaited);
    let start = Instant::now();
    let regions = windowed(
        run.iters,
        free,
        |parts| match qp.post_write_parts(parts, remote, None) {
            Ok(p) => p,
            Err(e) => fail(&e.to_string()),
        },
        |p| {
            waits
                .finish(p)
                .unwrap_or_else(|e| fail(&e.to_string()))
                .parts
        },
    );
    let bw = Bandwidth::since(start, run.iters * PARTS, run.size);
    drop(regions); // deregistered after the clock stopped (see `windowed`)
    bw
}

/// The region's first [`PARTS`] blocks of `block` bytes, as shards.
fn blocks<B: Backing>(region: MemoryRegion<B>, block: u64) -> [Shard<B>; PARTS] {
    let shards = region
        .split_into_chunks(block)
        .unwrap_or_else(|e| fail(&e.to_string()));
    let first: Vec<_> = shards.into_iter().take(PARTS).collect();
    first
        .try_into()
        .unwrap_or_else(|_| fail("a region too short for the blocks"))
}
