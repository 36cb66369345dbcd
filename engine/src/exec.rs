//! Posting one round of one segment's chunks: the region is split into one owned shard per
//! chunk (the round's ranges are disjoint), each shard moves into its request and comes back
//! with its completion, and the shards are joined into the region again.
//!
//! Nothing here allocates per chunk: the shard list, the in-flight queue and the window
//! counters are allocated once per (round, segment), and a post or a completion allocates
//! nothing (rdma-dmabuf's owned layer uses the queue pair's preallocated slots).

use crate::batch::Op;
use crate::error::Error;
use crate::peer::PeerConn;
use crate::plan::Chunk;
use crate::progress::Progress;
use rdma_dmabuf::{
    Backing, MemoryRegion, PartsDone, PartsError, PartsPending, RemoteRegion, Shard,
};
use std::collections::VecDeque;

/// The worker's view of one peer of the batch.
pub(crate) struct Lane<'c> {
    /// `None` when it could not be reached.
    pub conn: Option<&'c PeerConn>,
    /// Why it is down, once it is: later chunks to it are not posted.
    pub down: Option<Error>,
}

impl Lane<'_> {
    /// Marks the peer down with its first failure (later ones are the flush of the same).
    fn mark_down(&mut self, agent: &str, cause: &dyn std::fmt::Display) -> Error {
        self.down
            .get_or_insert_with(|| Error::PeerDown {
                agent: agent.into(),
                cause: cause.to_string(),
            })
            .clone()
    }
}

type InFlight<'c, B> = VecDeque<(usize, u16, PartsPending<'c, Shard<B>, 1>)>;

/// Runs chunks `picks` (of `chunks`) from `region`; the region back, or `None` if a shard
/// could not be joined (never expected: every shard is kept until its completion).
pub(crate) fn run<'c, B: Backing>(
    region: MemoryRegion<B>,
    chunks: &[Chunk],
    picks: &[usize],
    lanes: &mut [Lane<'c>],
    progress: &Progress,
    window: usize,
) -> Option<MemoryRegion<B>> {
    let ranges = picks
        .iter()
        .map(|&c| chunks[c].offset..chunks[c].offset + chunks[c].len);
    let shards = match region.split(ranges.collect::<Vec<_>>()) {
        Ok(s) => s,
        Err(e) => {
            let err = Error::rdma("split a segment into chunks", &e.error);
            for &c in picks {
                progress.fail(chunks[c].entry, &err);
            }
            return Some(e.region);
        }
    };
    let mut shards: Vec<Option<Shard<B>>> = shards.into_iter().map(Some).collect();
    let mut in_flight: InFlight<'c, B> = VecDeque::with_capacity(picks.len().min(4096));
    let mut outstanding = vec![0usize; lanes.len()];
    let step = |q: &mut InFlight<'c, B>,
                out: &mut [usize],
                sh: &mut [Option<Shard<B>>],
                lanes: &mut [Lane<'c>]| {
        complete_front(q, out, sh, lanes, chunks, picks, progress)
    };
    for (k, &c) in picks.iter().enumerate() {
        let ch = chunks[c];
        let lane = &mut lanes[usize::from(ch.peer)];
        if let Some(e) = &lane.down {
            progress.fail(ch.entry, e);
            continue;
        }
        let qp = match lane
            .conn
            .and_then(|p| p.qp(ch.local_device, ch.remote_device))
        {
            Some(q) => q,
            None => {
                let e = lane.mark_down("?", &"no queue pair to the peer");
                progress.fail(ch.entry, &e);
                continue;
            }
        };
        while outstanding[usize::from(ch.peer)] >= window {
            step(&mut in_flight, &mut outstanding, &mut shards, lanes);
        }
        let shard = shards[k].take().expect("each shard is posted once");
        let remote = RemoteRegion {
            addr: ch.remote_addr,
            len: ch.len,
            rkey: ch.rkey,
        };
        let posted = match ch.op {
            Op::Write => qp.post_write_parts([shard], remote, None),
            Op::Read => qp.post_read_parts([shard], remote),
        };
        match posted {
            Ok(p) => {
                outstanding[usize::from(ch.peer)] += 1;
                in_flight.push_back((k, ch.peer, p));
            }
            Err(PartsError { error, parts: [s] }) => {
                shards[k] = Some(s);
                let agent = lanes[usize::from(ch.peer)]
                    .conn
                    .map_or("?", |p| p.agent.as_str());
                let agent = agent.to_string();
                let e = lanes[usize::from(ch.peer)].mark_down(&agent, &error);
                progress.fail(ch.entry, &e);
            }
        }
    }
    while !in_flight.is_empty() {
        step(&mut in_flight, &mut outstanding, &mut shards, lanes);
    }
    rdma_dmabuf::Shard::join(shards.into_iter().flatten()).ok()
}

/// Waits for the oldest request in flight (a queue pair completes in order, so it is the
/// first to end on its queue pair) and records its outcome.
fn complete_front<'c, B: Backing>(
    in_flight: &mut InFlight<'c, B>,
    outstanding: &mut [usize],
    shards: &mut [Option<Shard<B>>],
    lanes: &mut [Lane<'c>],
    chunks: &[Chunk],
    picks: &[usize],
    progress: &Progress,
) {
    let Some((k, peer, pending)) = in_flight.pop_front() else {
        return;
    };
    outstanding[usize::from(peer)] -= 1;
    let entry = chunks[picks[k]].entry;
    // Bounded: the queue pair's retry budget ends every request (Settings::peer_failure_bound).
    match pending.spin() {
        Ok(PartsDone { parts: [s], .. }) => {
            shards[k] = Some(s);
            progress.chunk_done(entry);
        }
        Err(PartsError { error, parts: [s] }) => {
            shards[k] = Some(s);
            let lane = &mut lanes[usize::from(peer)];
            let agent = lane.conn.map_or("?", |p| p.agent.as_str()).to_string();
            let e = lane.mark_down(&agent, &error);
            progress.fail(entry, &e);
        }
    }
}
