//! The workers: [`Settings::workers`](crate::Settings::workers) threads per agent, each
//! owning its own connections to peers and running one accepted batch at a time, with many
//! chunks in flight. They take batches from one queue, so batches run concurrently up to
//! the number of workers (a batch stuck on a dead peer holds one worker).

use crate::batch::Op;
use crate::error::Error;
use crate::exec::{self, Pass};
use crate::failover;
use crate::health::{Health, Lane};
use crate::peer::PeerConn;
use crate::peer_pool::PeerPool;
use crate::plan::{Chunk, PeerTarget, Plan};
use crate::progress::Progress;
use crate::segment::{Lending, Region};
use crate::shared::Shared;
use crate::sources::Sources;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An accepted batch: checked, its local segments counted as used.
pub(crate) struct Job {
    /// The agent's number for the batch (in traces).
    pub id: u64,
    pub plan: Plan,
    /// The control address of each of the plan's peers.
    pub controls: Vec<SocketAddr>,
    pub progress: Arc<Progress>,
    pub notification: Option<Vec<u8>>,
}

/// Runs jobs until the agent drops the sender (the queued ones first). Between jobs, and
/// at least every second while none comes, closes the connections to peers left unused for
/// [`Settings::release_idle_after`](crate::Settings::release_idle_after).
pub(crate) fn run(shared: &Shared, jobs: &Mutex<Receiver<Job>>, idle: &PeerPool) {
    // A job's connections, taken from the shared idle ones (or made) for its peers and put
    // back when it ends; kept here only for the map's allocation.
    let mut conns: HashMap<String, PeerConn> = HashMap::new();
    let mut health = Health::new(shared.settings.rail_probe_after);
    let release_after = shared.settings.release_idle_after;
    // At least 10 ms: a release time of zero must not make the waiting worker spin.
    let tick = release_after.clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        // The lock is held only while waiting for the next job, never while running one
        // (a guard in a `while let` condition would live through the loop's body).
        let next = crate::metadata::lock(jobs).recv_timeout(tick);
        match next {
            Ok(job) => {
                let span = tracing::info_span!("batch", agent = %shared.name, id = job.id);
                let _in = span.enter();
                for t in &job.plan.peers {
                    if let Some(conn) = idle.take(&t.agent) {
                        conns.insert(t.agent.clone(), conn);
                    }
                }
                execute(shared, &mut conns, &mut health, &job);
                for (agent, conn) in conns.drain() {
                    idle.give(agent, conn);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        idle.release_idle(release_after);
    }
    // The rails this worker left out are its own: they go with it.
    let left_out = i64::try_from(health.rails_left_out()).unwrap_or(i64::MAX);
    shared.metrics.rails_changed(0, -left_out);
}

fn execute(shared: &Shared, conns: &mut HashMap<String, PeerConn>, health: &mut Health, job: &Job) {
    let plan = &job.plan;
    let now = Instant::now();
    let mut lanes: Vec<Lane> = plan
        .peers
        .iter()
        .map(|t| health.lane(&t.agent, now))
        .collect();
    for (p, lane) in lanes.iter_mut().enumerate() {
        prepare(shared, conns, plan, p, job.controls[p], lane);
        health.prepared(lane);
    }
    debug_assert!(plan.chunks.iter().all(|c| c.round < plan.rounds));
    let mut order: Vec<usize> = (0..plan.chunks.len()).collect();
    // In place (a stable sort's scratch would be allocated past a size), in batch order
    // within each group: the plan stripes consecutive chunks over the rails.
    order.sort_unstable_by_key(|&c| {
        let ch = &plan.chunks[c];
        (ch.round, ch.segment, c)
    });
    for picks in order.chunk_by(|&a, &b| {
        let (a, b) = (&plan.chunks[a], &plan.chunks[b]);
        (a.round, a.segment) == (b.round, b.segment)
    }) {
        let name = &plan.segments[usize::from(plan.chunks[picks[0]].segment)];
        // A round that only reads the segment (RDMA writes from it) shares it with other
        // batches that do; one that writes into it takes it whole. Either waits while another
        // worker's batch has it whole (for one round of it; a worker never waits for a
        // segment while holding one).
        let reads_only = picks.iter().all(|&c| plan.chunks[c].op == Op::Write);
        match shared.segments.take(name, reads_only) {
            None => {
                let e = Error::SegmentBusy {
                    segment: name.clone(),
                    users: 0,
                };
                for &c in picks {
                    job.progress.fail(plan.chunks[c].entry, &e);
                }
            }
            Some(Lending::Whole(mut region)) => {
                // The segment goes back to the table even if the round unwinds (a panicking
                // trace subscriber), lost then, so that no other worker waits for it forever.
                let ran = catch_unwind(AssertUnwindSafe(|| {
                    let lent = Lent::Whole(&mut region);
                    run_group(shared, conns, job, lent, picks, &mut lanes);
                }));
                // A region lost (never expected) loses the segment: the others are dropped,
                // deregistered (a CUDA segment's evicted from the caches, kept or not).
                let whole = ran.is_ok() && region.whole();
                if !whole {
                    region.evict_cached(&shared.devices);
                }
                shared
                    .segments
                    .put_back(name, Some(region).filter(|_| whole));
                if let Err(panic) = ran {
                    resume_unwind(panic);
                }
            }
            Some(Lending::Shared(sources)) => {
                let ran = catch_unwind(AssertUnwindSafe(|| {
                    let lent = Lent::Shared(&sources);
                    run_group(shared, conns, job, lent, picks, &mut lanes);
                }));
                // A lease a request still holds (after an unwind) loses the segment.
                shared.segments.give_back(name, sources);
                if let Err(panic) = ran {
                    resume_unwind(panic);
                }
            }
        }
    }
    for lane in &lanes {
        if lane.down.is_some() {
            // The queue pairs are in the error state (or were never made): a later batch
            // fetches the descriptor again and reconnects.
            conns.remove(&lane.agent);
            shared.forget_peer(&lane.agent);
            continue;
        }
        if let Some(c) = conns.get_mut(&lane.agent) {
            // In error (or never made): a batch after the wait makes them again.
            for &(l, r) in &lane.rails_down {
                c.drop_rail(l, r);
            }
        }
    }
    let settled = health.settle(&lanes, Instant::now());
    shared
        .metrics
        .rails_changed(settled.rails_marked, settled.rails_delta);
    for _ in 0..settled.peers_marked {
        shared.metrics.peer_down();
    }
    crate::gone::correct(shared, plan, &lanes, &job.progress);
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
                Some(c) => c.notify(message),
                None => Err(Error::ShuttingDown),
            };
            if let Err(e) = sent {
                note_error.get_or_insert(e);
            }
        }
    }
    // Counted and traced before the batch is seen finished: a program that reads the
    // metrics after its wait finds the batch in them. Entries not done now fail in `finish`.
    let (done, failed) = job.progress.counts();
    let took = job.progress.elapsed();
    shared.metrics.batch_ended(took, done, failed);
    tracing::info!(
        entries_done = done,
        entries_failed = failed,
        micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        "batch done",
    );
    job.progress.finish(note_error);
}

