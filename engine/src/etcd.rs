//! [`EtcdMetadata`]: the etcd backend of the [`MetadataService`] (cargo feature `etcd`).
//!
//! Keys, under [`EtcdSettings::prefix`] (default `/gpu-rdma`):
//!
//! * `<prefix>/agents/<agent>/agent`: the agent record (magic `GRA\0`, [`FORMAT_VERSION`],
//!   name, incarnation, control address);
//! * `<prefix>/agents/<agent>/segments/<segment>`: one per segment, an [`AgentDescriptor`]'s
//!   wire form holding that segment alone (so each key carries the format version and the
//!   incarnation it belongs to).
//!
//! All of an agent's keys are attached to one lease of [`EtcdSettings::lease_ttl`], kept
//! alive by a task of the backend: a dead agent's keys vanish when its lease ends, a
//! withdrawn agent's at once (the lease is revoked). A peer's first look-up reads the
//! agent's prefix and starts a watch on it, so that the backend's cache learns of new and
//! removed segments and of a new incarnation without asking again.
//!
//! etcd-client is asynchronous: the backend runs its own small tokio runtime (one worker
//! thread) and the engine's API stays blocking; every call is bounded by
//! [`EtcdSettings::timeout`].

use crate::codec::{Reader, Writer};
use crate::descriptor::{AgentDescriptor, SegmentDescriptor, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::metadata::{lock, MetadataService, PeerRecord};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    WatchOptions,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The first bytes of an agent record; [`FORMAT_VERSION`] follows.
const RECORD_MAGIC: &[u8; 4] = b"GRA\0";

/// Where the etcd backend finds etcd and how it uses it.
#[derive(Clone, Debug)]
pub struct EtcdSettings {
    /// etcd's client URLs (`http://127.0.0.1:2379`). Default: `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// The key prefix of every key the backend writes or reads. Default `/gpu-rdma`.
    pub prefix: String,
    /// The lease's time to live: how long after an agent dies (stops keeping its lease
    /// alive) its keys vanish. The lease is renewed every third of it. Default 5 s; etcd
    /// rounds it up to whole seconds and to its own minimum.
    pub lease_ttl: Duration,
    /// Bounds each connection and request to etcd. Default 2 s.
    pub timeout: Duration,
}

impl Default for EtcdSettings {
    fn default() -> EtcdSettings {
        EtcdSettings {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/gpu-rdma".into(),
            lease_ttl: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
        }
    }
}

/// The etcd backend of the [`MetadataService`]: see the module's documentation in
/// docs/engine.md ("The etcd backend") for the keys, the lease, the watch and what happens
/// while etcd is unreachable.
///
/// One `EtcdMetadata` publishes for one agent (its lease is that agent's); give it to
/// [`Agent::with_metadata`](crate::Agent::with_metadata). Dropping it without
/// [`MetadataService::withdraw`] stops the lease's renewal, as a crash would: the keys
/// vanish after [`EtcdSettings::lease_ttl`].
pub struct EtcdMetadata {
    inner: Arc<Inner>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for EtcdMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdMetadata")
            .field("settings", &self.inner.settings)
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

struct Inner {
    settings: EtcdSettings,
    client: Client,
    /// What this backend publishes, and where it stands; serialises every write.
    mine: tokio::sync::Mutex<Mine>,
    /// The current lease, readable without the async lock.
    lease: Mutex<Option<i64>>,
    /// The last failure of the background re-publication (a name taken meanwhile).
    republish_error: Mutex<Option<Error>>,
    /// The peers looked up, as the watches last delivered them.
    peers: Mutex<HashMap<String, Watched>>,
}

/// This agent's published state.
#[derive(Default)]
struct Mine {
    agent: Option<String>,
    incarnation: u64,
    control: Option<SocketAddr>,
    segments: Vec<SegmentDescriptor>,
    /// The lease the keys are under; `None` before the first publication, after a withdrawal
    /// and while etcd is lost.
    lease: Option<i64>,
    /// The segments written under the lease.
    written: HashMap<String, SegmentDescriptor>,
    /// A lease given up while etcd was lost, revoked once a new one holds the keys.
    orphan: Option<i64>,
    /// Whether the renewal task runs.
    renewing: bool,
}

/// A peer as its watch last delivered it.
#[derive(Default)]
struct Watched {
    record: Option<Record>,
    segments: BTreeMap<String, (u64, SegmentDescriptor)>,
    /// Keys whose value this engine refuses (another format version, malformed).
    refused: BTreeMap<String, Error>,
    /// Whether the watch is running (the cache follows etcd).
    live: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Record {
    agent: String,
    incarnation: u64,
    control: SocketAddr,
}

impl Record {
    fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.raw(RECORD_MAGIC).u16(FORMAT_VERSION);
        w.str(&self.agent)
            .u64(self.incarnation)
            .str(&self.control.to_string());
        w.0
    }

    fn from_bytes(b: &[u8]) -> Result<Record> {
        let mut r = Reader::new(b);
        if r.raw(RECORD_MAGIC.len())? != RECORD_MAGIC {
            return Err(Error::Protocol("not an agent record (bad magic)".into()));
        }
        let found = r.u16()?;
        if found != FORMAT_VERSION {
            return Err(Error::IncompatibleVersion {
                found,
                supported: FORMAT_VERSION,
            });
        }
        let agent = r.str()?;
        let incarnation = r.u64()?;
        let control = r
            .str()?
            .parse()
            .map_err(|e| Error::Protocol(format!("agent record's control address: {e}")))?;
        r.end()?;
        Ok(Record {
            agent,
            incarnation,
            control,
        })
    }
}

/// An etcd failure as the engine's typed error.
fn metadata(op: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Metadata {
        op,
        detail: e.to_string(),
    }
}

/// Refuses an agent name that would not stay inside its own prefix.
fn check_name(agent: &str) -> Result<()> {
    if agent.is_empty() || agent.contains('/') {
        return Err(Error::Settings(format!(
            "agent name {agent:?}: the etcd backend needs a non-empty name without '/'"
        )));
    }
    Ok(())
}

impl Inner {
    fn agent_prefix(&self, agent: &str) -> String {
        format!("{}/agents/{agent}/", self.settings.prefix)
    }

    fn record_key(&self, agent: &str) -> String {
        format!("{}agent", self.agent_prefix(agent))
    }

    fn segment_key(&self, agent: &str, segment: &str) -> String {
        format!("{}segments/{segment}", self.agent_prefix(agent))
    }

    fn ttl_secs(&self) -> i64 {
        i64::try_from(self.settings.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX)
    }

    /// A request bounded by the settings' timeout.
    async fn bounded<T, E: std::fmt::Display>(
        &self,
        op: &'static str,
        f: impl Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.settings.timeout, f).await {
            Ok(r) => r.map_err(|e| metadata(op, e)),
            Err(_) => Err(metadata(
                op,
                format!("no answer in {:?}", self.settings.timeout),
            )),
        }
    }

    /// Publishes `mine` under a new lease: the agent record (refused if another incarnation
    /// holds the name), every segment, the removal of stale segment keys; then revokes the
    /// old lease.
    async fn establish(&self, mine: &mut Mine) -> Result<()> {
        let agent = mine.agent.clone().expect("an agent to publish");
        let record = Record {
            agent: agent.clone(),
            incarnation: mine.incarnation,
            control: mine.control.expect("a control address"),
        };
        let mut c = self.client.clone();
        let granted = self
            .bounded("grant a lease", c.lease_grant(self.ttl_secs(), None))
            .await?;
        let lease = granted.id();
        let key = self.record_key(&agent);
        let put = || Some(PutOptions::new().with_lease(lease));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), record.to_bytes(), put())])
            .or_else([TxnOp::get(key.clone(), None)]);
        let done = self.bounded("publish the agent record", c.txn(txn)).await?;
        if !done.succeeded() {
            let existing = done.op_responses().into_iter().find_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            });
            let theirs = existing.as_deref().map(Record::from_bytes);
            match theirs {
                Some(Ok(r)) if r.incarnation == mine.incarnation => {
                    // Ours, from an earlier lease: move it to the new one.
                    self.bounded(
                        "publish the agent record",
                        c.put(key.clone(), record.to_bytes(), put()),
                    )
                    .await?;
                }
                other => {
                    let _ = c.lease_revoke(lease).await;
                    return Err(Error::AgentExists {
                        agent,
                        incarnation: match other {
                            Some(Ok(r)) => Some(r.incarnation),
                            _ => None,
                        },
                    });
                }
            }
        }
        for s in &mine.segments {
            let v = one_segment(&agent, mine.incarnation, s);
            self.bounded(
                "publish a segment",
                c.put(self.segment_key(&agent, &s.name), v, put()),
            )
            .await?;
        }
        // Segment keys of ours that are no longer segments (removed while etcd was lost).
        let listed = self
            .bounded(
                "list the agent's segments",
                c.get(
                    format!("{}segments/", self.agent_prefix(&agent)),
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                ),
            )
            .await?;
        let keep: HashSet<String> = mine
            .segments
            .iter()
            .map(|s| self.segment_key(&agent, &s.name))
            .collect();
        for kv in listed.kvs() {
            let k = String::from_utf8_lossy(kv.key()).into_owned();
            if !keep.contains(&k) {
                self.bounded("remove a stale segment", c.delete(k, None))
                    .await?;
            }
        }
        for old in [mine.lease.replace(lease), mine.orphan.take()]
            .into_iter()
            .flatten()
        {
            let _ = self
                .bounded("revoke the old lease", c.lease_revoke(old))
                .await;
        }
        *lock(&self.lease) = Some(lease);
        mine.written = mine
            .segments
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        Ok(())
    }

    /// Brings etcd to `mine.segments` under the current lease: puts new or changed
    /// segments, deletes removed ones.
    async fn sync(&self, mine: &mut Mine) -> Result<()> {
        let agent = mine.agent.clone().expect("an agent");
        let lease = mine.lease.expect("a lease");
        let mut c = self.client.clone();
        for s in &mine.segments {
            if mine.written.get(&s.name) == Some(s) {
                continue;
            }
            let v = one_segment(&agent, mine.incarnation, s);
            let opts = Some(PutOptions::new().with_lease(lease));
            self.bounded(
                "publish a segment",
                c.put(self.segment_key(&agent, &s.name), v, opts),
            )
            .await?;
            mine.written.insert(s.name.clone(), s.clone());
        }
        let gone: Vec<String> = mine
            .written
            .keys()
            .filter(|n| !mine.segments.iter().any(|s| &s.name == *n))
            .cloned()
            .collect();
        for n in gone {
            self.bounded(
                "remove a segment",
                c.delete(self.segment_key(&agent, &n), None),
            )
            .await?;
            mine.written.remove(&n);
        }
        Ok(())
    }

    /// Keeps the lease alive; when it is lost (etcd unreachable, or the lease expired),
    /// publishes again under a new lease as soon as etcd answers.
    async fn renew(self: Arc<Inner>) {
        let period = (self.settings.lease_ttl / 3).max(Duration::from_millis(200));
        loop {
            let lease = self.mine.lock().await.lease;
            let Some(lease) = lease else {
                // Withdrawn, or lost: publish again unless withdrawn.
                let mut mine = self.mine.lock().await;
                if mine.agent.is_none() {
                    mine.renewing = false;
                    return;
                }
                match self.establish(&mut mine).await {
                    Ok(()) => *lock(&self.republish_error) = None,
                    Err(e) => {
                        if matches!(e, Error::AgentExists { .. }) {
                            *lock(&self.republish_error) = Some(e);
                        }
                        drop(mine);
                        tokio::time::sleep(period).await;
                    }
                }
                continue;
            };
            if self.keep_alive(lease, period).await.is_err() {
                let mut mine = self.mine.lock().await;
                if mine.lease == Some(lease) {
                    mine.orphan = mine.lease.take();
                    *lock(&self.lease) = None;
                }
            }
        }
    }

    /// Renews `lease` every `period` until it fails or ends.
    async fn keep_alive(&self, lease: i64, period: Duration) -> Result<()> {
        let mut c = self.client.clone();
        let (mut keeper, mut answers) = self
            .bounded("keep the lease alive", c.lease_keep_alive(lease))
            .await?;
        loop {
            self.bounded("keep the lease alive", keeper.keep_alive())
                .await?;
            let answer = self
                .bounded("keep the lease alive", answers.message())
                .await?;
            match answer {
                Some(a) if a.ttl() > 0 => {}
                _ => return Err(metadata("keep the lease alive", "the lease ended")),
            }
            if self.mine.lock().await.lease != Some(lease) {
                return Ok(());
            }
            tokio::time::sleep(period).await;
        }
    }

    /// Reads `agent`'s keys; returns its state and the revision read at.
    async fn fetch(&self, agent: &str) -> Result<(Watched, i64)> {
        let mut c = self.client.clone();
        let got = self
            .bounded(
                "look up an agent",
                c.get(
                    self.agent_prefix(agent),
                    Some(GetOptions::new().with_prefix()),
                ),
            )
            .await?;
        let mut w = Watched {
            live: true,
            ..Watched::default()
        };
        for kv in got.kvs() {
            self.apply(agent, &mut w, kv.key(), Some(kv.value()));
        }
        let rev = got
            .header()
            .map_or(0, etcd_client::ResponseHeader::revision);
        Ok((w, rev))
    }

    /// One key's new value (`None`: deleted) into a peer's state.
    fn apply(&self, agent: &str, w: &mut Watched, key: &[u8], value: Option<&[u8]>) {
        let key = String::from_utf8_lossy(key).into_owned();
        let Some(rest) = key.strip_prefix(&self.agent_prefix(agent)) else {
            return;
        };
        w.refused.remove(&key);
        if rest == "agent" {
            match value.map(Record::from_bytes) {
                None => {
                    w.record = None;
                    w.segments.clear();
                }
                Some(Ok(r)) if r.agent == agent => {
                    let inc = r.incarnation;
                    w.record = Some(r);
                    w.segments.retain(|_, (i, _)| *i == inc);
                }
                Some(Ok(r)) => {
                    let e = Error::Protocol(format!("{key} names agent {:?}", r.agent));
                    w.refused.insert(key, e);
                }
                Some(Err(e)) => {
                    w.refused.insert(key, e);
                }
            }
        } else if let Some(name) = rest.strip_prefix("segments/") {
            match value.map(AgentDescriptor::from_bytes) {
                None => {
                    w.segments.remove(name);
                }
                Some(Ok(d)) if d.agent == agent && d.segments.len() == 1 => {
                    let s = d.segments.into_iter().next().expect("one segment");
                    if s.name == name {
                        w.segments.insert(name.into(), (d.incarnation, s));
                    } else {
                        let e = Error::Protocol(format!("{key} holds segment {:?}", s.name));
                        w.refused.insert(key, e);
                    }
                }
                Some(Ok(_)) => {
                    let e = Error::Protocol(format!("{key} is not one segment of {agent:?}"));
                    w.refused.insert(key, e);
                }
                Some(Err(e)) => {
                    w.refused.insert(key, e);
                }
            }
        }
    }

    /// Follows `agent`'s prefix from revision `from`; when the watch breaks, reads the
    /// prefix again once etcd answers and watches on.
    async fn watch(self: Arc<Inner>, agent: String, mut from: i64) {
        let retry = (self.settings.lease_ttl / 5).max(Duration::from_millis(200));
        loop {
            let _ = self.follow(&agent, &mut from).await;
            if let Some(w) = lock(&self.peers).get_mut(&agent) {
                w.live = false;
            }
            loop {
                tokio::time::sleep(retry).await;
                if let Ok((w, rev)) = self.fetch(&agent).await {
                    lock(&self.peers).insert(agent.clone(), w);
                    from = rev + 1;
                    break;
                }
            }
        }
    }

    async fn follow(&self, agent: &str, from: &mut i64) -> Result<()> {
        let mut c = self.client.clone();
        let opts = WatchOptions::new().with_prefix().with_start_revision(*from);
        let mut stream = self
            .bounded(
                "watch an agent",
                c.watch(self.agent_prefix(agent), Some(opts)),
            )
            .await?;
        loop {
            let Some(resp) = stream
                .message()
                .await
                .map_err(|e| metadata("watch an agent", e))?
            else {
                return Err(metadata("watch an agent", "the watch ended"));
            };
            if resp.canceled() {
                return Err(metadata("watch an agent", "the watch was cancelled"));
            }
            let mut peers = lock(&self.peers);
            let w = peers.entry(agent.into()).or_default();
            w.live = true;
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let value = match ev.event_type() {
                    EventType::Put => Some(kv.value()),
                    EventType::Delete => None,
                };
                self.apply(agent, w, kv.key(), value);
                *from = (*from).max(kv.mod_revision() + 1);
            }
        }
    }
}

