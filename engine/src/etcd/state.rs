//! The etcd backend's state: what this agent publishes and what the watches delivered.

use super::record::{failure, metadata, one_segment, Failure, Record};
use super::EtcdSettings;
use crate::descriptor::{AgentDescriptor, SegmentDescriptor};
use crate::error::{Error, Result};
use crate::metadata::lock;
use crate::metadata::PeerRecord;
use crate::signed::Signing;
use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) struct Inner {
    pub(super) settings: EtcdSettings,
    pub(super) client: Client,
    /// What this backend publishes, and where it stands; serialises every write.
    pub(super) mine: tokio::sync::Mutex<Mine>,
    /// The current lease, readable without the async lock.
    pub(super) lease: Mutex<Option<i64>>,
    /// The last failure of the background re-publication (a name taken meanwhile).
    pub(super) republish_error: Mutex<Option<Error>>,
    /// The peers looked up, as the watches last delivered them.
    pub(super) peers: Mutex<HashMap<String, Watched>>,
    /// How values are signed and checked.
    pub(super) signing: Signing,
    /// Values read and refused ([`EtcdMetadata::refused_values`](super::EtcdMetadata::refused_values)).
    pub(super) refused_values: AtomicU64,
}

/// This agent's published state.
#[derive(Default)]
pub(super) struct Mine {
    pub(super) agent: Option<String>,
    pub(super) incarnation: u64,
    pub(super) control: Option<SocketAddr>,
    pub(super) segments: Vec<SegmentDescriptor>,
    /// The lease the keys are under; `None` before the first publication, after a withdrawal
    /// and while etcd is lost.
    pub(super) lease: Option<i64>,
    /// The segments written under the lease.
    pub(super) written: HashMap<String, SegmentDescriptor>,
    /// A lease given up while etcd was lost, revoked once a new one holds the keys.
    pub(super) orphan: Option<i64>,
    /// Whether the renewal task runs.
    pub(super) renewing: bool,
}

/// A peer as its watch last delivered it.
#[derive(Default)]
pub(super) struct Watched {
    pub(super) record: Option<Record>,
    pub(super) segments: BTreeMap<String, (u64, SegmentDescriptor)>,
    /// Keys whose value this engine refuses (another format version, malformed).
    pub(super) refused: BTreeMap<String, Error>,
    /// Whether the watch is running (the cache follows etcd).
    pub(super) live: bool,
}

impl Inner {
    pub(super) fn agent_prefix(&self, agent: &str) -> String {
        format!("{}/agents/{agent}/", self.settings.prefix)
    }

    pub(super) fn record_key(&self, agent: &str) -> String {
        format!("{}agent", self.agent_prefix(agent))
    }

    pub(super) fn segment_key(&self, agent: &str, segment: &str) -> String {
        format!("{}segments/{segment}", self.agent_prefix(agent))
    }

    pub(super) fn ttl_secs(&self) -> i64 {
        i64::try_from(self.settings.lease_ttl.as_secs().max(1)).unwrap_or(i64::MAX)
    }

