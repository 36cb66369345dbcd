//! Mooncake's HTTP metadata protocol: [`HttpMetadata`], a backend that keeps descriptors in
//! any server of it (Mooncake's own `mooncake.http_metadata_server`, unchanged, or ours,
//! [`MetadataServer`]), and the server.
//!
//! The protocol is a key-value store at one URL (`http://host:port/metadata`): `GET ?key=K`
//! answers the value (200) or 404, `PUT ?key=K` with the value as the body stores it (200),
//! `DELETE ?key=K` removes it (200, or 404). An agent's value is its control address and
//! descriptor, under `<prefix><agent>`, signed as etcd values are (`signed.rs`): the server
//! is trusted with nothing but availability.

mod server;

pub use server::MetadataServer;

use crate::auth::{Auth, Credentials};
use crate::codec::{Reader, Writer};
use crate::descriptor::AgentDescriptor;
use crate::error::{Error, Result};
use crate::metadata::{MetadataService, PeerRecord};
use crate::names::check_agent_name;
use crate::signed::Signing;
use std::net::SocketAddr;
use std::time::Duration;

/// The key prefix [`HttpMetadata::new`] uses: keys are `gpu-rdma/agents/<agent>`.
pub const HTTP_PREFIX: &str = "gpu-rdma/agents/";

/// The largest value this backend reads: a descriptor of many segments fits many times.
const MAX_VALUE: u64 = 64 << 20;

/// The first bytes of a stored record; the descriptor inside carries its format version.
const MAGIC: &[u8; 4] = b"GRH\0";

/// Descriptors kept in a server of Mooncake's HTTP metadata protocol (see the module).
///
/// The store has no leases: an agent that dies without [`MetadataService::withdraw`] (which
/// [`Agent`](crate::Agent)'s drop calls) leaves its record, and peers that look it up fail
/// to reach its control address ([`Error::Io`]) or its queue pairs ([`Error::PeerDown`]). A
/// look-up always asks the server (no watch): agents fetch a peer's record again when a
/// transfer finds it stale.
pub struct HttpMetadata {
    url: String,
    prefix: String,
    http: ureq::Agent,
    signing: Signing,
}

impl std::fmt::Debug for HttpMetadata {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpMetadata")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("signing", &self.signing)
            .finish()
    }
}

impl HttpMetadata {
    /// A backend over the server at `url` (`http://host:port/metadata`, as Mooncake names
    /// it), keys under [`HTTP_PREFIX`]; values are signed and checked with `auth`'s
    /// credentials ([`Auth::FromEnvironment`] is read here). `timeout` bounds each request.
    ///
    /// # Errors
    /// [`Error::Settings`] for a URL that is not `http://`; [`Auth::resolve`]'s. Nothing is
    /// asked of the server here.
    pub fn new(url: &str, auth: &Auth, timeout: Duration) -> Result<HttpMetadata> {
        HttpMetadata::with_prefix(url, HTTP_PREFIX, auth, timeout)
    }