/// A segment's value: an agent descriptor holding that segment alone.
fn one_segment(agent: &str, incarnation: u64, s: &SegmentDescriptor) -> Vec<u8> {
    AgentDescriptor {
        agent: agent.into(),
        incarnation,
        segments: vec![s.clone()],
    }
    .to_bytes()
}

/// A peer's record from its watched state.
fn record_of(agent: &str, w: &Watched) -> Result<PeerRecord> {
    if let Some(e) = w.refused.values().next() {
        return Err(e.clone());
    }
    let r = w
        .record
        .as_ref()
        .ok_or_else(|| Error::UnknownAgent(agent.into()))?;
    let segments = w
        .segments
        .values()
        .filter(|(i, _)| *i == r.incarnation)
        .map(|(_, s)| s.clone())
        .collect();
    Ok(PeerRecord {
        descriptor: AgentDescriptor {
            agent: agent.into(),
            incarnation: r.incarnation,
            segments,
        },
        control: r.control,
    })
}

impl EtcdMetadata {
    /// Connects to etcd at `settings.endpoints`.
    ///
    /// # Errors
    /// [`Error::Settings`] for a TTL under a second or no endpoint; [`Error::Metadata`]
    /// when the runtime cannot start or etcd does not answer within
    /// [`EtcdSettings::timeout`].
    pub fn new(settings: EtcdSettings) -> Result<EtcdMetadata> {
        if settings.lease_ttl < Duration::from_secs(1) || settings.endpoints.is_empty() {
            return Err(Error::Settings(
                "etcd: a lease TTL of at least 1 s and at least one endpoint".into(),
            ));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("etcd-metadata")
            .enable_all()
            .build()
            .map_err(|e| metadata("start the etcd backend's runtime", e))?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(settings.timeout)
            .with_timeout(settings.timeout)
            .with_keep_alive(settings.timeout, settings.timeout)
            .with_keep_alive_while_idle(true);
        let endpoints = settings.endpoints.clone();
        let timeout = settings.timeout;
        let client = runtime.block_on(async move {
            let c = tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts))).await;
            let mut c = c
                .map_err(|_| metadata("connect to etcd", format!("no answer in {timeout:?}")))?
                .map_err(|e| metadata("connect to etcd", e))?;
            // The channel connects lazily: ask once, so that a dead etcd is reported here.
            tokio::time::timeout(timeout, c.status())
                .await
                .map_err(|_| metadata("connect to etcd", format!("no answer in {timeout:?}")))?
                .map_err(|e| metadata("connect to etcd", e))?;
            Ok::<_, Error>(c)
        })?;
        Ok(EtcdMetadata {
            inner: Arc::new(Inner {
                settings,
                client,
                mine: tokio::sync::Mutex::default(),
                lease: Mutex::default(),
                republish_error: Mutex::default(),
                peers: Mutex::default(),
            }),
            runtime: Some(runtime),
        })
    }

    /// The settings it was made with.
    pub fn settings(&self) -> &EtcdSettings {
        &self.inner.settings
    }

    /// The lease the agent's keys are under now: `None` before the first publication,
    /// after a withdrawal, and while etcd is lost (a new one is granted when it answers).
    pub fn lease(&self) -> Option<i64> {
        *lock(&self.inner.lease)
    }

    /// Why the last re-publication after a loss of etcd was refused
    /// ([`Error::AgentExists`]: another incarnation took the name meanwhile); `None` when it
    /// succeeded or none was needed.
    pub fn republish_error(&self) -> Option<Error> {
        lock(&self.inner.republish_error).clone()
    }

    /// The key of `agent`'s record.
    pub fn record_key(&self, agent: &str) -> String {
        self.inner.record_key(agent)
    }

    /// The key of `agent`'s segment `segment`.
    pub fn segment_key(&self, agent: &str, segment: &str) -> String {
        self.inner.segment_key(agent, segment)
    }

    /// Runs `f` on the backend's runtime and waits for it, at most `bound` (callable from
    /// any thread, a tokio runtime's included).
    fn run<T: Send + 'static>(
        &self,
        bound: Duration,
        f: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let rt = self.runtime.as_ref().ok_or(Error::ShuttingDown)?;
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv_timeout(bound)
            .map_err(|_| metadata("reach etcd", format!("no answer in {bound:?}")))?
    }

    /// A bound on a call made of several requests.
    fn call_bound(&self, requests: u32) -> Duration {
        self.inner.settings.timeout * (requests + 2)
    }
}

