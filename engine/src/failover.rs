//! Moving chunks off rails that failed: each chunk planned on a rail that is down goes to
//! the nearest rail still up between its two segments ([`plan::stripe`]), and the rails
//! taken get their queue pairs.

use crate::health::Lane;
use crate::metrics::Recorder;
use crate::peer::PeerConn;
use crate::plan::{self, Chunk, Plan, Stripe};
use crate::progress::Progress;
use crate::shared::Shared;
use std::collections::HashMap;

/// The chunks `picks` of `chunks`, each on a rail that is up: one on a rail its lane has
/// down is moved (rebased onto the new rail's regions), one whose peer is down or that has
/// no rail left fails. `has_region` says which local devices the segment has a region on.
/// One stripe per (peer, local segment, remote segment), made on first use: nothing per
/// chunk but the chunk itself. Each chunk moved is counted in `metrics` and traced.
pub(crate) fn reroute(
    plan: &Plan,
    chunks: &[Chunk],
    picks: &[usize],
    lanes: &mut [Lane],
    has_region: impl Fn(u16) -> bool,
    (progress, metrics): (&Progress, &Recorder),
) -> Vec<Chunk> {
    let mut stripes: HashMap<(u16, u16, u16), (Option<Stripe>, usize)> = HashMap::new();
    let mut out = Vec::with_capacity(picks.len());
    for &c in picks {
        let ch = &chunks[c];
        let lane = &mut lanes[usize::from(ch.peer)];
        if let Some(e) = &lane.down {
            progress.fail(ch.entry, e);
            continue;
        }
        if !lane.rail_is_down(ch.local_device, ch.remote_device) {
            out.push(*ch);
            continue;
        }
        let (stripe, turn) = stripes
            .entry((ch.peer, ch.segment, ch.remote_segment))
            .or_insert_with(|| {
                let lp = &plan.local_places[usize::from(ch.segment)];
                let rp = &plan.remote_places[usize::from(ch.remote_segment)];
                let usable = |l, r| !lane.rail_is_down(l, r) && has_region(l);
                (plan::stripe(lp, rp, usable, &plan.weights), 0)
            });
        match stripe
            .as_ref()
            .and_then(|s| plan::reroute(plan, ch, s, *turn))
        {
            Some(moved) => {
                *turn += 1;
                tracing::debug!(
                    peer = %lane.agent,
                    entry = ch.entry,
                    from = ?(ch.local_device, ch.remote_device),
                    to = ?(moved.local_device, moved.remote_device),
                    "chunk failed over",
                );
                metrics.failed_over(1);
                out.push(moved);
            }
            None => progress.fail(ch.entry, &lane.every_rail_failed()),
        }
    }
    out
}

/// Makes the queue pairs of every rail `chunks` use that has none yet: one attempt per
/// rail (a rail that fails is marked down, a control channel that fails takes its peer
/// down, and neither is tried again for the chunks after; their chunks go to the next
/// pass's retry list).
pub(crate) fn connect(
    shared: &Shared,
    conns: &mut HashMap<String, PeerConn>,
    chunks: &[Chunk],
    lanes: &mut [Lane],
) {
    for ch in chunks {
        let lane = &mut lanes[usize::from(ch.peer)];
        let (l, r) = (ch.local_device, ch.remote_device);
        if lane.down.is_some() || lane.rail_is_down(l, r) {
            continue;
        }
        if let Some(conn) = conns.get_mut(&lane.agent) {
            if let Err(e) = conn.ensure_qps(shared, l, r) {
                lane.connect_failed(l, r, e);
            }
        }
    }
}
