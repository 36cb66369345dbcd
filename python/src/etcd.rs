//! The metadata service an `Agent` starts with: the embedded one, a server of Mooncake's
//! HTTP metadata protocol, or etcd (with the cargo feature `etcd`).

use crate::errors::{Class, Failure, Result};
use gpu_rdma_engine::{Agent, Settings};

/// Which metadata service, with its settings.
pub(crate) enum Metadata {
    Embedded,
    /// A server of Mooncake's HTTP metadata protocol, by URL.
    Http(String),
    #[cfg(feature = "etcd")]
    Etcd(Box<gpu_rdma_engine::EtcdSettings>),
}

impl Metadata {
    /// From `Agent(...)`'s keywords: etcd when `endpoints` is given, an HTTP metadata server
    /// when `http` is (not both).
    pub fn new(
        endpoints: Option<Vec<String>>,
        prefix: Option<String>,
        lease_ttl: Option<f64>,
        http: Option<String>,
    ) -> Result<Metadata> {
        if let Some(url) = http {
            if endpoints.is_some() || prefix.is_some() || lease_ttl.is_some() {
                return Err(Failure::new(
                    Class::InvalidInput,
                    "Agent",
                    "Agent: metadata_server and etcd name two metadata services: give one",
                ));
            }
            return Ok(Metadata::Http(url));
        }
        let Some(endpoints) = endpoints else {
            if prefix.is_some() || lease_ttl.is_some() {
                return Err(Failure::new(
                    Class::InvalidInput,
                    "Agent",
                    "Agent: etcd_prefix and etcd_lease_ttl need etcd=[endpoints]",
                ));
            }
            return Ok(Metadata::Embedded);
        };
        Metadata::etcd(endpoints, prefix, lease_ttl)
    }

    #[cfg(feature = "etcd")]
    fn etcd(
        endpoints: Vec<String>,
        prefix: Option<String>,
        lease_ttl: Option<f64>,
    ) -> Result<Metadata> {
        let mut s = gpu_rdma_engine::EtcdSettings {
            endpoints,
            ..Default::default()
        };
        if let Some(p) = prefix {
            s.prefix = p;
        }
        if let Some(t) = lease_ttl {
            s.lease_ttl = crate::transfer::bound("Agent", t)?;
        }
        Ok(Metadata::Etcd(Box::new(s)))
    }

    #[cfg(not(feature = "etcd"))]
    fn etcd(_: Vec<String>, _: Option<String>, _: Option<f64>) -> Result<Metadata> {
        Err(Failure::new(
            Class::Unsupported,
            "Agent",
            "Agent: this build of gpu_rdma has no etcd backend",
        )
        .hinted("build it with the cargo feature `etcd` (pip install ./python does)"))
    }

    /// Starts agent `name` with this service.
    pub fn start(self, name: &str, settings: Settings) -> gpu_rdma_engine::Result<Agent> {
        match self {
            Metadata::Embedded => Agent::new(name, settings),
            Metadata::Http(url) => {
                let m =
                    gpu_rdma_engine::HttpMetadata::new(&url, &settings.auth, settings.io_timeout)?;
                Agent::with_metadata(name, settings, std::sync::Arc::new(m))
            }
            #[cfg(feature = "etcd")]
            Metadata::Etcd(mut s) => {
                // The records are signed and checked as the agent authenticates.
                s.auth = settings.auth.clone();
                let m = gpu_rdma_engine::EtcdMetadata::new(*s)?;
                Agent::with_metadata(name, settings, std::sync::Arc::new(m))
            }
        }
    }
}
