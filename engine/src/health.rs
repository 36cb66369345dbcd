//! Rail and peer health: which rails (local device, remote device) to each peer are left
//! out, for how long, and which peers are down. [`Lane`] is one batch's view of one peer;
//! [`Health`] is what a worker keeps from batch to batch. Logic only, with the clock passed
//! in: the worker applies what it decides to its connections and the metrics.

use crate::error::Error;
use rdma_dmabuf::ErrorKind;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// One batch's view of one peer.
pub(crate) struct Lane {
    /// The peer's name, for errors.
    pub agent: String,
    /// Why the peer is down, once it is: its chunks are not posted (it could not be
    /// reached, refused a key, or every rail to it failed).
    pub down: Option<Error>,
    /// The rails (local device, remote device) to it that failed during the batch (or
    /// recently, in an earlier one): chunks planned on them go to the retry list.
    pub rails_down: Vec<(u16, u16)>,
    /// The first rail failure's cause (later ones are mostly flushes of the same).
    pub rail_error: Option<String>,
}

impl Lane {
    /// A lane to `agent`, up, with no rail down.
    pub fn new(agent: &str) -> Lane {
        Lane {
            agent: agent.into(),
            down: None,
            rails_down: Vec::new(),
            rail_error: None,
        }
    }

    /// Whether rail `(local, remote)` is down.
    pub fn rail_is_down(&self, local: u16, remote: u16) -> bool {
        self.rails_down.contains(&(local, remote))
    }

    /// Marks rail `(local, remote)` down (its chunks are retried on the others).
    pub fn rail_failed(&mut self, local: u16, remote: u16, cause: String) {
        if !self.rail_is_down(local, remote) {
            self.rails_down.push((local, remote));
        }
        self.rail_error.get_or_insert(cause);
    }

    /// Records that rail `(local, remote)`'s queue pairs could not be made: the rail is
    /// down, or the peer is when its control channel failed (every other rail would wait
    /// for the same channel).
    pub fn connect_failed(&mut self, local: u16, remote: u16, e: Error) {
        match e {
            Error::Io { .. } => {
                self.down.get_or_insert_with(|| Error::PeerDown {
                    agent: self.agent.clone(),
                    cause: e.to_string(),
                });
            }
            e => self.rail_failed(local, remote, e.to_string()),
        }
    }

    /// Marks the peer down: every rail to it failed.
    pub fn every_rail_failed(&mut self) -> Error {
        let first = self.rail_error.as_deref().unwrap_or("no rail to it");
        self.down
            .get_or_insert_with(|| Error::PeerDown {
                agent: self.agent.clone(),
                cause: format!("every rail to it failed; the first failure: {first}"),
            })
            .clone()
    }

    /// Records a failed request on rail `(local, remote)`, by the kind rdma-dmabuf gives
    /// it. A request the peer refused (its key or range, [`ErrorKind::RemoteAccess`]: the
    /// peer restarted or the batch is wrong) or that was wrong itself
    /// ([`ErrorKind::InvalidRequest`]) would fail on any rail: the peer is marked down and
    /// the chunk fails, `Some` with the error. Anything else (a retry budget spent, a
    /// flush, a queue pair the link's loss sent to the error state) marks the rail down,
    /// `None`: the chunk is retried on another rail.
    pub fn failed(&mut self, local: u16, remote: u16, cause: &rdma_dmabuf::Error) -> Option<Error> {
        let (agent, text) = (self.agent.clone(), cause.to_string());
        let e = match cause.kind() {
            ErrorKind::RemoteAccess => Error::RemoteAccess { agent, cause: text },
            ErrorKind::InvalidRequest => Error::PeerDown { agent, cause: text },
            _ => {
                self.rail_failed(local, remote, text);
                return None;
            }
        };
        Some(self.down.get_or_insert(e).clone())
    }
}

/// The longest a failed rail is left out, in probe waits
/// ([`Settings::rail_probe_after`](crate::Settings::rail_probe_after)).
pub(crate) const MAX_BACKOFF: u32 = 32;

