//! Posting one round of one segment's chunks over all its rails at once: each local
//! device's region (its own registration of the same memory) is split into one owned shard
//! per chunk planned on that device (the round's ranges are disjoint), each shard moves into
//! its request and comes back with its completion, and the shards are joined into their
//! regions again. A peer's chunks go round-robin over each rail's queue pairs, each with its
//! own window. A chunk whose rail fails is handed back for another rail.
//!
//! Nothing here allocates per chunk: the shard list, the in-flight queue and the window
//! counters are allocated once per pass over a (round, segment), and a post or a completion
//! allocates nothing (rdma-dmabuf's owned layer uses the queue pair's preallocated slots);
//! only a failure does (its cause's text).

use crate::batch::Op;
use crate::error::Error;
use crate::health::Lane;
use crate::metrics::{RailCells, Recorder};
use crate::peer::PeerConn;
use crate::plan::Chunk;
use crate::progress::Progress;
use rdma_dmabuf::{
    Backing, Checkout, ExclusivePart, Lent, MemoryRegion, OwnedPart, PartsDone, PartsError,
    PartsPending, QueuePair, RemoteRegion, Shard, SharedDmaBuf, SharedSource, Source,
};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// What a worker lends one owned part per chunk of, and takes back: a segment's region
/// (split into shards), the checkout of a CUDA segment's registration (whose shards only
/// its [`Lent`] joins, so that it goes back to the registration cache whole), or a region
/// shared for NIC reads (leased, one [`Source`] per chunk).
pub(crate) trait Lendable: Sized {
    /// The backing of the parts.
    type B: Backing;
    /// What one chunk's request takes.
    type Part: OwnedPart<Backing = Self::B>;
    /// What the parts are joined with.
    type Home;
    /// Lends one part per range of `ranges`; refused, the error and `self` back.
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self>;
    /// `self` back from every part; `None` if they could not be joined.
    fn join(home: Self::Home, parts: Vec<Self::Part>) -> Option<Self>;
    /// Posts chunk `op` of `part` to `remote` on `qp`.
    fn post(qp: &QueuePair, op: Op, part: Self::Part, remote: RemoteRegion) -> Posted<'_, Self>;
}

/// The parts of a lent region and where they go back; refused, why, with the region back.
type Lending<L> =
    Result<(Vec<<L as Lendable>::Part>, <L as Lendable>::Home), (rdma_dmabuf::Error, L)>;

/// A chunk's request, or the refusal with its part back.
type Posted<'q, L> =
    Result<PartsPending<'q, <L as Lendable>::Part, 1>, PartsError<<L as Lendable>::Part, 1>>;

/// Posts a chunk of a part lent to its request alone: the NIC may write it (a read).
fn post_exclusive<P: ExclusivePart>(
    qp: &QueuePair,
    op: Op,
    part: P,
    remote: RemoteRegion,
) -> Result<PartsPending<'_, P, 1>, PartsError<P, 1>> {
    match op {
        Op::Write => qp.post_write_parts([part], remote, None),
        Op::Read => qp.post_read_parts([part], remote),
    }
}

impl<B: Backing> Lendable for MemoryRegion<B> {
    type B = B;
    type Part = Shard<B>;
    type Home = ();
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self> {
        self.split(ranges)
            .map(|s| (s, ()))
            .map_err(|e| (e.error, e.region))
    }
    fn join((): (), shards: Vec<Shard<B>>) -> Option<Self> {
        Shard::join(shards).ok()
    }
    fn post(qp: &QueuePair, op: Op, part: Shard<B>, remote: RemoteRegion) -> Posted<'_, Self> {
        post_exclusive(qp, op, part, remote)
    }
}

impl Lendable for Checkout {
    type B = SharedDmaBuf;
    type Part = Shard<SharedDmaBuf>;
    type Home = Lent;
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self> {
        self.split(ranges).map_err(|e| (e.error, e.checkout))
    }
    fn join(lent: Lent, shards: Vec<Shard<SharedDmaBuf>>) -> Option<Self> {
        lent.join(shards).ok()
    }
    fn post(qp: &QueuePair, op: Op, part: Self::Part, remote: RemoteRegion) -> Posted<'_, Self> {
        post_exclusive(qp, op, part, remote)
    }
}

