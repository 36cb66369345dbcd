//! etcd, as the engine's etcd backend uses it: each endpoint takes a TCP connection and
//! answers etcd's status request, and a probe key under the prefix, on a short lease, is
//! written, read back and deleted. etcd's own access control comes from the environment as
//! the engine reads it when its settings carry none (`GPU_RDMA_ETCD_USER` and
//! `GPU_RDMA_ETCD_PASSWORD_FILE`; `GPU_RDMA_ETCD_CA`, `GPU_RDMA_ETCD_CERT`,
//! `GPU_RDMA_ETCD_KEY`). Without the cargo feature `etcd` only the TCP connection is tried.

use super::control::errno_text;
use crate::{Check, Status};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const SECTION: &str = "etcd";

/// etcd's default client port, for an endpoint that names none.
const DEFAULT_PORT: u16 = 2379;

/// `host:port` of an endpoint URL (`http://10.0.0.1:2379`, `https://etcd:2379/`,
/// `10.0.0.1`).
fn authority(url: &str) -> String {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .unwrap_or(url);
    let host = rest.split('/').next().unwrap_or_default();
    let has_port = match host.rfind(']') {
        Some(close) => host[close..].contains(':'),
        None => host.contains(':'),
    };
    if has_port {
        host.to_string()
    } else {
        format!("{host}:{DEFAULT_PORT}")
    }
}

/// Why a step failed, and its fix.
struct Failure {
    found: String,
    fix: String,
}

impl Failure {
    /// The failed check `name` of this section.
    fn check(self, name: String) -> Check {
        Check {
            section: SECTION,
            name,
            status: Status::Fail,
            found: self.found,
            fix: Some(self.fix),
            problem: None,
        }
    }
}

/// A TCP connection to the endpoint `url`, within `timeout` per address: the address it
/// reached, or why none.
fn connect(url: &str, timeout: Duration) -> Result<SocketAddr, Failure> {
    let authority = authority(url);
    let failure = |found| Failure {
        found,
        fix: start_etcd(url),
    };
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| failure(format!("cannot resolve {authority}: {e}")))?
        .collect();
    let mut why = format!("{authority} resolves to no address");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(_) => return Ok(a),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                why = format!("nothing answers at {a}: no answer in {timeout:?}")
            }
            Err(e) => why = format!("nothing answers at {a}: {}", errno_text(&e)),
        }
    }
    Err(failure(why))
}

/// The fix for an endpoint that takes no connection.
fn start_etcd(url: &str) -> String {
    format!(
        "is etcd running, and is this its client URL? Start it with `etcd \
         --listen-client-urls {url} --advertise-client-urls {url}`, or give the URL it listens \
         on with --etcd"
    )
}

/// The checks of etcd at `endpoints` and of writing under `prefix`, every request bounded
/// by `timeout`.
pub(super) fn checks(endpoints: &[String], prefix: &str, timeout: Duration) -> Vec<Check> {
    let mut out = Vec::new();
    let mut answering = Vec::new();
    for url in endpoints {
        let name = format!("etcd {url}");
        let t0 = Instant::now();
        let reached = connect(url, timeout).and_then(|addr| {
            probe::status(url, addr, timeout)
                .map(|s| format!("{s} at {addr} in {} ms", t0.elapsed().as_millis()))
        });
        match reached {
            Ok(found) => {
                answering.push(url.clone());
                out.push(Check::ok(SECTION, name, found));
            }
            Err(f) => out.push(f.check(name)),
        }
    }
    if answering.is_empty() {
        return out;
    }
    // The backend's client spreads its requests over every endpoint: one that is down costs
    // nothing while another answers.
    for c in &mut out {
        if c.status == Status::Fail {
            c.status = Status::Warn;
            c.found
                .push_str(": the agent's requests go to the endpoints that answer");
        }
    }
    out.push(probe::writable(&answering, prefix, timeout));
    out
}

