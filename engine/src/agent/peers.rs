//! The agent's peers: naming them, finding them (and waiting for them), their descriptors,
//! and notifications without a transfer.

use super::Agent;
use crate::batch::Batch;
use crate::descriptor::AgentDescriptor;
use crate::error::{Error, Result};
use crate::metadata::{lock, PeerRecord};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

impl Agent {
    /// Names a peer and its control address (the embedded metadata service).
    pub fn add_peer(&self, agent: &str, control: SocketAddr) {
        self.embedded.add_peer(agent, control);
        self.shared.forget_peer(agent);
    }

    /// Finds the peer listening at `control` by address alone (Mooncake's P2P handshake: a
    /// session id `host:port` is a control address), names it to the embedded metadata
    /// service as [`Agent::add_peer`] does, and returns its name (the one its connection
    /// authenticated). Under another metadata service the name is only what batches use:
    /// look-ups still go to that service.
    ///
    /// # Errors
    /// [`Error::Io`] when nothing answers at `control` within [`Settings::io_timeout`](crate::Settings::io_timeout),
    /// [`Error::Authentication`], [`Error::Protocol`], [`Error::IncompatibleVersion`].
    pub fn add_peer_at(&self, control: SocketAddr) -> Result<String> {
        let r = self.embedded.discover(control)?;
        let name = r.descriptor.agent.clone();
        lock(&self.shared.peers).insert(name.clone(), r);
        Ok(name)
    }

    /// Sends a notification to agent `agent` on its own, with no transfer: it is queued in
    /// `agent`'s [`Agent::notifications`] under this agent's name (the name its connection
    /// authenticated) when this returns. Notifications that one agent sends this way reach
    /// the peer in the order sent; they are not ordered with batches' notifications (which
    /// follow their own batch's entries).
    ///
    /// # Errors
    /// [`Error::NotificationTooLong`]; [`Error::UnknownAgent`] and the metadata service's
    /// errors; [`Error::Authentication`]; [`Error::LimitReached`] when the peer's queue for
    /// this agent is full (its program has not taken them); [`Error::Io`].
    pub fn notify(&self, agent: &str, message: &[u8]) -> Result<()> {
        if message.len() > crate::MAX_NOTIFICATION {
            return Err(Error::NotificationTooLong(message.len()));
        }
        let control = self.peer_record(agent, false)?.control;
        let sent = self
            .notifier
            .send(&self.shared.dialer, agent, control, message);
        if matches!(sent, Err(Error::Io { .. } | Error::Authentication { .. })) {
            // Perhaps it moved or restarted: its record is fetched again next time.
            self.shared.forget_peer(agent);
            self.notifier.forget(agent);
        }
        sent
    }

    /// Agent `agent`'s current descriptor, fetched from the metadata service (its segments'
    /// names, lengths and base addresses: what [`Batch::write_at`] resolves against).
    ///
    /// # Errors
    /// [`Error::UnknownAgent`] and the metadata service's errors.
    pub fn peer_descriptor(&self, agent: &str) -> Result<AgentDescriptor> {
        self.peer_record(agent, true).map(|r| r.descriptor)
    }