impl<'s, B: Backing> Lendable for &'s SharedSource<B> {
    type B = B;
    type Part = Source<B>;
    type Home = &'s SharedSource<B>;
    fn lend(self, ranges: Vec<Range<u64>>) -> Lending<Self> {
        Ok((ranges.into_iter().map(|r| self.lease(r)).collect(), self))
    }
    fn join(home: Self::Home, leases: Vec<Source<B>>) -> Option<Self> {
        drop(leases);
        Some(home)
    }
    /// Only writes from it: a round that reads into a segment takes it whole (the worker's
    /// choice), and a lease is not an [`ExclusivePart`], so a read into one would not
    /// compile; one asked for anyway is refused.
    fn post(qp: &QueuePair, op: Op, part: Source<B>, remote: RemoteRegion) -> Posted<'_, Self> {
        match op {
            Op::Write => qp.post_write_parts([part], remote, None),
            Op::Read => Err(PartsError {
                error: rdma_dmabuf::Error::InvalidArgument {
                    op: rdma_dmabuf::Op::PostSend,
                    what: "an RDMA read into a segment shared for reads".into(),
                },
                parts: [part],
            }),
        }
    }
}

/// What one pass over a group of chunks works from.
pub(crate) struct Pass<'a, 'c> {
    pub chunks: &'a [Chunk],
    /// The chunks to run, by index into `chunks`, in posting order.
    pub picks: &'a [usize],
    /// Each peer's connection (by [`Chunk::peer`]); `None` for a peer down.
    pub conns: &'a [Option<&'c PeerConn>],
    pub progress: &'a Progress,
    /// Chunks in flight per queue pair at most.
    pub window: usize,
    /// The agent's counters.
    pub metrics: &'a Recorder,
}

/// The pass's counters: each rail's cells (by the pass's rail index; empty when counting
/// is off), looked up once per pass.
struct Meter<'a> {
    rec: &'a Recorder,
    cells: Vec<Arc<RailCells>>,
    /// Queue pairs per rail: a window slot's rail is `slot / per_rail`.
    per_rail: usize,
}

impl Meter<'_> {
    /// The cells of the rail of window slot `slot`, when counting.
    fn cells(&self, slot: usize) -> Option<&RailCells> {
        self.cells.get(slot / self.per_rail).map(|c| &**c)
    }
}

/// A chunk's rail, with its peer: (peer, local device, remote device).
fn rail(ch: &Chunk) -> (u16, u16, u16) {
    (ch.peer, ch.local_device, ch.remote_device)
}

/// Requests in flight: (pick, window index, when posted if timed, request).
type InFlight<'c, P> = VecDeque<(usize, usize, Option<Instant>, PartsPending<'c, P, 1>)>;