#[cfg(feature = "etcd")]
mod probe {
    //! etcd's status request and the probe key, over etcd-client on a small runtime.

    use super::{Failure, SECTION};
    use crate::Check;
    use etcd_client::{Certificate, Client, ConnectOptions, Identity, PutOptions, TlsOptions};
    use std::future::Future;
    use std::net::SocketAddr;
    use std::time::{Duration, Instant};

    /// The probe key's lease: long enough for the probe, short enough that a probe key
    /// left by a doctor that was killed vanishes soon.
    const PROBE_TTL: i64 = 10;

    // gRPC status codes.
    const INVALID_ARGUMENT: i32 = 3;
    const PERMISSION_DENIED: i32 = 7;
    const UNAUTHENTICATED: i32 = 16;

    /// Environment variable `name`, unset or empty: `None`.
    fn var(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }

    /// The client's options as the engine makes them from the environment.
    fn options(timeout: Duration) -> Result<ConnectOptions, String> {
        let mut o = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        if let Some(user) = var("GPU_RDMA_ETCD_USER") {
            let file = var("GPU_RDMA_ETCD_PASSWORD_FILE").ok_or_else(|| {
                format!("GPU_RDMA_ETCD_USER={user} without GPU_RDMA_ETCD_PASSWORD_FILE")
            })?;
            let password = std::fs::read_to_string(&file)
                .map_err(|e| format!("GPU_RDMA_ETCD_PASSWORD_FILE={file}: {e}"))?;
            o = o.with_user(user, password.trim_end_matches(['\n', '\r']));
        }
        if let Some(ca) = var("GPU_RDMA_ETCD_CA") {
            let read = |p: &str| std::fs::read(p).map_err(|e| format!("{p}: {e}"));
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(&ca)?));
            match (var("GPU_RDMA_ETCD_CERT"), var("GPU_RDMA_ETCD_KEY")) {
                (Some(c), Some(k)) => tls = tls.identity(Identity::from_pem(read(&c)?, read(&k)?)),
                (None, None) => {}
                _ => {
                    return Err(
                        "GPU_RDMA_ETCD_CERT and GPU_RDMA_ETCD_KEY: set both or neither".into(),
                    )
                }
            }
            o = o.with_tls(tls);
        }
        Ok(o)
    }

    /// The fix for etcd not answering within `bound`.
    fn no_answer(bound: Duration) -> String {
        format!(
            "etcd did not answer in {bound:?}: is it overloaded or without a leader (`etcdctl \
             endpoint status`)?"
        )
    }

    /// The fix for etcd's answer `e` to a request under `prefix`.
    fn fix_for(e: &etcd_client::Error, prefix: &str, timeout: Duration) -> String {
        let (code, message) = match e {
            etcd_client::Error::GRpcStatus(s) => (i32::from(s.code()), s.message().to_lowercase()),
            other => (0, other.to_string().to_lowercase()),
        };
        if code == PERMISSION_DENIED || message.contains("permission denied") {
            format!(
                "etcd's access control refuses this user the prefix: `etcdctl role \
                 grant-permission <role> --prefix=true readwrite {prefix}/` and `etcdctl user \
                 grant-role <user> <role>`"
            )
        } else if code == UNAUTHENTICATED
            || message.contains("authentication")
            || message.contains("user name")
            || (code == INVALID_ARGUMENT && message.contains("password"))
        {
            "etcd has authentication enabled: set GPU_RDMA_ETCD_USER and \
             GPU_RDMA_ETCD_PASSWORD_FILE (a file holding the password) to a user allowed to \
             write the prefix"
                .into()
        } else if message.contains("no space") {
            "etcd's space quota is full: `etcdctl compact`, `etcdctl defrag`, then `etcdctl \
             alarm disarm`"
                .into()
        } else if message.contains("timed out")
            || message.contains("timeout expired")
            || message.contains("deadline")
        {
            no_answer(timeout)
        } else {
            "is this etcd's client URL (not a peer URL)? For TLS: an https:// URL and \
             GPU_RDMA_ETCD_CA (GPU_RDMA_ETCD_CERT and GPU_RDMA_ETCD_KEY for a client \
             certificate); see etcd's log for its side"
                .into()
        }
    }

    /// The fix for etcd settings in the environment that cannot be used.
    const SETTINGS_FIX: &str =
        "fix etcd's settings in the environment (docs/engine.md, \"The etcd backend\")";

    /// Runs `f` on a runtime of its own, bounded by `bound`.
    fn block_on<T>(
        bound: Duration,
        f: impl Future<Output = Result<T, Failure>>,
    ) -> Result<T, Failure> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Failure {
                found: format!("cannot start a runtime for etcd's client: {e}"),
                fix: "the doctor's process is short of threads or memory: see the error".into(),
            })?;
        let r = rt.block_on(async {
            tokio::time::timeout(bound, f).await.unwrap_or_else(|_| {
                Err(Failure {
                    found: format!("no answer in {bound:?}"),
                    fix: no_answer(bound),
                })
            })
        });
        rt.shutdown_background();
        r
    }

    /// `f`, bounded by `timeout`, its failure described as `what` plus the cause.
    async fn step<T>(
        what: &str,
        prefix: &str,
        timeout: Duration,
        f: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Failure> {
        match tokio::time::timeout(timeout, f).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Failure {
                found: format!("{what}: {e}"),
                fix: fix_for(&e, prefix, timeout),
            }),
            Err(_) => Err(Failure {
                found: format!("{what}: no answer in {timeout:?}"),
                fix: no_answer(timeout),
            }),
        }
    }

    /// etcd's status at `url` alone (which took a TCP connection at `addr`):
    /// `etcd 3.4.23 answers (leader 8e9e05c52164694d)`.
    pub(super) fn status(
        url: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<String, Failure> {
        let opts = options(timeout).map_err(|e| Failure {
            found: e,
            fix: SETTINGS_FIX.into(),
        })?;
        let url = url.to_string();
        let r = block_on(timeout * 3, async move {
            let mut c = step("connect", "", timeout, Client::connect([url], Some(opts))).await?;
            let s = step("status", "", timeout, c.status()).await?;
            Ok(format!(
                "etcd {} answers (leader {:x})",
                s.version(),
                s.leader()
            ))
        });
        r.map_err(|f| Failure {
            found: format!(
                "takes TCP connections at {addr}, but etcd does not answer: {}",
                f.found
            ),
            fix: f.fix,
        })
    }

    /// The probe key written, read back and deleted under `prefix`, through `endpoints`.
    pub(super) fn writable(endpoints: &[String], prefix: &str, timeout: Duration) -> Check {
        // The host's name as a key part: letters, digits, `.`, `-`, `_` (`(none)`: `none`).
        let host: String = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap_or_default()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
            .collect();
        let host = if host.is_empty() { "host".into() } else { host };
        let key = format!("{prefix}/doctor/{host}-{}", std::process::id());
        let name = format!("etcd writable under {prefix}");
        let t0 = Instant::now();
        let r = match options(timeout) {
            Err(e) => Err(Failure {
                found: e,
                fix: SETTINGS_FIX.into(),
            }),
            Ok(opts) => {
                let (endpoints, key, prefix) =
                    (endpoints.to_vec(), key.clone(), prefix.to_string());
                block_on(timeout * 8, probe(endpoints, opts, key, prefix, timeout))
            }
        };
        match r {
            Ok(ttl) => Check::ok(
                SECTION,
                name,
                format!(
                    "put {key} on a lease of {ttl} s, read it back and deleted it in {} ms",
                    t0.elapsed().as_millis()
                ),
            ),
            Err(f) => f.check(name),
        }
    }

    /// Grants a lease, puts `key` under it, reads it back, deletes it and revokes the lease
    /// (also after a failure): the lease's TTL.
    async fn probe(
        endpoints: Vec<String>,
        opts: ConnectOptions,
        key: String,
        prefix: String,
        timeout: Duration,
    ) -> Result<i64, Failure> {
        let (key, prefix) = (key.as_str(), prefix.as_str());
        let mut c = step(
            "connect",
            prefix,
            timeout,
            Client::connect(endpoints, Some(opts)),
        )
        .await?;
        let lease = step(
            "grant a lease",
            prefix,
            timeout,
            c.lease_grant(PROBE_TTL, None),
        )
        .await?;
        let value = format!("gpu-rdma-doctor probe {}", std::process::id());
        let r = async {
            let put = PutOptions::new().with_lease(lease.id());
            step(&format!("put {key}"), prefix, timeout, c.put(key, value.as_str(), Some(put))).await?;
            let got = step(&format!("get {key}"), prefix, timeout, c.get(key, None)).await?;
            if got.kvs().first().map(|kv| kv.value()) != Some(value.as_bytes()) {
                return Err(Failure {
                    found: format!("get {key}: not the value just put ({} keys read)", got.kvs().len()),
                    fix: "another writer changes this key: is a second doctor probing with this host name and process id?".into(),
                });
            }
            step(&format!("delete {key}"), prefix, timeout, c.delete(key, None)).await?;
            Ok(lease.ttl())
        }
        .await;
        let revoked = step(
            "revoke the lease",
            prefix,
            timeout,
            c.lease_revoke(lease.id()),
        )
        .await;
        let ttl = r?;
        revoked.map(|_| ttl)
    }
}

