//! [`PeerConn`]: the worker's connection to one peer: the control channel and the queue
//! pairs made over it, [`Settings::queue_pairs`](crate::Settings::queue_pairs) per (local
//! device, remote device) pair in use.

use crate::channel::Channel;
use crate::error::{Error, Result};
use crate::metadata::Dialer;
use crate::metrics::Recorder;
use crate::shared::Shared;
use crate::wire::{Reply, Request};
use rdma_dmabuf::QueuePair;
use std::net::SocketAddr;
use std::sync::Arc;

pub(crate) struct PeerConn {
    pub incarnation: u64,
    control: SocketAddr,
    channel: Channel,
    dialer: Dialer,
    qps: Vec<((u16, u16), Vec<QueuePair>)>,
    /// Counts the queue pairs it holds.
    metrics: Arc<Recorder>,
}

/// A count of queue pairs as the gauge's delta.
fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl PeerConn {
    /// Connects the control channel to agent `agent` (authenticated both ways) and learns
    /// its incarnation.
    pub fn open(shared: &Shared, agent: &str, control: SocketAddr) -> Result<PeerConn> {
        let dialer = shared.dialer.clone();
        let channel = dialer.dial(control, Some(agent))?;
        let mut c = PeerConn {
            incarnation: 0,
            control,
            channel,
            dialer,
            qps: Vec::new(),
            metrics: shared.metrics.clone(),
        };
        c.incarnation = c.check()?;
        Ok(c)
    }

    /// Asks the peer's incarnation (one round trip: the channel is alive, and the peer has
    /// not restarted if it answers the one expected).
    pub fn check(&mut self) -> Result<u64> {
        match self.call(&Request::Check)? {
            Reply::Incarnation(i) => Ok(i),
            other => Err(Error::Protocol(format!("{other:?} to Check"))),
        }
    }

    /// How many queue pairs each (local device, remote device) pair has (at least 1).
    pub fn qps_per_pair(&self) -> usize {
        self.qps.iter().map(|(_, q)| q.len()).max().unwrap_or(1)
    }

    /// The queue pairs from local device `local` to remote device `remote` (empty if none).
    pub fn qps(&self, local: u16, remote: u16) -> &[QueuePair] {
        self.qps
            .iter()
            .find(|(k, _)| *k == (local, remote))
            .map_or(&[], |(_, q)| q.as_slice())
    }

    /// Makes the queue pairs from `local` to `remote` if there are none. On failure the
    /// peer is asked to drop those it made for them (best effort: a control channel that
    /// failed is dropped whole, and the peer's queue pairs with it).
    pub fn ensure_qps(&mut self, shared: &Shared, local: u16, remote: u16) -> Result<()> {
        if !self.qps(local, remote).is_empty() {
            return Ok(());
        }
        let mut made = Vec::new();
        for _ in 0..shared.settings.queue_pairs {
            match self.connect_qp(shared, local, remote) {
                Ok(qp) => made.push(qp),
                Err((e, theirs)) => {
                    let mut qpns: Vec<u32> = made.iter().map(|q| q.remote_endpoint().qpn).collect();
                    qpns.extend(theirs);
                    drop(made);
                    self.release(qpns);
                    return Err(e);
                }
            }
        }
        self.metrics.queue_pairs(count(made.len()));
        tracing::debug!(
            local_device = local,
            remote_device = remote,
            queue_pairs = made.len(),
            "queue pairs made"
        );
        self.qps.push(((local, remote), made));
        Ok(())
    }

    /// One new queue pair from `local` to `remote`: endpoints cross the control channel.
    /// On failure, the peer's queue pair number if it made one.
    fn connect_qp(
        &mut self,
        shared: &Shared,
        local: u16,
        remote: u16,
    ) -> std::result::Result<QueuePair, (Error, Option<u32>)> {
        let fail = |e: rdma_dmabuf::Error| Error::rdma("connect a queue pair", &e);
        let prepared = shared
            .qp_builder(usize::from(local))
            .build()
            .map_err(|e| (fail(e), None))?;
        let req = Request::Connect {
            device: remote,
            endpoint: prepared.endpoint(),
        };
        let theirs = match self.call(&req) {
            Ok(Reply::Connected(e)) => e,
            Ok(Reply::Refused(why)) => {
                return Err((Error::Protocol(format!("peer refused: {why}")), None))
            }
            Ok(other) => return Err((Error::Protocol(format!("{other:?} to Connect")), None)),
            Err(e) => return Err((e, None)),
        };
        prepared
            .connect(&theirs)
            .map_err(|e| (fail(e), Some(theirs.qpn)))
    }

    /// Drops the queue pairs from `local` to `remote` (a rail that failed: they are in
    /// the error state), on both sides, so that the next [`PeerConn::ensure_qps`] makes new
    /// ones and the peer does not keep the old ones for the life of the connection.
    pub fn drop_rail(&mut self, local: u16, remote: u16) {
        let Some(i) = self.qps.iter().position(|(k, _)| *k == (local, remote)) else {
            return;
        };
        let (_, qps) = self.qps.swap_remove(i);
        self.metrics.queue_pairs(-count(qps.len()));
        let qpns = qps.iter().map(|q| q.remote_endpoint().qpn).collect();
        drop(qps);
        self.release(qpns);
    }

    /// Asks the peer to drop its queue pairs `qpns` (made over this connection); a failure
    /// is left to the next call on the channel to find.
    fn release(&mut self, qpns: Vec<u32>) {
        if !qpns.is_empty() {
            let _ = self.call(&Request::Release { qpns });
        }
    }

    fn call(&mut self, req: &Request) -> Result<Reply> {
        self.dialer.call(&mut self.channel, self.control, req)
    }

    /// Delivers a notification (returns once the peer has queued it); the peer knows it
    /// comes from this agent by the connection's authentication.
    pub fn notify(&mut self, message: &[u8]) -> Result<()> {
        let req = Request::Notify {
            message: message.to_vec(),
        };
        self.call(&req)?.noted()
    }
}

impl Drop for PeerConn {
    /// Its queue pairs go with it (the peer's with the control connection).
    fn drop(&mut self) {
        let held: usize = self.qps.iter().map(|(_, q)| q.len()).sum();
        self.metrics.queue_pairs(-count(held));
    }
}