/// Runs the pass's chunks from the regions in `slots` (by local device) on every device at
/// once: each device's region is split into one shard per chunk planned on it, the chunks
/// are posted in order (the rails interleaved), and each region is joined again into its
/// slot (left `None` if it could not be: never expected, as every shard is kept until its
/// completion). A chunk whose rail fails is not failed: its index goes to `retry`, for the
/// worker to reroute onto another rail.
pub(crate) fn run<'c, L: Lendable>(
    slots: &mut [Option<L>],
    pass: &Pass<'_, 'c>,
    lanes: &mut [Lane],
    retry: &mut Vec<usize>,
) {
    let (chunks, picks, progress) = (pass.chunks, pass.picks, pass.progress);
    let mut shards: Vec<Option<L::Part>> =
        std::iter::repeat_with(|| None).take(picks.len()).collect();
    let homes = lend(slots, pass, &mut shards);
    let per_peer = pass
        .conns
        .iter()
        .flatten()
        .map(|p| p.qps_per_pair())
        .max()
        .unwrap_or(1);
    // The pass's rails (peer, local device, remote device), each with its windows (one per
    // queue pair) and its own round-robin turn over its queue pairs.
    let mut rails: Vec<(u16, u16, u16)> = picks.iter().map(|&c| rail(&chunks[c])).collect();
    rails.sort_unstable();
    rails.dedup();
    let rail_of = |ch: &Chunk| rails.binary_search(&rail(ch)).expect("listed");
    let meter = Meter {
        rec: pass.metrics,
        cells: if pass.metrics.on {
            let agent = |p: u16| lanes[usize::from(p)].agent.as_str();
            rails
                .iter()
                .map(|&(p, l, r)| pass.metrics.rail(agent(p), l, r))
                .collect()
        } else {
            Vec::new()
        },
        per_rail: per_peer,
    };
    let mut turn = vec![0usize; rails.len()];
    let mut sent = vec![0u32; rails.len()];
    let mut outstanding = vec![0usize; rails.len() * per_peer];
    let mut in_flight: InFlight<'c, L::Part> = VecDeque::with_capacity(picks.len().min(4096));
    for (k, &c) in picks.iter().enumerate() {
        let ch = chunks[c];
        let Some(shard) = shards[k].take() else {
            continue; // its region could not be lent: failed already
        };
        let lane = &mut lanes[usize::from(ch.peer)];
        if let Some(e) = &lane.down {
            shards[k] = Some(shard);
            progress.fail(ch.entry, e);
            continue;
        }
        let qps = pass.conns[usize::from(ch.peer)]
            .map_or(&[][..], |p| p.qps(ch.local_device, ch.remote_device));
        if qps.is_empty() && !lane.rail_is_down(ch.local_device, ch.remote_device) {
            let cause = "no queue pair on this rail".to_string();
            lane.rail_failed(ch.local_device, ch.remote_device, cause);
        }
        if lane.rail_is_down(ch.local_device, ch.remote_device) {
            shards[k] = Some(shard);
            retry.push(c);
            continue;
        }
        let r = rail_of(&ch);
        let q = turn[r] % qps.len();
        turn[r] = turn[r].wrapping_add(1);
        let slot = r * per_peer + q;
        while outstanding[slot] >= pass.window {
            complete_front(
                &mut in_flight,
                &mut outstanding,
                &mut shards,
                lanes,
                (pass, &meter),
                retry,
            );
        }
        // Waiting may have seen the rail (or the peer) fail.
        let lane = &mut lanes[usize::from(ch.peer)];
        if lane.down.is_some() || lane.rail_is_down(ch.local_device, ch.remote_device) {
            shards[k] = Some(shard);
            match &lane.down {
                Some(e) => progress.fail(ch.entry, e),
                None => retry.push(c),
            }
            continue;
        }
        let remote = RemoteRegion {
            addr: ch.remote_addr,
            len: ch.len,
            rkey: ch.rkey,
        };
        let posted = L::post(&qps[q], ch.op, shard, remote);
        match posted {
            Ok(p) => {
                sent[r] += 1;
                outstanding[slot] += 1;
                in_flight.push_back((k, slot, meter.rec.posted(), p));
            }
            Err(PartsError { error, parts: [s] }) => {
                shards[k] = Some(s);
                lane.rail_failed(ch.local_device, ch.remote_device, error.to_string());
                retry.push(c);
            }
        }
    }
    while !in_flight.is_empty() {
        complete_front(
            &mut in_flight,
            &mut outstanding,
            &mut shards,
            lanes,
            (pass, &meter),
            retry,
        );
    }
    join(slots, pass, shards, homes);
    // Traced once nothing is in flight and the parts are joined: a subscriber that panics
    // unwinds through no request the NIC still owns (the worker then gives the segment back
    // to the table, whole).
    for (&(p, l, r), &n) in rails.iter().zip(&sent).filter(|(_, &n)| n > 0) {
        let peer = &lanes[usize::from(p)].agent;
        tracing::debug!(%peer, local_device = l, remote_device = r, chunks = n, "posted");
    }
}