impl MetadataService for EtcdMetadata {
    /// Publishes `descriptor` under the agent's lease. The first call grants the lease,
    /// creates the agent record (refused with [`Error::AgentExists`] while a live record of
    /// another incarnation holds the name) and starts the lease's renewal; later calls put
    /// new or changed segments and delete removed ones. While etcd is lost a later call
    /// only records the descriptor, which is published when etcd answers again.
    fn publish(&self, descriptor: &AgentDescriptor, control: SocketAddr) -> Result<()> {
        check_name(&descriptor.agent)?;
        if control.ip().is_unspecified() {
            return Err(Error::Settings(format!(
                "control address {control}: with the etcd backend, bind the agent to an \
                 address its peers reach (Settings::bind)"
            )));
        }
        let inner = self.inner.clone();
        let d = descriptor.clone();
        let requests = u32::try_from(d.segments.len()).unwrap_or(u32::MAX / 4) * 2 + 6;
        let rt = self.runtime.as_ref().ok_or(Error::ShuttingDown)?.handle();
        let handle = rt.clone();
        self.run(self.call_bound(requests), async move {
            let mut mine = inner.mine.lock().await;
            match &mine.agent {
                Some(a) if *a != d.agent => {
                    return Err(Error::Settings(format!(
                        "this EtcdMetadata publishes agent {a:?}, not {:?}",
                        d.agent
                    )))
                }
                _ => {}
            }
            let first = mine.agent.is_none();
            mine.agent = Some(d.agent.clone());
            mine.incarnation = d.incarnation;
            mine.control = Some(control);
            mine.segments = d.segments;
            if first {
                if let Err(e) = inner.establish(&mut mine).await {
                    *mine = Mine::default();
                    return Err(e);
                }
            } else if mine.lease.is_some() && inner.sync(&mut mine).await.is_err() {
                // Lost: the renewal task publishes everything again under a new lease.
                mine.orphan = mine.lease.take();
                *lock(&inner.lease) = None;
            }
            if !mine.renewing {
                mine.renewing = true;
                handle.spawn(inner.clone().renew());
            }
            Ok(())
        })
    }

