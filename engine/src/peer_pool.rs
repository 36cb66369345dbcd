//! The connections to peers that no batch uses now (each a control channel and the queue
//! pairs made over it), shared by the agent's workers: a batch takes one for each of its
//! peers, or makes one, and puts it back when it ends; one unused for
//! [`Settings::release_idle_after`](crate::Settings::release_idle_after) is closed (its
//! queue pairs destroyed on both sides), and a batch to that peer later makes new ones. So
//! an agent holds, per peer, as many connections as batches to it ran at once, not one per
//! worker, and none for a peer it no longer talks to.

use crate::metadata::lock;
use crate::peer::PeerConn;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A connection put back, and since when.
struct Idle {
    agent: String,
    conn: PeerConn,
    since: Instant,
}

/// The idle connections, by peer.
#[derive(Default)]
pub(crate) struct PeerPool {
    idle: Mutex<Vec<Idle>>,
}

impl PeerPool {
    /// The connection to `agent` put back last (its queue pairs the warmest), if any.
    pub fn take(&self, agent: &str) -> Option<PeerConn> {
        let mut idle = lock(&self.idle);
        let i = idle.iter().rposition(|c| c.agent == agent)?;
        Some(idle.remove(i).conn)
    }

    /// Puts back `conn`, a connection to `agent` that a batch has finished with.
    pub fn give(&self, agent: String, conn: PeerConn) {
        lock(&self.idle).push(Idle {
            agent,
            conn,
            since: Instant::now(),
        });
    }

    /// Closes the connections put back at least `after` ago (outside the lock: closing one
    /// destroys its queue pairs). Allocates nothing when none is due.
    pub fn release_idle(&self, after: Duration) {
        let now = Instant::now();
        let due = |c: &Idle| now.saturating_duration_since(c.since) >= after;
        let closed: Vec<Idle> = {
            let mut idle = lock(&self.idle);
            if !idle.iter().any(due) {
                return;
            }
            let (closed, kept) = std::mem::take(&mut *idle).into_iter().partition(due);
            *idle = kept;
            closed
        };
        for c in &closed {
            tracing::debug!(peer = %c.agent, "idle connection released");
        }
        drop(closed);
    }
}