    /// Waits at most `timeout` until agent `agent` is known and answers its metadata
    /// service (the embedded one asks the peer, which must be named with
    /// [`Agent::add_peer`]; etcd's sees it once it published), asking again with a pause
    /// that grows from 10 ms to 200 ms; returns its descriptor, which it keeps (the next
    /// transfer to the agent looks nothing up). A program that starts two agents needs no
    /// ordering of its own: the initiator waits for the target. A look-up that hangs (the
    /// embedded service dialing an address that takes the connection and never answers) does
    /// not hold the call past `timeout`: it is left to end on its own thread.
    ///
    /// # Errors
    /// [`Error::PeerNotUp`] (kind `TimedOut`) with the last look-up's error when `timeout`
    /// passes; at once, the errors that waiting cannot mend: [`Error::Authentication`],
    /// [`Error::IncompatibleVersion`], [`Error::Protocol`].
    pub fn wait_for_peer(&self, agent: &str, timeout: Duration) -> Result<AgentDescriptor> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        // Why the agent is not there yet: the last look-up that answered (one that did not
        // answer in time replaces nothing but an empty cause).
        let mut last: Option<Error> = None;
        loop {
            let left = timeout.saturating_sub(start.elapsed());
            if let Some(e) = last.take_if(|_| left.is_zero()) {
                return Err(Error::PeerNotUp {
                    agent: agent.into(),
                    waited: start.elapsed(),
                    last: Box::new(e),
                });
            }
            // Each look-up is given at least a little time, so that a wait of 0 asks once.
            match self.look_up_within(agent, left.max(Duration::from_millis(10))) {
                Some(Ok(r)) => return Ok(r.descriptor),
                Some(Err(e)) if !may_appear(&e) => return Err(e),
                Some(Err(e)) => last = Some(e),
                None => {
                    last.get_or_insert(Error::Timeout(start.elapsed()));
                }
            }
            let left = timeout.saturating_sub(start.elapsed());
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// One look-up of `agent` (recorded as [`Agent::peer_record`] records it), given at
    /// most `within`: `None` when it has not answered by then. A service that follows its
    /// peers answers from its own copy, here; any other's look-up (which may dial) runs on
    /// a thread of its own, which a look-up that hangs keeps until the service's own bound
    /// ([`Settings::io_timeout`](crate::Settings::io_timeout) for the embedded one); its
    /// answer, late, is dropped.
    fn look_up_within(&self, agent: &str, within: Duration) -> Option<Result<PeerRecord>> {
        if self.shared.metadata.follows_peers() {
            return Some(self.peer_record(agent, true));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let (metadata, name) = (self.shared.metadata.clone(), agent.to_string());
        let spawned = std::thread::Builder::new()
            .name(format!("{}-lookup", self.shared.name))
            .spawn(move || {
                let _ = tx.send(metadata.lookup(&name));
            });
        let found = match spawned {
            Ok(_) => rx.recv_timeout(within).ok()?,
            // No thread to spare: the look-up runs here, bounded by the service alone.
            Err(_) => self.shared.metadata.lookup(agent),
        };
        Some(self.record(agent, found))
    }

    /// The descriptors of the batch's remote agents: cached, or fetched (`refresh`, or a
    /// backend that follows its peers itself: always).
    pub(super) fn peer_records(
        &self,
        batch: &Batch,
        refresh: bool,
    ) -> Result<HashMap<String, PeerRecord>> {
        let mut out = HashMap::new();
        for e in &batch.entries {
            if out.contains_key(&e.remote_agent) {
                continue;
            }
            match self.peer_record(&e.remote_agent, refresh) {
                Ok(r) => {
                    out.insert(e.remote_agent.clone(), r);
                }
                // Left to the checks, which name the entry.
                Err(Error::UnknownAgent(_)) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    }

    /// `agent`'s record: cached, or fetched (`refresh`, or a backend that follows its peers
    /// itself: always) and cached.
    fn peer_record(&self, agent: &str, refresh: bool) -> Result<PeerRecord> {
        let refresh = refresh || self.shared.metadata.follows_peers();
        let cached = lock(&self.shared.peers).get(agent).cloned();
        if let Some(r) = cached.filter(|_| !refresh) {
            return Ok(r);
        }
        let found = self.shared.metadata.lookup(agent);
        self.record(agent, found)
    }

    /// Records a look-up of `agent`'s descriptor (its count, its trace) and keeps what it
    /// found, checked to be `agent`'s.
    fn record(&self, agent: &str, found: Result<PeerRecord>) -> Result<PeerRecord> {
        self.shared.metrics.looked_up(found.is_err());
        match &found {
            Ok(r) => tracing::debug!(
                agent = %self.shared.name,
                peer = agent,
                incarnation = r.descriptor.incarnation,
                segments = r.descriptor.segments.len(),
                "peer looked up",
            ),
            Err(e) => {
                tracing::debug!(agent = %self.shared.name, peer = agent, error = %e, "peer look-up failed")
            }
        }
        let r = found?;
        // A backend's answer is input: a record of another agent would be keyed wrongly.
        if r.descriptor.agent != agent {
            return Err(Error::Protocol(format!(
                "the metadata service answered agent {:?} for {agent:?}",
                r.descriptor.agent
            )));
        }
        lock(&self.shared.peers).insert(agent.into(), r.clone());
        Ok(r)
    }
}

/// Whether a look-up's failure may pass by waiting: the agent is not known or not
/// reachable yet, or the metadata service did not answer.
fn may_appear(e: &Error) -> bool {
    matches!(
        e,
        Error::UnknownAgent(_) | Error::Io { .. } | Error::Metadata { .. }
    )
}
