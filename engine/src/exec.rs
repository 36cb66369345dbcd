//! Posting one round of one segment's chunks: the region is split into one owned shard per
//! chunk (the round's ranges are disjoint), each shard moves into its request and comes back
//! with its completion, and the shards are joined into the region again. A peer's chunks go
//! round-robin over its queue pairs, each with its own window.
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
    Backing, Checkout, Lent, MemoryRegion, PartsDone, PartsError, PartsPending, RemoteRegion,
    Shard, SharedDmaBuf,
};
use std::collections::VecDeque;
use std::ops::Range;

/// What a worker splits into one owned shard per chunk and joins again: a segment's region,
/// or the checkout of a CUDA segment's registration (whose shards only its [`Lent`] joins,
/// so that it goes back to the registration cache whole).
pub(crate) trait Lendable: Sized {
    /// The backing of the shards.
    type B: Backing;
    /// What the shards are joined with.
    type Home;
    /// Splits into shards of `ranges`; refused, the error and `self` back.
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self>;
    /// `self` back from every shard; `None` if they could not be joined.
    fn join(home: Self::Home, shards: Vec<Shard<Self::B>>) -> Option<Self>;
}

/// The shards of a lent region and where they go back; refused, why, with the region back.
type Lending<L> =
    Result<(Vec<Shard<<L as Lendable>::B>>, <L as Lendable>::Home), (rdma_dmabuf::Error, L)>;

impl<B: Backing> Lendable for MemoryRegion<B> {
    type B = B;
    type Home = ();
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self> {
        self.split(ranges)
            .map(|s| (s, ()))
            .map_err(|e| (e.error, e.region))
    }
    fn join((): (), shards: Vec<Shard<B>>) -> Option<Self> {
        Shard::join(shards).ok()
    }
}

impl Lendable for Checkout {
    type B = SharedDmaBuf;
    type Home = Lent;
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self> {
        self.split(ranges).map_err(|e| (e.error, e.checkout))
    }
    fn join(lent: Lent, shards: Vec<Shard<SharedDmaBuf>>) -> Option<Self> {
        lent.join(shards).ok()
    }
}

/// The worker's view of one peer of the batch.
pub(crate) struct Lane<'c> {
    /// `None` when it could not be reached.
    pub conn: Option<&'c PeerConn>,
    /// Why it is down, once it is: later chunks to it are not posted.
    pub down: Option<Error>,
    /// The queue pair the next chunk to it goes to (round-robin).
    pub next_qp: usize,
}

/// `IBV_WC_REM_ACCESS_ERR`: the responder refused the request's rkey or range.
const REMOTE_ACCESS_ERROR: u32 = 10;

impl Lane<'_> {
    /// Marks the peer down with its first failure (later ones are the flush of the same):
    /// [`Error::RemoteAccess`] when its NIC refused the key or range, [`Error::PeerDown`]
    /// otherwise.
    fn mark_down(&mut self, cause: &rdma_dmabuf::Error) -> Error {
        let agent = self.conn.map_or("?", |p| p.agent.as_str());
        self.down
            .get_or_insert_with(|| match cause {
                rdma_dmabuf::Error::Completion { status, .. } if *status == REMOTE_ACCESS_ERROR => {
                    Error::RemoteAccess {
                        agent: agent.into(),
                        cause: cause.to_string(),
                    }
                }
                _ => Error::PeerDown {
                    agent: agent.into(),
                    cause: cause.to_string(),
                },
            })
            .clone()
    }
}

/// Requests in flight: (pick, window index = peer × queue pairs + queue pair, request).
type InFlight<'c, B> = VecDeque<(usize, usize, PartsPending<'c, Shard<B>, 1>)>;

/// Runs chunks `picks` (of `chunks`) from `region`; the region back, or `None` if a shard
/// could not be joined (never expected: every shard is kept until its completion).
pub(crate) fn run<'c, L: Lendable>(
    region: L,
    chunks: &[Chunk],
    picks: &[usize],
    lanes: &mut [Lane<'c>],
    progress: &Progress,
    window: usize,
) -> Option<L> {
    let ranges = picks
        .iter()
        .map(|&c| chunks[c].offset..chunks[c].offset + chunks[c].len);
    let (shards, home) = match region.lend(ranges.collect::<Vec<_>>()) {
        Ok(s) => s,
        Err((error, region)) => {
            let err = Error::rdma("split a segment into chunks", &error);
            for &c in picks {
                progress.fail(chunks[c].entry, &err);
            }
            return Some(region);
        }
    };
    let mut shards: Vec<Option<Shard<L::B>>> = shards.into_iter().map(Some).collect();
    let mut in_flight: InFlight<'c, L::B> = VecDeque::with_capacity(picks.len().min(4096));
    let per_peer = lanes
        .iter()
        .filter_map(|l| l.conn)
        .map(PeerConn::qps_per_pair)
        .max()
        .unwrap_or(1);
    let mut outstanding = vec![0usize; lanes.len() * per_peer];
    let step = |q: &mut InFlight<'c, L::B>,
                out: &mut [usize],
                sh: &mut [Option<Shard<L::B>>],
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
        let qps = lane
            .conn
            .map_or(&[][..], |p| p.qps(ch.local_device, ch.remote_device));
        if qps.is_empty() {
            let e = lane.down.get_or_insert_with(|| Error::PeerDown {
                agent: lane.conn.map_or("?", |p| p.agent.as_str()).into(),
                cause: "no queue pair to the peer".into(),
            });
            progress.fail(ch.entry, e);
            continue;
        }
        let q = lane.next_qp % qps.len();
        lane.next_qp = lane.next_qp.wrapping_add(1);
        let qp = &qps[q];
        let slot = usize::from(ch.peer) * per_peer + q;
        while outstanding[slot] >= window {
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
                outstanding[slot] += 1;
                in_flight.push_back((k, slot, p));
            }
            Err(PartsError { error, parts: [s] }) => {
                shards[k] = Some(s);
                let e = lanes[usize::from(ch.peer)].mark_down(&error);
                progress.fail(ch.entry, &e);
            }
        }
    }
    while !in_flight.is_empty() {
        step(&mut in_flight, &mut outstanding, &mut shards, lanes);
    }
    // Sized up front: collecting from `flatten` would grow the vector once per doubling.
    let mut back = Vec::with_capacity(shards.len());
    back.extend(shards.into_iter().flatten());
    L::join(home, back)
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
    let Some((k, slot, pending)) = in_flight.pop_front() else {
        return;
    };
    outstanding[slot] -= 1;
    let entry = chunks[picks[k]].entry;
    // Bounded: the queue pair's retry budget ends every request (Settings::peer_failure_bound).
    match pending.spin() {
        Ok(PartsDone { parts: [s], .. }) => {
            shards[k] = Some(s);
            progress.chunk_done(entry);
        }
        Err(PartsError { error, parts: [s] }) => {
            shards[k] = Some(s);
            let e = lanes[usize::from(chunks[picks[k]].peer)].mark_down(&error);
            progress.fail(entry, &e);
        }
    }
}
