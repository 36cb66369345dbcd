//! [`Auth`]: how agents prove to each other that they belong to the cluster, before any
//! control request is served (docs/engine.md, "Security").

mod handshake;
mod key;

pub(crate) use handshake::{accept, connect, Refusal, MAX_HANDSHAKE_FRAME};
pub use key::{ClusterKey, MIN_KEY_BYTES};

use crate::error::{Error, Result};

/// The environment variable naming a cluster key file ([`ClusterKey::from_file`]), read by
/// [`Auth::FromEnvironment`].
pub const CLUSTER_KEY_ENV: &str = "GPU_RDMA_CLUSTER_KEY_FILE";

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
    /// ([`CLUSTER_KEY_ENV`]); or no authentication when `GPU_RDMA_INSECURE_NO_AUTH=1`
    /// ([`INSECURE_ENV`]); with neither (or both), the agent refuses to start. The
    /// default, so that programs that cannot pass settings (the Python package's users, the
    /// Mooncake and NIXL drop-ins) are configured by their environment.
    #[default]
    FromEnvironment,
    /// A shared cluster key: both sides of every connection prove they hold it (a
    /// challenge-response over fresh random challenges; the key is never sent), and every
    /// later frame is sealed (ChaCha20-Poly1305, keys derived per connection) so that it can
    /// be neither read, changed, replayed nor injected. Anyone who holds the key is an
    /// agent of the cluster and may take any agent name.
    ClusterKey(ClusterKey),
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
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        match (var(CLUSTER_KEY_ENV), var(INSECURE_ENV)) {
            (Some(_), Some(_)) => Err(Error::Settings(format!(
                "both {CLUSTER_KEY_ENV} and {INSECURE_ENV} are set: set one"
            ))),
            (Some(path), None) => Ok(Auth::ClusterKey(ClusterKey::from_file(path)?)),
            (None, Some(v)) if v == "1" => Ok(Auth::InsecureNoAuthentication),
            (None, Some(v)) => Err(Error::Settings(format!(
                "{INSECURE_ENV}={}: only 1 turns authentication off",
                v.to_string_lossy()
            ))),
            (None, None) => Err(Error::Settings(format!(
                "no authentication configured: an agent serves its segments' memory only to \
                 agents of its cluster. Make a key once per cluster \
                 (`(umask 077; openssl rand -hex 32 > cluster.key)`), give every agent the \
                 file ({CLUSTER_KEY_ENV}=/path/to/cluster.key, or Settings::auth = \
                 Auth::ClusterKey(ClusterKey::from_file(..)?)); or, on a private test bench \
                 only, {INSECURE_ENV}=1 (docs/engine.md, \"Security\")"
            ))),
        }
    }

    /// The key, for a cluster key.
    pub(crate) fn key(&self) -> Option<&ClusterKey> {
        match self {
            Auth::ClusterKey(k) => Some(k),
            _ => None,
        }
    }
}
