//! Multi-peer channels: one RC queue pair per peer, all in one protection domain, so a region
//! registered once serves every peer (the shape of the ibverbs-rs `MultiChannel`).
//!
//! Bring-up: [`MultiChannelBuilder`] -> [`PreparedMulti`] (tell peer `i` the endpoint
//! `endpoints()[i]`) -> [`MultiChannel`] (given each peer's endpoint for us). Operations name
//! the peer by index. The blocking operations here run in a [`scope`](crate::scope()): they
//! return when every part has completed, each part waiting at most the channel's
//! [`timeout`](MultiChannelBuilder::timeout); [`MultiChannel::peer`] gives the queue pairs for
//! the owned and scoped layers.

use crate::endpoint::Endpoint;
use crate::error::{Error, Op, Result};
use crate::mr::Backing;
use crate::part::{Part, PartMut};
use crate::qp::{PreparedQp, QueuePair, QueuePairBuilder};
use crate::remote::RemoteRegion;
use crate::scope::{scope_with_deadline, Scope, ScopedPending, DEFAULT_DRAIN_DEADLINE};
use crate::sys::pd::ProtectionDomain;
use crate::wr::{WorkCompletion, WorkKind};
use std::sync::Arc;
use std::time::Duration;

/// Settings of a multi-peer channel: the peer count, the timeout of its blocking
/// operations, and one [`QueuePairBuilder`] from which every peer's queue pair is built (so
/// every queue pair setting, port, depths, retries, completion channel, applies to all).
#[derive(Debug)]
pub struct MultiChannelBuilder {
    qp: QueuePairBuilder,
    peers: usize,
    timeout: Duration,
}

impl MultiChannelBuilder {
    /// A channel to `peers` peers in `pd`, with each queue pair's defaults
    /// ([`QueuePairBuilder::new`]).
    pub fn new(pd: &Arc<ProtectionDomain>, peers: usize) -> MultiChannelBuilder {
        MultiChannelBuilder {
            qp: QueuePairBuilder::new(pd),
            peers,
            timeout: DEFAULT_DRAIN_DEADLINE,
        }
    }

    /// How long a blocking operation waits for each part, and then for the rest to drain
    /// (default [`DEFAULT_DRAIN_DEADLINE`], 60 s; `Duration::MAX`: as long as it takes). A
    /// part still in flight after it fails the operation with `ETIMEDOUT`; what is still in
    /// flight after the drain deadline is flushed (see [`scope_with_deadline`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Changes the settings every peer's queue pair is built with, e.g.
    /// `.queue_pairs(|b| b.send_depth(16).retry_count(3))`.
    pub fn queue_pairs(mut self, f: impl FnOnce(QueuePairBuilder) -> QueuePairBuilder) -> Self {
        self.qp = f(self.qp);
        self
    }

    /// Sends, writes and reads outstanding per peer ([`QueuePairBuilder::send_depth`]).
    pub fn send_depth(self, n: u32) -> Self {
        self.queue_pairs(|b| b.send_depth(n))
    }

    /// Receives outstanding per peer ([`QueuePairBuilder::recv_depth`]).
    pub fn recv_depth(self, n: u32) -> Self {
        self.queue_pairs(|b| b.recv_depth(n))
    }

    /// The source GID index ([`QueuePairBuilder::gid_index`]).
    pub fn gid_index(self, i: u32) -> Self {
        self.queue_pairs(|b| b.gid_index(i))
    }

    /// Creates one queue pair per peer.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero peers or more than the device's `max_qp`; the
    /// queue pairs' errors.
    pub fn build(self) -> Result<PreparedMulti> {
        if self.peers == 0 {
            return Err(Error::invalid(
                Op::CreateQp,
                "a multi-peer channel needs at least one peer",
            ));
        }
        let ctx = self.qp.pd().context();
        let max_qp = ctx.query_device()?.max_qp;
        if u64::try_from(self.peers).unwrap_or(u64::MAX) > u64::from(max_qp) {
            return Err(Error::invalid(
                Op::CreateQp,
                format!(
                    "{} peers: {} holds at most {max_qp} queue pairs (max_qp), one per peer",
                    self.peers,
                    ctx.name()
                ),
            ));
        }
        let qps = (0..self.peers)
            .map(|_| self.qp.clone().build())
            .collect::<Result<Vec<_>>>()?;
        Ok(PreparedMulti {
            pd: self.qp.pd().clone(),
            qps,
            timeout: self.timeout,
        })
    }
}

/// A channel whose queue pairs await their peers' endpoints.
#[derive(Debug)]
pub struct PreparedMulti {
    /// Dropped before `pd` (field order; each queue pair holds the PD anyway).
    qps: Vec<PreparedQp>,
    pd: Arc<ProtectionDomain>,
    timeout: Duration,
}

