//! The workers: [`Settings::workers`](crate::Settings::workers) threads per agent, each
//! owning its own connections to peers and running one accepted batch at a time, with many
//! chunks in flight. They take batches from one queue, so batches run concurrently up to
//! the number of workers (a batch stuck on a dead peer holds one worker).

use crate::error::{Error, Result};
use crate::exec::{self, Lane};
use crate::peer::PeerConn;
use crate::plan::{PeerTarget, Plan};
use crate::progress::Progress;
use crate::segment::Region;
use crate::shared::Shared;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

/// An accepted batch: checked, its local segments counted as used.
pub(crate) struct Job {
    pub plan: Plan,
    /// The control address of each of the plan's peers.
    pub controls: Vec<SocketAddr>,
    pub progress: Arc<Progress>,
    pub notification: Option<Vec<u8>>,
}

/// Runs jobs until the agent drops the sender (the queued ones first).
pub(crate) fn run(shared: &Shared, jobs: &Mutex<Receiver<Job>>) {
    let mut conns: HashMap<String, PeerConn> = HashMap::new();
    loop {
        // The lock is held only while waiting for the next job, never while running one
        // (a guard in a `while let` condition would live through the loop's body).
        let next = crate::metadata::lock(jobs).recv();
        let Ok(job) = next else { return };
        execute(shared, &mut conns, &job);
    }
}

fn execute(shared: &Shared, conns: &mut HashMap<String, PeerConn>, job: &Job) {
    let plan = &job.plan;
    let failed: Vec<Option<Error>> = (0..plan.peers.len())
        .map(|p| prepare(shared, conns, plan, p, job.controls[p]).err())
        .collect();
    let mut lanes: Vec<Lane<'_>> = plan
        .peers
        .iter()
        .zip(&failed)
        .map(|(t, f)| Lane {
            conn: if f.is_none() {
                conns.get(&t.agent)
            } else {
                None
            },
            down: f.clone(),
            next_qp: 0,
        })
        .collect();
    debug_assert!(plan.chunks.iter().all(|c| c.round < plan.rounds));
    let mut order: Vec<usize> = (0..plan.chunks.len()).collect();
    // In place (a stable sort's scratch would be allocated past a size), in batch order
    // within each group.
    order.sort_unstable_by_key(|&c| {
        let ch = &plan.chunks[c];
        (ch.round, ch.segment, ch.local_device, c)
    });
    let window = shared.settings.in_flight as usize;
    for picks in order.chunk_by(|&a, &b| {
        let (a, b) = (&plan.chunks[a], &plan.chunks[b]);
        (a.round, a.segment) == (b.round, b.segment)
    }) {
        let name = &plan.segments[usize::from(plan.chunks[picks[0]].segment)];
        // Waits while another worker's batch has it lent (a segment is lent for one round
        // of it, and a worker never waits for a segment while holding one).
        let Some(mut region) = shared.segments.take(name) else {
            let e = Error::SegmentBusy {
                segment: name.clone(),
                users: 0,
            };
            for &c in picks {
                job.progress.fail(plan.chunks[c].entry, &e);
            }
            continue;
        };
        // Each local device's chunks from that device's region.
        for picks in
            picks.chunk_by(|&a, &b| plan.chunks[a].local_device == plan.chunks[b].local_device)
        {
            let device = usize::from(plan.chunks[picks[0]].local_device);
            run_on(
                &mut region,
                device,
                plan,
                picks,
                &mut lanes,
                &job.progress,
                window,
            );
        }
        // A region lost (never expected) loses the segment: the others are dropped,
        // deregistered (a CUDA segment's evicted from the caches, kept or not).
        let whole = region.whole();
        if !whole {
            region.evict_cached(&shared.devices);
        }
        shared
            .segments
            .put_back(name, Some(region).filter(|_| whole));
    }
    let down: Vec<bool> = lanes.iter().map(|l| l.down.is_some()).collect();
    drop(lanes);
    for (t, down) in plan.peers.iter().zip(down) {
        if down {
            // The queue pairs are in the error state (or were never made): a later batch
            // fetches the descriptor again and reconnects.
            conns.remove(&t.agent);
            shared.forget_peer(&t.agent);
        }
    }
    for name in &plan.segments {
        shared.segments.release(name);
    }
    let mut note_error = None;
    if let Some(message) = job
        .notification
        .as_deref()
        .filter(|_| job.progress.all_done())
    {
        for t in &plan.peers {
            let sent = match conns.get_mut(&t.agent) {
                Some(c) => c.notify(&shared.name, message),
                None => Err(Error::ShuttingDown),
            };
            if let Err(e) = sent {
                note_error.get_or_insert(e);
            }
        }
    }
    job.progress.finish(note_error);
}

/// Runs `picks` (all planned on local device `device`) from `region`'s region on that
/// device; a chunk whose device has no region (never expected: the plan picks devices the
/// segment is registered on) fails.
fn run_on<'c>(
    region: &mut Region,
    device: usize,
    plan: &Plan,
    picks: &[usize],
    lanes: &mut [Lane<'c>],
    progress: &Progress,
    window: usize,
) {
    let chunks = &plan.chunks[..];
    let found = match region {
        Region::DmaBuf(rs) => run_slot(rs, device, chunks, picks, lanes, progress, window),
        Region::Host(rs) => run_slot(rs, device, chunks, picks, lanes, progress, window),
        Region::Cuda { regions, .. } => {
            run_slot(regions, device, chunks, picks, lanes, progress, window)
        }
    };
    if !found {
        let e = Error::Protocol(format!("no region of the segment on local device {device}"));
        for &c in picks {
            progress.fail(chunks[c].entry, &e);
        }
    }
}

/// Lends the region of `device` in `slots` to `exec::run` if it is home, and puts back what
/// returns; `false` if there is none.
fn run_slot<'c, L: exec::Lendable>(
    slots: &mut [Option<L>],
    device: usize,
    chunks: &[crate::plan::Chunk],
    picks: &[usize],
    lanes: &mut [Lane<'c>],
    progress: &Progress,
    window: usize,
) -> bool {
    match slots.get_mut(device) {
        Some(slot @ Some(_)) => {
            let r = slot.take().expect("matched Some");
            *slot = exec::run(r, chunks, picks, lanes, progress, window);
            true
        }
        _ => false,
    }
}

/// Makes sure the worker is connected to peer `p`, which still is the incarnation the
/// batch was checked against, with every queue pair its chunks need.
fn prepare(
    shared: &Shared,
    conns: &mut HashMap<String, PeerConn>,
    plan: &Plan,
    p: usize,
    control: SocketAddr,
) -> Result<()> {
    let PeerTarget { agent, incarnation } = &plan.peers[p];
    let down = |e: Error| match e {
        e @ Error::IncarnationChanged { .. } => e,
        e => Error::PeerDown {
            agent: agent.clone(),
            cause: e.to_string(),
        },
    };
    let alive = |mut c: PeerConn| c.check().is_ok_and(|i| i == c.incarnation).then_some(c);
    let mut conn = match conns.remove(agent).and_then(alive) {
        Some(c) => c,
        None => PeerConn::open(shared, agent, control).map_err(down)?,
    };
    if conn.incarnation != *incarnation {
        shared.forget_peer(agent);
        return Err(Error::IncarnationChanged {
            agent: agent.clone(),
            expected: *incarnation,
            found: conn.incarnation,
        });
    }
    for c in plan.chunks.iter().filter(|c| usize::from(c.peer) == p) {
        conn.ensure_qps(shared, c.local_device, c.remote_device)
            .map_err(down)?;
    }
    conns.insert(agent.clone(), conn);
    Ok(())
}