/// What a worker keeps from batch to batch: the rails (peer, local device, remote device)
/// that failed, when, and how long later batches leave them out (the probe wait, doubled
/// each time a probe fails again, up to [`MAX_BACKOFF`] times); then a batch tries the rail
/// again, and one that does not see it fail forgets it. And the peers it marked down, to
/// say when they are back.
pub(crate) struct Health {
    probe_after: Duration,
    rails_down: HashMap<(String, u16, u16), (Instant, Duration)>,
    peers_down: HashSet<String>,
}

/// What settling a batch changed, for the metrics.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Settled {
    /// Rails marked down anew (or again, on a failed probe).
    pub rails_marked: u64,
    /// The change in the number of rails left out.
    pub rails_delta: i64,
    /// Peers marked down.
    pub peers_marked: u64,
}

impl Health {
    /// Nothing down; a failed rail is left out for `probe_after` first.
    pub fn new(probe_after: Duration) -> Health {
        Health {
            probe_after,
            rails_down: HashMap::new(),
            peers_down: HashSet::new(),
        }
    }

    /// A batch's lane to `agent` at `now`: the rails to it still in their wait are down.
    pub fn lane(&self, agent: &str, now: Instant) -> Lane {
        let mut lane = Lane::new(agent);
        for ((a, l, r), (at, wait)) in &self.rails_down {
            if a == agent && now.saturating_duration_since(*at) < *wait {
                lane.rail_failed(*l, *r, "failed in an earlier batch".into());
            }
        }
        lane
    }

    /// After the connection to `lane`'s peer was made ready: a peer marked down before and
    /// up now is said to be up again.
    pub fn prepared(&mut self, lane: &Lane) {
        if lane.down.is_none() && self.peers_down.remove(&lane.agent) {
            tracing::info!(peer = %lane.agent, "peer up again");
        }
    }

    /// The end of a batch at `now`: its peers down are remembered, its rails down are left
    /// out (for twice as long as before when a probe failed), and a rail whose wait is over
    /// and that did not fail again to its peer is forgotten (up again, or unused: the next
    /// batch that uses it probes it).
    pub fn settle(&mut self, lanes: &[Lane], now: Instant) -> Settled {
        let before = self.rails_down.len();
        let (mut rails_marked, mut peers_marked) = (0, 0);
        for lane in lanes {
            if let Some(e) = &lane.down {
                tracing::warn!(peer = %lane.agent, error = %e, "peer marked down");
                self.peers_down.insert(lane.agent.clone());
                peers_marked += 1;
                continue;
            }
            for &(l, r) in &lane.rails_down {
                let (at, wait) = self
                    .rails_down
                    .entry((lane.agent.clone(), l, r))
                    .or_insert((now, Duration::ZERO));
                if now.saturating_duration_since(*at) >= *wait {
                    rails_marked += 1;
                    tracing::warn!(
                        peer = %lane.agent,
                        local_device = l,
                        remote_device = r,
                        cause = lane.rail_error.as_deref().unwrap_or(""),
                        "rail marked down",
                    );
                    let longest = self.probe_after.saturating_mul(MAX_BACKOFF);
                    *wait = wait.saturating_mul(2).clamp(self.probe_after, longest);
                    *at = now;
                }
            }
        }
        self.rails_down.retain(|(agent, l, r), (at, wait)| {
            let lane = lanes.iter().find(|lane| lane.agent == *agent);
            let keep = now.saturating_duration_since(*at) < *wait
                || lane.is_none_or(|lane| lane.rail_is_down(*l, *r));
            if !keep {
                tracing::info!(peer = %agent, local_device = l, remote_device = r, "rail up again");
            }
            keep
        });
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        Settled {
            rails_marked,
            rails_delta: count(self.rails_down.len()) - count(before),
            peers_marked,
        }
    }

    /// The rails left out now.
    pub fn rails_left_out(&self) -> usize {
        self.rails_down.len()
    }

    /// The wait of rail `(agent, local, remote)`, if it is left out.
    #[cfg(test)]
    fn wait(&self, agent: &str, local: u16, remote: u16) -> Option<Duration> {
        self.rails_down
            .get(&(agent.to_string(), local, remote))
            .map(|(_, w)| *w)
    }
}

#[cfg(test)]
#[path = "health_tests.rs"]
mod tests;