    /// As [`HttpMetadata::new`], with keys under `prefix` (several clusters in one server).
    ///
    /// # Errors
    /// As [`HttpMetadata::new`].
    pub fn with_prefix(
        url: &str,
        prefix: &str,
        auth: &Auth,
        timeout: Duration,
    ) -> Result<HttpMetadata> {
        if !url.starts_with("http://") {
            return Err(Error::Settings(format!(
                "HTTP metadata server {url:?}: an http:// URL, such as \
                 \"http://10.0.0.1:8080/metadata\""
            )));
        }
        let signing = Signing::new(Credentials::load(&auth.resolve()?, None)?);
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .build();
        Ok(HttpMetadata {
            url: url.into(),
            prefix: prefix.into(),
            http: config.into(),
            signing,
        })
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn key(&self, agent: &str) -> Result<String> {
        check_agent_name(agent)?;
        // Servers trim keys (Mooncake's does, ours too): "x " would be "x"'s key.
        if agent.trim() != agent {
            return Err(Error::Settings(format!(
                "agent name {agent:?}: the HTTP metadata backend needs a name without leading \
                 or trailing whitespace (its server trims keys)"
            )));
        }
        Ok(format!("{}{agent}", self.prefix))
    }

    fn failed(&self, op: &'static str, e: impl std::fmt::Display) -> Error {
        Error::Metadata {
            op,
            detail: format!("{}: {e}", self.url),
        }
    }

    /// A status other than `ok` as the engine's error.
    fn status(&self, op: &'static str, status: u16, body: &str) -> Error {
        let detail = format!("{}: HTTP {status}: {}", self.url, body.trim());
        if (400..500).contains(&status) {
            Error::MetadataRefused { op, detail }
        } else {
            Error::Metadata { op, detail }
        }
    }
}

/// The record stored for an agent: its control address and its descriptor.
fn encode(control: SocketAddr, descriptor: &AgentDescriptor) -> Vec<u8> {
    let mut w = Writer::default();
    w.raw(MAGIC)
        .str(&control.to_string())
        .bytes(&descriptor.to_bytes());
    w.0
}

fn decode(b: &[u8]) -> Result<PeerRecord> {
    let mut r = Reader::new(b);
    if r.raw(MAGIC.len())? != MAGIC {
        return Err(Error::Protocol("not an agent record of gpu-rdma".into()));
    }
    let control = r
        .str()?
        .parse()
        .map_err(|e| Error::Protocol(format!("agent record's control address: {e}")))?;
    let descriptor = AgentDescriptor::from_bytes(r.bytes()?)?;
    r.end()?;
    Ok(PeerRecord {
        descriptor,
        control,
    })
}

impl MetadataService for HttpMetadata {
    /// Puts the agent's record. An unspecified control address (`0.0.0.0`) is refused:
    /// peers could not reach it.
    fn publish(&self, descriptor: &AgentDescriptor, control: SocketAddr) -> Result<()> {
        const OP: &str = "publish to the HTTP metadata server";
        if control.ip().is_unspecified() {
            return Err(Error::Settings(format!(
                "control address {control}: with a metadata server, bind the agent to an \
                 address its peers reach (Settings::bind)"
            )));
        }
        let key = self.key(&descriptor.agent)?;
        let value = self
            .signing
            .seal(&key, &descriptor.agent, encode(control, descriptor))?;
        let mut resp = self
            .http
            .put(&self.url)
            .query("key", &key)
            .send(&value[..])
            .map_err(|e| self.failed(OP, e))?;
        match resp.status().as_u16() {
            200..=299 => Ok(()),
            s => Err(self.status(OP, s, &resp.body_mut().read_to_string().unwrap_or_default())),
        }
    }

    /// Deletes the agent's record (one already gone is fine).
    fn withdraw(&self, agent: &str) -> Result<()> {
        const OP: &str = "withdraw from the HTTP metadata server";
        let key = self.key(agent)?;
        let mut resp = self
            .http
            .delete(&self.url)
            .query("key", &key)
            .call()
            .map_err(|e| self.failed(OP, e))?;
        match resp.status().as_u16() {
            200..=299 | 404 => Ok(()),
            s => Err(self.status(OP, s, &resp.body_mut().read_to_string().unwrap_or_default())),
        }
    }

    /// Gets the agent's record and checks its signature, its format version and that it
    /// is `agent`'s.
    fn lookup(&self, agent: &str) -> Result<PeerRecord> {
        const OP: &str = "look up in the HTTP metadata server";
        let key = self.key(agent)?;
        let mut resp = self
            .http
            .get(&self.url)
            .query("key", &key)
            .call()
            .map_err(|e| self.failed(OP, e))?;
        let status = resp.status().as_u16();
        if status == 404 {
            return Err(Error::UnknownAgent(agent.into()));
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_VALUE)
            .read_to_vec()
            .map_err(|e| self.failed(OP, e))?;
        if !(200..=299).contains(&status) {
            return Err(self.status(OP, status, &String::from_utf8_lossy(&body)));
        }
        let record = decode(self.signing.open(&key, agent, &body)?)?;
        if record.descriptor.agent != agent {
            return Err(Error::Protocol(format!(
                "the record under {key:?} is agent {:?}'s",
                record.descriptor.agent
            )));
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests;