/// Runs one (round, segment) group's chunks `picks` from `region`: a pass over all of them
/// (those planned on a rail already known down moved first), then, while some failed on a
/// rail, a pass of those rerouted onto the rails still up (each pass leaves at least one
/// more rail down, so they end); a chunk with no rail left fails with its peer down.
fn run_group(
    shared: &Shared,
    conns: &mut HashMap<String, PeerConn>,
    job: &Job,
    mut region: Lent<'_>,
    picks: &[usize],
    lanes: &mut [Lane],
) {
    let plan = &job.plan;
    let mut retry = Vec::new();
    let mut moved: Vec<Chunk>;
    let mut seq: Vec<usize> = Vec::new();
    let (mut chunks, mut picks) = (&plan.chunks[..], picks);
    if lanes.iter().any(|l| !l.rails_down.is_empty()) {
        let has = |d: u16| region.has_device(d);
        moved = failover::reroute(
            plan,
            chunks,
            picks,
            lanes,
            has,
            (&job.progress, &shared.metrics),
        );
        failover::connect(shared, conns, &moved, lanes);
        seq.extend(0..moved.len());
        (chunks, picks) = (&moved, &seq);
    }
    loop {
        let refs: Vec<Option<&PeerConn>> = lanes
            .iter()
            .map(|l| l.down.is_none().then(|| conns.get(&l.agent)).flatten())
            .collect();
        let pass = Pass {
            chunks,
            picks,
            conns: &refs,
            progress: &job.progress,
            window: shared.settings.in_flight as usize,
            metrics: &shared.metrics,
        };
        region.run_pass(&pass, lanes, &mut retry);
        if retry.is_empty() {
            return;
        }
        let has = |d: u16| region.has_device(d);
        moved = failover::reroute(
            plan,
            chunks,
            &retry,
            lanes,
            has,
            (&job.progress, &shared.metrics),
        );
        failover::connect(shared, conns, &moved, lanes);
        retry.clear();
        seq.clear();
        seq.extend(0..moved.len());
        (chunks, picks) = (&moved, &seq);
    }
}