    /// A request bounded by the settings' timeout.
    pub(super) async fn bounded<T, E: std::fmt::Display>(
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

    /// As [`Inner::bounded`], telling etcd's refusal of the request from a loss of etcd.
    pub(super) async fn attempt<T>(
        &self,
        op: &'static str,
        f: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> std::result::Result<T, Failure> {
        match tokio::time::timeout(self.settings.timeout, f).await {
            Ok(r) => r.map_err(|e| failure(op, &e)),
            Err(_) => Err(Failure::Lost),
        }
    }

    /// Publishes `mine` under a new lease: the agent record (refused if another incarnation
    /// holds the name), every segment, the removal of stale segment keys; then revokes the
    /// old lease.
    pub(super) async fn establish(&self, mine: &mut Mine) -> Result<()> {
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
        let value = self.signing.seal(&key, &agent, record.to_bytes())?;
        let put = || Some(PutOptions::new().with_lease(lease));
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), value.clone(), put())])
            .or_else([TxnOp::get(key.clone(), None)]);
        let done = self.bounded("publish the agent record", c.txn(txn)).await?;
        if !done.succeeded() {
            let existing = done.op_responses().into_iter().find_map(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
                _ => None,
            });
            let theirs = existing.as_deref().map(|v| {
                self.signing
                    .open(&key, &agent, v)
                    .and_then(Record::from_bytes)
            });
            match theirs {
                Some(Ok(r)) if r.incarnation == mine.incarnation => {
                    // Ours, from an earlier lease: move it to the new one.
                    self.bounded("publish the agent record", c.put(key.clone(), value, put()))
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
            let k = self.segment_key(&agent, &s.name);
            let v = one_segment(&agent, mine.incarnation, s);
            let v = self.signing.seal(&k, &agent, v)?;
            self.bounded("publish a segment", c.put(k, v, put()))
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
    /// segments, deletes removed ones; stops at the first failure (`mine.written` tells
    /// what was done).
    pub(super) async fn sync(&self, mine: &mut Mine) -> std::result::Result<(), Failure> {
        let agent = mine.agent.clone().expect("an agent");
        let lease = mine.lease.expect("a lease");
        let mut c = self.client.clone();
        for s in &mine.segments {
            if mine.written.get(&s.name) == Some(s) {
                continue;
            }
            let k = self.segment_key(&agent, &s.name);
            let v = one_segment(&agent, mine.incarnation, s);
            let v = self.signing.seal(&k, &agent, v).map_err(Failure::Refused)?;
            let opts = Some(PutOptions::new().with_lease(lease));
            self.attempt("publish a segment", c.put(k, v, opts)).await?;
            mine.written.insert(s.name.clone(), s.clone());
        }
        let gone: Vec<String> = mine
            .written
            .keys()
            .filter(|n| !mine.segments.iter().any(|s| &s.name == *n))
            .cloned()
            .collect();
        for n in gone {
            self.attempt(
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
    pub(super) async fn renew(self: Arc<Inner>) {
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
    pub(super) async fn keep_alive(&self, lease: i64, period: Duration) -> Result<()> {
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
    pub(super) async fn fetch(&self, agent: &str) -> Result<(Watched, i64)> {
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

    /// Refuses `key`'s value (the peer's look-ups fail with `e` until it changes), counted.
    fn refuse(&self, w: &mut Watched, key: String, e: Error) {
        self.refused_values.fetch_add(1, Ordering::Relaxed);
        w.refused.insert(key, e);
    }

    /// One key's new value (`None`: deleted) into a peer's state.
    pub(super) fn apply(&self, agent: &str, w: &mut Watched, key: &[u8], value: Option<&[u8]>) {
        let key = String::from_utf8_lossy(key).into_owned();
        let Some(rest) = key.strip_prefix(&self.agent_prefix(agent)) else {
            return;
        };
        w.refused.remove(&key);
        let value = match value.map(|v| self.signing.open(&key, agent, v)).transpose() {
            Ok(v) => v,
            Err(e) => return self.refuse(w, key, e),
        };
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
                    self.refuse(w, key, e);
                }
                Some(Err(e)) => {
                    self.refuse(w, key, e);
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
                        self.refuse(w, key, e);
                    }
                }
                Some(Ok(_)) => {
                    let e = Error::Protocol(format!("{key} is not one segment of {agent:?}"));
                    self.refuse(w, key, e);
                }
                Some(Err(e)) => {
                    self.refuse(w, key, e);
                }
            }
        }
    }

    /// Follows `agent`'s prefix from revision `from`; when the watch breaks, reads the
    /// prefix again once etcd answers and watches on.
    pub(super) async fn watch(self: Arc<Inner>, agent: String, mut from: i64) {
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

    pub(super) async fn follow(&self, agent: &str, from: &mut i64) -> Result<()> {
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

/// A peer's record from its watched state.
pub(super) fn record_of(agent: &str, w: &Watched) -> Result<PeerRecord> {
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
