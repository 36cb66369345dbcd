//! Mooncake's own HTTP metadata server (`python3 -m mooncake.http_metadata_server`, from the
//! pinned wheel that `cargo xtask setup` and `cargo xtask test` unpack), started for a test
//! and stopped when dropped: the peer our `HttpMetadata` is checked against.

use dmabuf_testbed::wheels::MOONCAKE;
use dmabuf_testbed::Cache;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The folder the Mooncake wheel is unpacked in (the testbed's cache:
/// `$DMABUF_TESTBED_CACHE`, else the workspace's `target/testbed`).
pub fn wheel_dir() -> PathBuf {
    let cache = std::env::var_os(dmabuf_testbed::CACHE_ENV)
        .filter(|v| !v.is_empty())
        .map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/testbed"),
            PathBuf::from,
        );
    let dir = MOONCAKE.dir(&Cache::new(cache));
    assert!(
        dir.join("mooncake/http_metadata_server.py").is_file(),
        "{} has no Mooncake wheel: `cargo xtask setup` (or `cargo xtask test`) unpacks it",
        dir.display()
    );
    dir
}

/// Mooncake's server, running.
pub struct MooncakeServer {
    child: Child,
    addr: SocketAddr,
}

impl MooncakeServer {
    /// Starts it on `addr` and waits (at most a minute) until it accepts connections.
    pub fn start(addr: SocketAddr) -> MooncakeServer {
        let child = Command::new("/usr/bin/python3")
            .args([
                "-m",
                "mooncake.http_metadata_server",
                "--log-level",
                "WARNING",
            ])
            .arg("--host")
            .arg(addr.ip().to_string())
            .arg("--port")
            .arg(addr.port().to_string())
            .env("PYTHONPATH", wheel_dir())
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null())
            .spawn()
            .expect("start python3 -m mooncake.http_metadata_server");
        let mut server = MooncakeServer { child, addr };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err() {
            if let Ok(Some(s)) = server.child.try_wait() {
                panic!("Mooncake's HTTP metadata server exited: {s}");
            }
            assert!(
                Instant::now() < deadline,
                "Mooncake's server never listened"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server.child.try_wait().expect("try_wait");
        server
    }

    /// `http://<addr>/metadata`.
    pub fn url(&self) -> String {
        format!("http://{}/metadata", self.addr)
    }
}

impl Drop for MooncakeServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
