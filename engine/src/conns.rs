//! The control listener's table of open connections: each one's socket, peer and queue
//! pairs, and the gauges read from it.

use crate::metadata::lock;
use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

/// One open connection, as the listener's table knows it.
pub(crate) struct Conn {
    /// A clone of its socket, to end it from another thread.
    pub stream: TcpStream,
    /// Its peer, once authenticated (`None`: in its handshake).
    pub peer: Option<String>,
    /// The queue pairs made over it.
    pub qps: u32,
    /// Shut down to make room for newer handshakes; its thread has not ended yet.
    pub ended: bool,
}

/// Every open connection, by the order they were accepted (the oldest first).
#[derive(Default)]
pub(crate) struct Table {
    /// The key the next connection accepted gets.
    pub next: u64,
    pub conns: BTreeMap<u64, Conn>,
    /// Connections accepted that have not sent their hello yet (held by the accepting
    /// thread, not here).
    pub pending: usize,
}

impl Table {
    /// The queue pairs held for `peer`, over all its connections.
    pub fn peer_qps(&self, peer: &str) -> u32 {
        self.conns
            .values()
            .filter(|c| c.peer.as_deref() == Some(peer))
            .map(|c| c.qps)
            .sum()
    }
}

/// The table, shared by the listener's threads.
pub(crate) type Conns = Arc<Mutex<Table>>;

/// The connections open now and the queue pairs held for them.
pub(crate) fn gauges(conns: &Conns) -> (u64, u64) {
    let t = lock(conns);
    let qps = t.conns.values().map(|c| u64::from(c.qps)).sum();
    ((t.conns.len() + t.pending) as u64, qps)
}