/// Lends each device's region in `slots` (taking it out) as one shard per pick planned on
/// it, into `shards` (by pick); the homes to join them with. A pick whose device has no
/// region (never expected: the plan picks devices the segment is registered on) or whose
/// region cannot be split fails.
fn lend<L: Lendable>(
    slots: &mut [Option<L>],
    pass: &Pass<'_, '_>,
    shards: &mut [Option<L::Part>],
) -> Vec<(u16, L::Home)> {
    let (chunks, picks) = (pass.chunks, pass.picks);
    let mut devices: Vec<u16> = picks.iter().map(|&c| chunks[c].local_device).collect();
    devices.sort_unstable();
    devices.dedup();
    let mut homes = Vec::with_capacity(devices.len());
    for d in devices {
        let on = || {
            picks
                .iter()
                .enumerate()
                .filter(move |(_, &c)| chunks[c].local_device == d)
        };
        let fail = |e: &Error| {
            for (_, &c) in on() {
                pass.progress.fail(chunks[c].entry, e);
            }
        };
        let Some(region) = slots.get_mut(usize::from(d)).and_then(Option::take) else {
            fail(&Error::Protocol(format!(
                "no region of the segment on local device {d}"
            )));
            continue;
        };
        let ranges = on().map(|(_, &c)| chunks[c].offset..chunks[c].offset + chunks[c].len);
        match region.lend(ranges.collect()) {
            Ok((lent, home)) => {
                for ((k, _), s) in on().zip(lent) {
                    shards[k] = Some(s);
                }
                homes.push((d, home));
            }
            Err((error, region)) => {
                slots[usize::from(d)] = Some(region);
                fail(&Error::rdma("split a segment into chunks", &error));
            }
        }
    }
    homes
}

/// Joins each lent region's shards (all back: every shard is kept until its completion)
/// into its slot again.
fn join<L: Lendable>(
    slots: &mut [Option<L>],
    pass: &Pass<'_, '_>,
    mut shards: Vec<Option<L::Part>>,
    homes: Vec<(u16, L::Home)>,
) {
    let (chunks, picks) = (pass.chunks, pass.picks);
    for (d, home) in homes {
        let n = picks
            .iter()
            .filter(|&&c| chunks[c].local_device == d)
            .count();
        // Sized up front: collecting from `flatten` would grow the vector once per doubling.
        let mut back = Vec::with_capacity(n);
        for (k, &c) in picks.iter().enumerate() {
            if chunks[c].local_device == d {
                back.extend(shards[k].take());
            }
        }
        slots[usize::from(d)] = L::join(home, back);
    }
}

/// Waits for the oldest request in flight (a queue pair completes in order, so it is the
/// first to end on its queue pair) and records its outcome: done, failed (the peer refused
/// it), or to retry on another rail.
fn complete_front<'c, P: OwnedPart>(
    in_flight: &mut InFlight<'c, P>,
    outstanding: &mut [usize],
    shards: &mut [Option<P>],
    lanes: &mut [Lane],
    (pass, meter): (&Pass<'_, 'c>, &Meter<'_>),
    retry: &mut Vec<usize>,
) {
    let Some((k, slot, posted, pending)) = in_flight.pop_front() else {
        return;
    };
    outstanding[slot] -= 1;
    let c = pass.picks[k];
    let ch = &pass.chunks[c];
    // Bounded: the queue pair's retry budget ends every request (Settings::peer_failure_bound).
    match pending.spin() {
        Ok(PartsDone { parts: [s], .. }) => {
            shards[k] = Some(s);
            meter.rec.completed(posted, None);
            if let Some(c) = meter.cells(slot) {
                c.done(ch.op, ch.len);
            }
            pass.progress.chunk_done(ch.entry);
        }
        Err(PartsError { error, parts: [s] }) => {
            shards[k] = Some(s);
            let status = match &error {
                rdma_dmabuf::Error::Completion { status, .. } => *status,
                _ => u32::MAX,
            };
            meter.rec.completed(posted, Some(status));
            if let Some(c) = meter.cells(slot) {
                c.failed();
            }
            let lane = &mut lanes[usize::from(ch.peer)];
            match lane.failed(ch.local_device, ch.remote_device, &error) {
                Some(e) => pass.progress.fail(ch.entry, &e),
                None => retry.push(c),
            }
        }
    }
}