#[cfg(not(feature = "etcd"))]
mod probe {
    //! Without the cargo feature `etcd`: the TCP connection only.

    use super::{Failure, SECTION};
    use crate::{Check, Status};
    use std::net::SocketAddr;
    use std::time::Duration;

    const REBUILD: &str = "build the doctor with its `etcd` feature (`cargo install \
                           gpu-rdma-doctor --features etcd`; its build needs protoc)";

    pub(super) fn status(
        _url: &str,
        _addr: SocketAddr,
        _timeout: Duration,
    ) -> Result<String, Failure> {
        Ok(
            "takes TCP connections (etcd's answer not asked: built without the `etcd` feature)"
                .into(),
        )
    }

    pub(super) fn writable(_endpoints: &[String], prefix: &str, _timeout: Duration) -> Check {
        Check {
            section: SECTION,
            name: format!("etcd writable under {prefix}"),
            status: Status::Warn,
            found: "not checked: this doctor was built without its `etcd` feature".into(),
            fix: Some(REBUILD.into()),
            problem: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_url_gives_its_host_and_port() {
        assert_eq!(authority("http://10.0.0.1:2379"), "10.0.0.1:2379");
        assert_eq!(authority("https://etcd.example:2380/"), "etcd.example:2380");
        assert_eq!(authority("10.0.0.1"), "10.0.0.1:2379");
        assert_eq!(authority("http://[::1]:4001"), "[::1]:4001");
        assert_eq!(authority("http://[::1]"), "[::1]:2379");
    }

    #[test]
    fn a_port_where_nothing_listens_fails_naming_it_and_the_fix() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let t0 = Instant::now();
        let c = checks(
            std::slice::from_ref(&url),
            "/gpu-rdma",
            Duration::from_secs(2),
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(c.len(), 1, "{c:#?}");
        assert_eq!(c[0].status, Status::Fail);
        assert_eq!(c[0].name, format!("etcd {url}"));
        assert!(c[0].found.contains("ECONNREFUSED"), "{c:#?}");
        assert!(
            c[0].fix
                .as_deref()
                .unwrap_or("")
                .contains("is etcd running"),
            "{c:#?}"
        );
    }
}