impl PreparedMulti {
    /// The endpoint to give peer `i` (index `i`).
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.qps.iter().map(PreparedQp::endpoint).collect()
    }

    /// Connects queue pair `i` to `remote[i]`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if the count differs; the connections' errors.
    pub fn connect(self, remote: &[Endpoint]) -> Result<MultiChannel> {
        if remote.len() != self.qps.len() {
            return Err(Error::invalid(
                Op::ModifyQp,
                format!("{} endpoints for {} peers", remote.len(), self.qps.len()),
            ));
        }
        let peers = self
            .qps
            .into_iter()
            .zip(remote)
            .map(|(qp, ep)| qp.connect(ep))
            .collect::<Result<Vec<_>>>()?;
        Ok(MultiChannel {
            pd: self.pd,
            peers,
            timeout: self.timeout,
        })
    }
}

/// One connected queue pair per peer, sharing a protection domain.
#[derive(Debug)]
pub struct MultiChannel {
    /// Dropped before `pd` (field order; each queue pair holds the PD anyway).
    peers: Vec<QueuePair>,
    pd: Arc<ProtectionDomain>,
    timeout: Duration,
}

impl MultiChannel {
    /// The number of peers.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// Whether there are no peers (never: building needs one).
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The protection domain every region for this channel must be registered in.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The queue pair to peer `i`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an index past the peers.
    pub fn peer(&self, i: usize) -> Result<&QueuePair> {
        self.peers.get(i).ok_or_else(|| {
            Error::invalid(Op::PostSend, format!("peer {i} of {}", self.peers.len()))
        })
    }