/// A segment's regions as a worker has them for one round.
enum Lent<'a> {
    /// Whole, its own.
    Whole(&'a mut Region),
    /// Shared with other batches that only read it.
    Shared(&'a Sources),
}

impl Lent<'_> {
    fn has_device(&self, device: u16) -> bool {
        match self {
            Lent::Whole(r) => r.has_device(usize::from(device)),
            Lent::Shared(s) => s.has_device(usize::from(device)),
        }
    }

    /// One pass of `pass`'s chunks from the regions on every device at once.
    fn run_pass(&mut self, pass: &Pass<'_, '_>, lanes: &mut [Lane], retry: &mut Vec<usize>) {
        fn leases<S>(ss: &[Option<S>]) -> Vec<Option<&S>> {
            ss.iter().map(Option::as_ref).collect()
        }
        match self {
            Lent::Whole(Region::DmaBuf(rs)) => exec::run(rs, pass, lanes, retry),
            Lent::Whole(Region::Host(rs)) => exec::run(rs, pass, lanes, retry),
            Lent::Whole(Region::Cuda { regions, .. }) => exec::run(regions, pass, lanes, retry),
            Lent::Shared(Sources::DmaBuf(ss)) => exec::run(&mut leases(ss), pass, lanes, retry),
            Lent::Shared(Sources::Host(ss)) => exec::run(&mut leases(ss), pass, lanes, retry),
        }
    }
}

/// Makes sure the worker is connected to peer `p`, which still is the incarnation the
/// batch was checked against, with every queue pair its chunks need: the peer is marked
/// down in `lane` if it cannot be reached, a rail whose queue pairs cannot be made is
/// marked down (its chunks go to the others).
fn prepare(
    shared: &Shared,
    conns: &mut HashMap<String, PeerConn>,
    plan: &Plan,
    p: usize,
    control: SocketAddr,
    lane: &mut Lane,
) {
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
        None => match PeerConn::open(shared, agent, control) {
            Ok(c) => c,
            Err(e) => {
                lane.down = Some(down(e));
                return;
            }
        },
    };
    if conn.incarnation != *incarnation {
        shared.forget_peer(agent);
        lane.down = Some(Error::IncarnationChanged {
            agent: agent.clone(),
            expected: *incarnation,
            found: conn.incarnation,
        });
        return;
    }
    for c in plan.chunks.iter().filter(|c| usize::from(c.peer) == p) {
        let (l, r) = (c.local_device, c.remote_device);
        if !lane.rail_is_down(l, r) && lane.down.is_none() {
            if let Err(e) = conn.ensure_qps(shared, l, r) {
                lane.connect_failed(l, r, e);
            }
        }
    }
    conns.insert(agent.clone(), conn);
}
