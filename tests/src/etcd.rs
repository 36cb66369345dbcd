//! A private etcd for a test: Debian's `etcd` (package `etcd-server`, installed by the
//! testbed's setup), listening on 127.0.0.1 at free ports (or for clients on a given address
//! and port, for the other node), its data under the temporary directory; stopped and
//! removed on drop.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running (or stopped) etcd of one test.
#[derive(Debug)]
pub struct Etcd {
    child: Option<Child>,
    /// The data directory (kept across [`Etcd::stop`] and [`Etcd::start_again`]).
    pub dir: PathBuf,
    client_host: IpAddr,
    client_port: u16,
    peer_port: u16,
    /// With TLS: the server's certificate files (clients must present one of the same CA);
    /// health is then asked on a plain metrics port.
    tls: Option<(gpu_rdma_engine::TlsFiles, u16)>,
}

/// A port nobody listens on now.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("its address").port()
}

impl Etcd {
    /// Starts etcd in a new data directory and waits until it answers (at most 60 s: a
    /// guest under TCG is slow).
    ///
    /// # Panics
    /// If it does not start or answer.
    pub fn start(tag: &str) -> Etcd {
        Etcd::start_at(tag, IpAddr::V4(Ipv4Addr::LOCALHOST), free_port())
    }

    /// As [`Etcd::start`], serving clients on `host:port` (the node's address, for agents
    /// on the other node).
    ///
    /// # Panics
    /// If it does not start or answer.
    pub fn start_at(tag: &str, host: IpAddr, port: u16) -> Etcd {
        Etcd::start_with(tag, host, port, None)
    }

    fn start_with(
        tag: &str,
        host: IpAddr,
        port: u16,
        tls: Option<(gpu_rdma_engine::TlsFiles, u16)>,
    ) -> Etcd {
        let dir = std::env::temp_dir().join(format!("etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create etcd's directory");
        let mut e = Etcd {
            child: None,
            dir,
            client_host: host,
            client_port: port,
            peer_port: free_port(),
            tls,
        };
        e.start_again();
        e
    }

    /// As [`Etcd::start`], serving clients over TLS with `server`'s certificate (issued for
    /// 127.0.0.1) and asking each client for a certificate of the same CA
    /// (`--client-cert-auth`).
    ///
    /// # Panics
    /// If it does not start or answer.
    pub fn start_tls(tag: &str, server: gpu_rdma_engine::TlsFiles) -> Etcd {
        let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
        Etcd::start_with(tag, local, free_port(), Some((server, free_port())))
    }

    /// The client URL, for [`EtcdSettings::endpoints`](gpu_rdma_engine::EtcdSettings).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.client_host, self.client_port)
    }

    /// Starts etcd again on the same data directory and ports (after [`Etcd::stop`]).
    ///
    /// # Panics
    /// If it does not start or answer within 60 s.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "etcd is running");
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.with_extension("log"))
            .expect("etcd's log");
        let mut cmd = Command::new("etcd");
        if let Some((files, metrics)) = &self.tls {
            cmd.arg(format!("--cert-file={}", files.cert.display()))
                .arg(format!("--key-file={}", files.key.display()))
                .arg(format!("--trusted-ca-file={}", files.ca.display()))
                .arg("--client-cert-auth")
                .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"));
        }
        let child = cmd
            .arg("--name=test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={}", self.endpoint()))
            .arg(format!("--advertise-client-urls={}", self.endpoint()))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=test={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd (package etcd-server; cargo xtask setup installs it)");
        self.child = Some(child);
        let t0 = Instant::now();
        while !self.healthy() {
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "etcd exited with {st}; see {}",
                    self.dir.with_extension("log").display()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "etcd did not answer in 60 s; see {}",
                self.dir.with_extension("log").display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether etcd answers `/health` with `"health":"true"`.
    pub fn healthy(&self) -> bool {
        let port = self.tls.as_ref().map_or(self.client_port, |(_, m)| *m);
        let Ok(mut s) = TcpStream::connect((self.client_host, port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out.contains("\"health\":\"true\"")
    }

    /// Kills etcd (as a crash would) and waits for it; the data directory stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
        let _ = std::fs::remove_file(self.dir.with_extension("log"));
    }
}
