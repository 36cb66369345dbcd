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

mod access;
mod record;
mod state;

use crate::auth::{Auth, Credentials};
use crate::descriptor::AgentDescriptor;
use crate::error::{Error, Result};
use crate::metadata::{lock, MetadataService, PeerRecord};
use crate::signed::Signing;
use etcd_client::{Client, ConnectOptions};
use record::{check_name, metadata, Failure};
use state::{record_of, Inner, Mine};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    /// How the values are signed and checked (docs/engine.md, "Security"): with a cluster
    /// key, every value this backend writes carries a proof of the key, and a value without
    /// one (written straight into etcd by someone who is not an agent) is refused. Give the
    /// same as the agent's [`Settings::auth`](crate::Settings::auth). Default
    /// [`Auth::FromEnvironment`], read by [`EtcdMetadata::new`].
    pub auth: Auth,
    /// etcd's own authentication: a user and password for etcd's role-based access
    /// (`etcdctl user add`, `etcdctl auth enable`), so that only the cluster's agents may
    /// write (or read) the prefix. `None` (the default): the environment variables
    /// `GPU_RDMA_ETCD_USER` and `GPU_RDMA_ETCD_PASSWORD_FILE` (a file holding the password)
    /// when set, else none.
    pub user: Option<EtcdUser>,
    /// TLS to etcd (`https://` endpoints): its CA and, for etcd's `--client-cert-auth`, this
    /// client's certificate and key. `None` (the default): the environment variables
    /// `GPU_RDMA_ETCD_CA`, `GPU_RDMA_ETCD_CERT` and `GPU_RDMA_ETCD_KEY` (PEM files) when
    /// `GPU_RDMA_ETCD_CA` is set, else plain TCP.
    pub tls: Option<EtcdTls>,
}

/// A user of etcd's role-based access control ([`EtcdSettings::user`]).
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdUser {
    /// The user's name.
    pub name: String,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for EtcdUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdUser")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// TLS to etcd ([`EtcdSettings::tls`]): PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificate.
    pub ca: std::path::PathBuf,
    /// This client's certificate and private key, for an etcd that asks for one
    /// (`--client-cert-auth`); `None`: none.
    pub identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Default for EtcdSettings {
    fn default() -> EtcdSettings {
        EtcdSettings {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            prefix: "/gpu-rdma".into(),
            lease_ttl: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            auth: Auth::FromEnvironment,
            user: None,
            tls: None,
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
        let signing = Signing::new(Credentials::load(&settings.auth.resolve()?, None)?);
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(settings.timeout)
            .with_timeout(settings.timeout)
            .with_keep_alive(settings.timeout, settings.timeout)
            .with_keep_alive_while_idle(true);
        if let Some(u) = access::user(&settings)? {
            opts = opts.with_user(u.name, u.password);
        }
        if let Some(tls) = access::tls(&settings)? {
            opts = opts.with_tls(tls);
        }
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
                signing,
                refused_values: AtomicU64::new(0),
            }),
            runtime: Some(runtime),
        })
    }

    /// How many values read from etcd were refused since it started: unsigned, signed with
    /// another key, moved from another key, or not readable (another format version).
    pub fn refused_values(&self) -> u64 {
        self.inner.refused_values.load(Ordering::Relaxed)
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
    /// Looked-up peers are watched: the backend's cache follows etcd.
    fn follows_peers(&self) -> bool {
        true
    }

    /// Publishes `descriptor` under the agent's lease. The first call grants the lease,
    /// creates the agent record (refused with [`Error::AgentExists`] while a live record of
    /// another incarnation holds the name) and starts the lease's renewal; later calls put
    /// new or changed segments and delete removed ones. While etcd is lost a later call
    /// only records the descriptor, which is published when etcd answers again.
    ///
    /// # Errors
    /// [`Error::Settings`] for an agent name etcd cannot key, an unspecified control
    /// address, or another agent than this backend's; the first call's failures (see
    /// above); and [`Error::MetadataRefused`] when etcd refuses a later call's request itself (a
    /// value past its request size limit, `--max-request-bytes`, 1.5 MiB by default): the
    /// published state is then left as it was before the call.
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
            let before = std::mem::replace(&mut mine.segments, d.segments);
            if first {
                if let Err(e) = inner.establish(&mut mine).await {
                    *mine = Mine::default();
                    return Err(e);
                }
            } else if mine.lease.is_some() {
                match inner.sync(&mut mine).await {
                    Ok(()) => {}
                    Err(Failure::Lost) => lost(&inner, &mut mine),
                    Err(Failure::Refused(e)) => {
                        // etcd answered: the lease is fine. Back to what was published
                        // before, undoing what this call already put.
                        mine.segments = before;
                        if let Err(Failure::Lost) = inner.sync(&mut mine).await {
                            lost(&inner, &mut mine);
                        }
                        return Err(e);
                    }
                }
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

/// etcd lost during a publication: the renewal task publishes everything again under a new
/// lease once it answers.
fn lost(inner: &Inner, mine: &mut Mine) {
    mine.orphan = mine.lease.take();
    *lock(&inner.lease) = None;
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
