//! [`MetadataService`]: where agents publish their descriptors and find each other's;
//! [`EmbeddedMetadata`], the default backend, asks each agent directly over TCP.

use crate::auth::{Auth, Credentials};
use crate::channel::{Channel, Waits};
use crate::descriptor::AgentDescriptor;
use crate::error::{Error, Result};
use crate::wire::{call, Reply, Request};
use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::Duration;

/// A peer as the metadata service knows it: its descriptor and where its control channel
/// listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerRecord {
    /// The peer's descriptor, checked for its format version.
    pub descriptor: AgentDescriptor,
    /// The peer's control address (connections, notifications).
    pub control: SocketAddr,
}

/// Where descriptors are published and found.
///
/// Shaped for a key-value store with leases and watches (etcd): `publish` puts the agent's
/// descriptor under its key, all of an agent's keys under one lease that the backend keeps
/// alive (so a dead agent's descriptor disappears when the lease ends); `withdraw` revokes
/// it; `lookup` gets a peer's current descriptor, and a backend that watches the peers it
/// was asked about may answer from what the watch last delivered. The embedded backend has
/// no store: an agent serves its own descriptor, live, from its TCP listener.
pub trait MetadataService: Send + Sync {
    /// Publishes (or replaces) this agent's descriptor; `control` is its control address.
    ///
    /// # Errors
    /// The backend's.
    fn publish(&self, descriptor: &AgentDescriptor, control: SocketAddr) -> Result<()>;

    /// Withdraws the agent's descriptor.
    ///
    /// # Errors
    /// The backend's.
    fn withdraw(&self, agent: &str) -> Result<()>;

    /// The current descriptor of `agent`.
    ///
    /// # Errors
    /// [`Error::UnknownAgent`] for an agent the service does not know;
    /// [`Error::IncompatibleVersion`] for a descriptor of another format; the backend's.
    fn lookup(&self, agent: &str) -> Result<PeerRecord>;

    /// Whether [`MetadataService::lookup`] answers from a cache that the backend keeps
    /// current itself (a watch), cheaply: the agent then asks it before every transfer, so
    /// that a peer withdrawn or restarted is seen at once. `false` (the default): each
    /// lookup costs a round trip, and the agent keeps the records it got until a transfer
    /// finds them stale.
    fn follows_peers(&self) -> bool {
        false
    }

    /// Whether [`MetadataService::publish`] stores the descriptor it is given. `false`: the
    /// agent serves its own, live, and calls `publish` with an empty descriptor, so that a
    /// registration does not copy every segment's descriptor only for it to be dropped (with
    /// thousands of segments, that copy was most of a registration's time). `true` (the
    /// default): the whole descriptor each time.
    fn stores_descriptors(&self) -> bool {
        true
    }
}

/// The embedded backend: peers are named with their control address
/// ([`Agent::add_peer`](crate::Agent::add_peer)) and asked for their descriptor directly,
/// over an authenticated control connection.
#[derive(Debug)]
pub struct EmbeddedMetadata {
    pub(crate) peers: Mutex<HashMap<String, SocketAddr>>,
    dialer: Dialer,
}

impl EmbeddedMetadata {
    /// No peers yet. It connects to peers as agent `me`, authenticated by `auth`
    /// ([`Auth::FromEnvironment`] is read here); `timeout` bounds each connection and reply.
    ///
    /// # Errors
    /// [`Auth::resolve`]'s.
    pub fn new(me: &str, auth: &Auth, timeout: Duration) -> Result<EmbeddedMetadata> {
        Ok(EmbeddedMetadata::with_dialer(Dialer {
            me: me.into(),
            creds: std::sync::Arc::new(Credentials::load(&auth.resolve()?, Some(me))?),
            timeout,
        }))
    }

    pub(crate) fn with_dialer(dialer: Dialer) -> EmbeddedMetadata {
        EmbeddedMetadata {
            peers: Mutex::default(),
            dialer,
        }
    }

    /// Names `agent`'s control address.
    pub fn add_peer(&self, agent: &str, control: SocketAddr) {
        lock(&self.peers).insert(agent.into(), control);
    }

    /// Asks the agent listening at `control` for its descriptor, whatever its name, and
    /// names it with that address (a peer found by address alone: Mooncake's P2P
    /// handshake). The name is the one its connection authenticated.
    ///
    /// # Errors
    /// As a look-up: [`Error::Io`], [`Error::Authentication`], [`Error::Protocol`] for an
    /// answer that is not a descriptor of the authenticated agent.
    pub fn discover(&self, control: SocketAddr) -> Result<PeerRecord> {
        let r = self.describe(control, None)?;
        self.add_peer(&r.descriptor.agent, control);
        Ok(r)
    }

    /// The descriptor of the agent at `control` (which must be `expect` when given).
    fn describe(&self, control: SocketAddr, expect: Option<&str>) -> Result<PeerRecord> {
        let mut ch = self.dialer.dial(control, expect)?;
        let descriptor = match self.dialer.call(&mut ch, control, &Request::Describe)? {
            Reply::Descriptor(b) => AgentDescriptor::from_bytes(&b)?,
            other => return Err(Error::Protocol(format!("{other:?} to Describe"))),
        };
        let agent = expect.unwrap_or(&ch.peer);
        if descriptor.agent != agent {
            return Err(Error::Protocol(format!(
                "{control} is agent {:?}, not {agent:?}",
                descriptor.agent
            )));
        }
        Ok(PeerRecord {
            descriptor,
            control,
        })
    }
}

/// Locks a mutex whose data stays consistent through a panic (every update is one step).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// How an agent opens control connections: as whom, authenticated how, and how long each
/// connection, request and reply may take.
#[derive(Clone, Debug)]
pub(crate) struct Dialer {
    /// This agent's name.
    pub me: String,
    /// What this agent proves itself with.
    pub creds: std::sync::Arc<Credentials>,
    pub timeout: Duration,
}

impl Dialer {
    /// An authenticated control connection to `addr`, which must be agent `expect` when
    /// given.
    pub fn dial(&self, addr: SocketAddr, expect: Option<&str>) -> Result<Channel> {
        let s = TcpStream::connect_timeout(&addr, self.timeout)
            .map_err(|e| Error::io("connect to agent", addr, e))?;
        let set = s
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| s.set_write_timeout(Some(self.timeout)))
            .and_then(|()| s.set_nodelay(true));
        set.map_err(|e| Error::io("set timeouts on", addr, e))?;
        let waits = Waits {
            idle: Some(self.timeout),
            frame: self.timeout,
            until: None,
        };
        crate::auth::connect(s, addr, &self.me, &self.creds, expect, waits)
    }

    /// Sends `req` to the peer at `addr` over `ch` and reads its reply.
    pub fn call(&self, ch: &mut Channel, addr: SocketAddr, req: &Request) -> Result<Reply> {
        call(ch, addr, self.timeout, req)
    }
}

impl MetadataService for EmbeddedMetadata {
    fn publish(&self, _: &AgentDescriptor, _: SocketAddr) -> Result<()> {
        // The agent's listener serves its live descriptor: nothing to store.
        Ok(())
    }

    fn stores_descriptors(&self) -> bool {
        false
    }

    fn withdraw(&self, _: &str) -> Result<()> {
        Ok(())
    }

    fn lookup(&self, agent: &str) -> Result<PeerRecord> {
        let control = *lock(&self.peers)
            .get(agent)
            .ok_or_else(|| Error::UnknownAgent(agent.into()))?;
        self.describe(control, Some(agent))
    }
}