    /// Revokes the agent's lease: its keys vanish at once.
    fn withdraw(&self, agent: &str) -> Result<()> {
        let inner = self.inner.clone();
        let agent = agent.to_owned();
        self.run(self.call_bound(1), async move {
            let mut mine = inner.mine.lock().await;
            if mine.agent.as_deref() != Some(agent.as_str()) {
                return Ok(());
            }
            let lease = mine.lease.take();
            *mine = Mine {
                renewing: mine.renewing,
                ..Mine::default()
            };
            *lock(&inner.lease) = None;
            if let Some(l) = lease {
                let mut c = inner.client.clone();
                inner.bounded("revoke the lease", c.lease_revoke(l)).await?;
            }
            Ok(())
        })
    }

    /// `agent`'s descriptor: from the watched cache while its watch runs; otherwise read
    /// from etcd (and a watch started). When etcd does not answer, an agent looked up
    /// before is answered from the cache as last delivered; an agent never looked up fails
    /// with [`Error::Metadata`].
    fn lookup(&self, agent: &str) -> Result<PeerRecord> {
        check_name(agent)?;
        let cached = lock(&self.inner.peers)
            .get(agent)
            .map(|w| (w.live, record_of(agent, w)));
        if let Some((true, r)) = cached {
            return r;
        }
        let inner = self.inner.clone();
        let name = agent.to_owned();
        let fetched = self.run(self.call_bound(1), async move { inner.fetch(&name).await });
        match (fetched, cached) {
            (Ok((w, rev)), _) => {
                let r = record_of(agent, &w);
                let started = lock(&self.inner.peers).insert(agent.into(), w).is_some();
                if !started {
                    if let Some(rt) = &self.runtime {
                        rt.spawn(self.inner.clone().watch(agent.into(), rev + 1));
                    }
                }
                r
            }
            (Err(_), Some((_, r))) => r,
            (Err(e), None) => Err(e),
        }
    }
}

impl Drop for EtcdMetadata {
    /// Stops the runtime: the lease is no longer renewed (its keys vanish after the TTL,
    /// unless [`MetadataService::withdraw`] revoked it) and the watches end.
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
