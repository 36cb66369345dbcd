//! [`Auth`]: how agents prove to each other that they belong to the cluster, before any
//! control request is served (docs/engine.md, "Security").

mod handshake;
mod key;
#[cfg(test)]
pub(crate) mod test_pki;
mod tls;

pub(crate) use handshake::{accept, connect, Refusal, MAX_HANDSHAKE_FRAME};
pub use key::{ClusterKey, MIN_KEY_BYTES};
pub use tls::TlsFiles;
pub(crate) use tls::{names, Tls};

use crate::error::{Error, Result};

/// The environment variable naming a cluster key file ([`ClusterKey::from_file`]), read by
/// [`Auth::FromEnvironment`].
pub const CLUSTER_KEY_ENV: &str = "GPU_RDMA_CLUSTER_KEY_FILE";

/// The environment variables naming the PEM files of [`Auth::MutualTls`] (the cluster's CA,
/// this agent's certificate chain, its key), read by [`Auth::FromEnvironment`].
pub const TLS_ENV: [&str; 3] = ["GPU_RDMA_TLS_CA", "GPU_RDMA_TLS_CERT", "GPU_RDMA_TLS_KEY"];

/// The environment variable that turns authentication off when it is `1`
/// ([`Auth::InsecureNoAuthentication`]), read by [`Auth::FromEnvironment`].
pub const INSECURE_ENV: &str = "GPU_RDMA_INSECURE_NO_AUTH";

/// How an agent's control connections are authenticated ([`Settings::auth`](crate::Settings::auth)).
///
/// Every control connection, both ways, starts with a handshake: nothing (descriptors,
/// queue pairs, notifications) is served before it succeeds, and a notification's sender is
/// the name the connection was authenticated under, not a name the client writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Auth {
    /// Read when the agent starts: the cluster key file named by `GPU_RDMA_CLUSTER_KEY_FILE`
    /// ([`CLUSTER_KEY_ENV`]); or mutual TLS with the files named by `GPU_RDMA_TLS_CA`,
    /// `GPU_RDMA_TLS_CERT` and `GPU_RDMA_TLS_KEY` ([`TLS_ENV`]); or no authentication when
    /// `GPU_RDMA_INSECURE_NO_AUTH=1` ([`INSECURE_ENV`]); with none of them (or more than
    /// one), the agent refuses to start. The default, so that programs that cannot pass
    /// settings (the Python package's users, the Mooncake and NIXL drop-ins) are configured
    /// by their environment.
    #[default]
    FromEnvironment,
    /// A shared cluster key: both sides of every connection prove they hold it (a
    /// challenge-response over fresh random challenges; the key is never sent), and every
    /// later frame is sealed (ChaCha20-Poly1305, keys derived per connection) so that it can
    /// be neither read, changed, replayed nor injected. Anyone who holds the key is an
    /// agent of the cluster and may take any agent name.
    ClusterKey(ClusterKey),
    /// Mutual TLS under the cluster's certificate authority: each side presents a
    /// certificate the CA signed that names it (the agent's name as a DNS name), and checks
    /// the other's; the connection is TLS 1.3 from then on. Unlike a cluster key, an agent
    /// cannot take another's name: a notification's sender and an etcd value's writer are
    /// the names their certificates hold.
    MutualTls(TlsFiles),
    /// No authentication: **anyone who reaches the control port can read and write every
    /// byte of every registered segment**, and send notifications under any name. For a
    /// test bench on a private machine only; the agent prints a warning when it starts. An
    /// authenticated agent refuses to talk to an agent without authentication, both ways.
    InsecureNoAuthentication,
}

impl Auth {
    /// This setting with [`Auth::FromEnvironment`] read from the environment: never
    /// `FromEnvironment`.
    ///
    /// # Errors
    /// [`Error::Settings`]: neither variable set (with the two ways to set one), both set,
    /// `GPU_RDMA_INSECURE_NO_AUTH` set to anything but `1`, or the key file's error.
    pub fn resolve(&self) -> Result<Auth> {
        if *self != Auth::FromEnvironment {
            return Ok(self.clone());
        }
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let tls: Vec<_> = TLS_ENV.iter().map(|n| var(n)).collect();
        let tls = match tls.as_slice() {
            [Some(ca), Some(cert), Some(key)] => Some(TlsFiles {
                ca: ca.into(),
                cert: cert.into(),
                key: key.into(),
            }),
            [None, None, None] => None,
            _ => {
                return Err(Error::Settings(format!(
                    "mutual TLS needs all three of {}: some are unset",
                    TLS_ENV.join(", ")
                )))
            }
        };
        let key = var(CLUSTER_KEY_ENV);
        let insecure = var(INSECURE_ENV);
        let set = [key.is_some(), tls.is_some(), insecure.is_some()];
        if set.iter().filter(|s| **s).count() > 1 {
            return Err(Error::Settings(format!(
                "more than one of {CLUSTER_KEY_ENV}, {}, {INSECURE_ENV} is set: set one",
                TLS_ENV.join("/")
            )));
        }
        if let Some(path) = key {
            return Ok(Auth::ClusterKey(ClusterKey::from_file(path)?));
        }
        if let Some(files) = tls {
            return Ok(Auth::MutualTls(files));
        }
        match insecure {
            Some(v) if v == "1" => Ok(Auth::InsecureNoAuthentication),
            Some(v) => Err(Error::Settings(format!(
                "{INSECURE_ENV}={}: only 1 turns authentication off",
                v.to_string_lossy()
            ))),
            None => Err(Error::Settings(format!(
                "no authentication configured: an agent serves its segments' memory only to \
                 agents of its cluster. Make a key once per cluster \
                 (`(umask 077; openssl rand -hex 32 > cluster.key)`), give every agent the \
                 file ({CLUSTER_KEY_ENV}=/path/to/cluster.key, or Settings::auth = \
                 Auth::ClusterKey(ClusterKey::from_file(..)?)); or use the cluster's CA \
                 ({}); or, on a private test bench only, {INSECURE_ENV}=1 \
                 (docs/engine.md, \"Security\")",
                TLS_ENV.join(", ")
            ))),
        }
    }
}

/// What an agent proves itself with, loaded from a resolved [`Auth`].
#[derive(Debug)]
pub(crate) enum Credentials {
    None,
    Key(ClusterKey),
    Tls(Tls),
}

impl Credentials {
    /// Loads `auth` (resolved) for agent `me` (when known: with TLS, its certificate must
    /// name it).
    ///
    /// # Errors
    /// [`Error::Settings`]: [`Auth::FromEnvironment`] not resolved, or a TLS file's error.
    pub fn load(auth: &Auth, me: Option<&str>) -> Result<Credentials> {
        Ok(match auth {
            Auth::FromEnvironment => {
                return Err(Error::Settings("authentication not resolved".into()))
            }
            Auth::ClusterKey(k) => Credentials::Key(k.clone()),
            Auth::MutualTls(files) => {
                if let Some(me) = me {
                    tls::dns_name(me)?;
                }
                Credentials::Tls(Tls::load(files, me)?)
            }
            Auth::InsecureNoAuthentication => Credentials::None,
        })
    }
}