    /// How long the blocking operations wait (see [`MultiChannelBuilder::timeout`]).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `parts[k].1` to peer `parts[k].0`, all at once; returns the completions in order.
    ///
    /// Every peer index and part is checked before anything is posted, so a bad one posts
    /// nothing.
    ///
    /// # Errors
    /// The first failing part's error (all parts have completed by then); `ETIMEDOUT` for a
    /// part still in flight after the channel's [`timeout`](MultiChannel::timeout).
    pub fn scatter_send<B: Backing>(
        &self,
        parts: &[(usize, Part<'_, B>)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_parts(
            parts
                .iter()
                .map(|&(peer, p)| (peer, WorkKind::Send, p, None)),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for (&(_, p), qp) in parts.iter().zip(&qps) {
                pending.push(s.send(qp, p, None)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// Sends the same bytes to every peer: one send per peer, all posted at once (unicast
    /// sends on each queue pair, not InfiniBand multicast).
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send`].
    pub fn send_to_all<B: Backing>(&self, part: Part<'_, B>) -> Result<Vec<WorkCompletion>> {
        let parts: Vec<_> = (0..self.peers.len()).map(|i| (i, part)).collect();
        self.scatter_send(&parts)
    }

    /// RDMA-writes each part to its peer's remote region, all at once.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send`].
    pub fn scatter_write<B: Backing>(
        &self,
        parts: &[(usize, Part<'_, B>, RemoteRegion)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_parts(
            parts
                .iter()
                .map(|&(peer, p, remote)| (peer, WorkKind::Write, p, Some(remote))),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for (&(_, p, remote), qp) in parts.iter().zip(&qps) {
                pending.push(s.write(qp, p, remote, None)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// Sends to each listed peer one message gathered from its parts (up to the queue
    /// pairs' [`max_sge`](crate::QueuePairBuilder::max_sge)), all at once.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send`], and a count of parts past `max_sge`.
    pub fn scatter_send_parts<B: Backing, const N: usize>(
        &self,
        parts: &[(usize, [Part<'_, B>; N])],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_many(
            parts
                .iter()
                .map(|(peer, p)| (*peer, WorkKind::Send, *p, None)),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p), qp) in parts.iter().zip(&qps) {
                pending.push(s.send_parts(qp, *p, None)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// RDMA-writes to each listed peer's remote region the parts gathered in order, all at
    /// once: several scattered blocks per peer in one request each.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send_parts`].
    pub fn scatter_write_parts<B: Backing, const N: usize>(
        &self,
        parts: &[(usize, [Part<'_, B>; N], RemoteRegion)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_many(
            parts
                .iter()
                .map(|(peer, p, remote)| (*peer, WorkKind::Write, *p, Some(*remote))),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p, remote), qp) in parts.iter().zip(&qps) {
                pending.push(s.write_parts(qp, *p, *remote, None)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// Receives one message from each listed peer into its part, all at once.
    ///
    /// Every peer index and part is checked before anything is posted. If a receive cannot be
    /// posted after others were, or a part fails or times out, the receives that nobody may
    /// answer are flushed before this returns, by moving the queue pairs used to the error
    /// state: those connections are then over.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send`].
    pub fn gather_recv<B: Backing>(
        &self,
        parts: &mut [(usize, PartMut<'_, B>)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_parts(
            parts
                .iter()
                .map(|(peer, p)| (*peer, WorkKind::Recv, p.shared(), None)),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p), qp) in parts.iter_mut().zip(&qps) {
                match s.recv(qp, p.reborrow()) {
                    Ok(p) => pending.push(p),
                    Err(e) => {
                        s.flush_at_end();
                        return Err(e);
                    }
                }
            }
            self.finish(s, pending, true)
        })
    }

    /// RDMA-reads each peer's remote region into its part, all at once.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send`].
    pub fn gather_read<B: Backing>(
        &self,
        parts: &mut [(usize, PartMut<'_, B>, RemoteRegion)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_parts(
            parts
                .iter()
                .map(|(peer, p, remote)| (*peer, WorkKind::Read, p.shared(), Some(*remote))),
        )?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p, remote), qp) in parts.iter_mut().zip(&qps) {
                pending.push(s.read(qp, p.reborrow(), *remote)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// The queue pair of each part, after checking every peer index and part: nothing is
    /// posted unless all are valid.
    fn check_parts<'r, B: Backing + 'r>(
        &self,
        parts: impl Iterator<Item = (usize, WorkKind, Part<'r, B>, Option<RemoteRegion>)>,
    ) -> Result<Vec<&QueuePair>> {
        parts
            .map(|(peer, kind, part, remote)| {
                let qp = self.peer(peer)?;
                qp.check(kind, part.region(), part.range(), remote)?;
                Ok(qp)
            })
            .collect()
    }

    /// Receives one message from each listed peer, scattered in order into its parts, all at
    /// once (flushing as [`MultiChannel::gather_recv`] does on failure).
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send_parts`].
    pub fn gather_recv_parts<B: Backing, const N: usize>(
        &self,
        parts: &mut [(usize, [PartMut<'_, B>; N])],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_many(parts.iter().map(|(peer, p)| {
            (
                *peer,
                WorkKind::Recv,
                p.each_ref().map(PartMut::shared),
                None,
            )
        }))?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p), qp) in parts.iter_mut().zip(&qps) {
                match s.recv_parts(qp, p.each_mut().map(PartMut::reborrow)) {
                    Ok(p) => pending.push(p),
                    Err(e) => {
                        s.flush_at_end();
                        return Err(e);
                    }
                }
            }
            self.finish(s, pending, true)
        })
    }

    /// RDMA-reads each listed peer's remote region, scattered in order into its parts, all at
    /// once.
    ///
    /// # Errors
    /// As [`MultiChannel::scatter_send_parts`].
    pub fn gather_read_parts<B: Backing, const N: usize>(
        &self,
        parts: &mut [(usize, [PartMut<'_, B>; N], RemoteRegion)],
    ) -> Result<Vec<WorkCompletion>> {
        let qps = self.check_many(parts.iter().map(|(peer, p, remote)| {
            let shared = p.each_ref().map(PartMut::shared);
            (*peer, WorkKind::Read, shared, Some(*remote))
        }))?;
        scope_with_deadline(self.timeout, |s| {
            let mut pending = Vec::with_capacity(parts.len());
            for ((_, p, remote), qp) in parts.iter_mut().zip(&qps) {
                pending.push(s.read_parts(qp, p.each_mut().map(PartMut::reborrow), *remote)?);
            }
            self.finish(s, pending, false)
        })
    }

    /// As `check_parts`, for requests of several parts each.
    fn check_many<'r, B: Backing + 'r, const N: usize>(
        &self,
        requests: impl Iterator<Item = (usize, WorkKind, [Part<'r, B>; N], Option<RemoteRegion>)>,
    ) -> Result<Vec<&QueuePair>> {
        requests
            .map(|(peer, kind, parts, remote)| {
                let qp = self.peer(peer)?;
                qp.check_parts::<B, N>(
                    kind,
                    parts.iter().map(|p| (p.region(), p.range())),
                    remote,
                )?;
                Ok(qp)
            })
            .collect()
    }

    /// Waits for every part in order, each for at most the channel's timeout. On the first
    /// failure the rest are left to the scope's drain; with `flush_on_error` (receives, which
    /// nobody may answer) the scope flushes them first.
    fn finish<'scope, 'env>(
        &self,
        s: &'scope Scope<'scope, 'env>,
        pending: Vec<ScopedPending<'scope, 'env>>,
        flush_on_error: bool,
    ) -> Result<Vec<WorkCompletion>> {
        let mut done = Vec::with_capacity(pending.len());
        for p in pending {
            let r = match p.spin_timeout(self.timeout) {
                Ok(r) => r,
                Err(_still_pending) => Err(Error::from_errno(
                    Op::PollCq,
                    format!("a multi-peer part: no completion within {:?}", self.timeout),
                    libc::ETIMEDOUT,
                )),
            };
            match r {
                Ok(wc) => done.push(wc),
                Err(e) => {
                    if flush_on_error {
                        s.flush_at_end();
                    }
                    return Err(e);
                }
            }
        }
        Ok(done)
    }
}
