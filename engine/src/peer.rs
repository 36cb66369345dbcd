//! [`PeerConn`]: the worker's connection to one peer: the control channel and the queue
//! pairs made over it, [`Settings::queue_pairs`](crate::Settings::queue_pairs) per (local
//! device, remote device) pair in use.

use crate::error::{Error, Result};
use crate::metadata::dial;
use crate::shared::Shared;
use crate::wire::{call, Reply, Request};
use rdma_dmabuf::QueuePair;
use std::net::{SocketAddr, TcpStream};

pub(crate) struct PeerConn {
    pub incarnation: u64,
    control: SocketAddr,
    stream: TcpStream,
    qps: Vec<((u16, u16), Vec<QueuePair>)>,
}

impl PeerConn {
    /// Connects the control channel and learns the peer's incarnation.
    pub fn open(shared: &Shared, control: SocketAddr) -> Result<PeerConn> {
        let stream = dial(control, shared.settings.io_timeout)?;
        let mut c = PeerConn {
            incarnation: 0,
            control,
            stream,
            qps: Vec::new(),
        };
        c.incarnation = c.check()?;
        Ok(c)
    }

    /// Asks the peer's incarnation (one round trip: the channel is alive, and the peer has
    /// not restarted if it answers the one expected).
    pub fn check(&mut self) -> Result<u64> {
        match call(&mut self.stream, self.control, &Request::Check)? {
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

    /// Makes the queue pairs from `local` to `remote` if there are none.
    pub fn ensure_qps(&mut self, shared: &Shared, local: u16, remote: u16) -> Result<()> {
        if !self.qps(local, remote).is_empty() {
            return Ok(());
        }
        let mut made = Vec::new();
        for _ in 0..shared.settings.queue_pairs {
            made.push(self.connect_qp(shared, local, remote)?);
        }
        self.qps.push(((local, remote), made));
        Ok(())
    }

    /// One new queue pair from `local` to `remote`: endpoints cross the control channel.
    fn connect_qp(&mut self, shared: &Shared, local: u16, remote: u16) -> Result<QueuePair> {
        let fail = |e: rdma_dmabuf::Error| Error::rdma("connect a queue pair", &e);
        let prepared = shared
            .qp_builder(usize::from(local))
            .build()
            .map_err(fail)?;
        let req = Request::Connect {
            device: remote,
            endpoint: prepared.endpoint(),
        };
        let theirs = match call(&mut self.stream, self.control, &req)? {
            Reply::Connected(e) => e,
            Reply::Refused(why) => return Err(Error::Protocol(format!("peer refused: {why}"))),
            other => return Err(Error::Protocol(format!("{other:?} to Connect"))),
        };
        prepared.connect(&theirs).map_err(fail)
    }

    /// Drops the queue pairs from `local` to `remote` (a rail that failed: they are in
    /// the error state), so that the next [`PeerConn::ensure_qps`] makes new ones.
    pub fn drop_rail(&mut self, local: u16, remote: u16) {
        self.qps.retain(|(k, _)| *k != (local, remote));
    }

    /// Delivers a notification (returns once the peer has queued it).
    pub fn notify(&mut self, from: &str, message: &[u8]) -> Result<()> {
        let req = Request::Notify {
            from: from.into(),
            message: message.to_vec(),
        };
        match call(&mut self.stream, self.control, &req)? {
            Reply::Noted => Ok(()),
            Reply::Refused(why) => Err(Error::Protocol(format!("notification refused: {why}"))),
            other => Err(Error::Protocol(format!("{other:?} to Notify"))),
        }
    }
}
