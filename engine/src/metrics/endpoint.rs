//! The optional HTTP endpoint of the metrics ([`Settings::metrics_address`](crate::Settings::metrics_address)):
//! `GET /metrics` answers the OpenMetrics text, anything else 404 or 405.
//!
//! One thread serves one connection at a time, and every step is bounded: the listener is
//! polled (so that dropping the endpoint stops it within [`POLL`]), and each connection has
//! [`IO`] to send its request (at most [`MAX_REQUEST`] bytes) and take the answer, then is
//! closed. A client that sends nothing, or reads nothing, costs the next scrape at most that
//! long and never holds the agent: the thread keeps no reference that keeps the agent's
//! memory registered (the scrape closure holds a weak one), and stopping it waits at most
//! one connection's bound.

use crate::error::{Error, Result};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the idle listener looks for a connection and for the stop flag.
const POLL: Duration = Duration::from_millis(50);
/// What one connection may take to send its request, and again to read its answer.
const IO: Duration = Duration::from_secs(2);
/// The longest request head read.
const MAX_REQUEST: usize = 8 << 10;

/// The running endpoint; dropping it stops it.
pub(crate) struct Endpoint {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    /// Serves `scrape()`'s text (`None`: the agent is gone, 503) at `addr`.
    pub fn start(
        agent: &str,
        addr: SocketAddr,
        content_type: &'static str,
        scrape: impl Fn() -> Option<String> + Send + 'static,
    ) -> Result<Endpoint> {
        let fail = |op, e| Error::io(op, addr, e);
        let listener = TcpListener::bind(addr).map_err(|e| fail("serve the metrics at", e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| fail("read the address of the metrics endpoint", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| fail("poll the metrics endpoint", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("{agent}-metrics"))
            .spawn(move || serve(&listener, &s, content_type, &scrape))
            .map_err(|e| fail("start the metrics thread of", e))?;
        Ok(Endpoint {
            addr: bound,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

fn serve(
    listener: &TcpListener,
    stop: &AtomicBool,
    content_type: &str,
    scrape: &dyn Fn() -> Option<String>,
) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            // A connection that fails is the client's problem; the next one is served.
            Ok((conn, _)) => {
                let _ = answer(conn, content_type, scrape);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
            // Out of file descriptors, say: back off as when idle.
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Reads one request head from `conn` and answers it, each within [`IO`].
fn answer(
    mut conn: TcpStream,
    content_type: &str,
    scrape: &dyn Fn() -> Option<String>,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_write_timeout(Some(IO))?;
    let head = read_head(&mut conn)?;
    let line = head.lines().next().unwrap_or("");
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics") => match scrape() {
            Some(text) => ("200 OK", content_type, text),
            None => (
                "503 Service Unavailable",
                "text/plain",
                "the agent is gone\n".into(),
            ),
        },
        (_, "/metrics") => ("405 Method Not Allowed", "text/plain", "use GET\n".into()),
        _ => (
            "404 Not Found",
            "text/plain",
            "the metrics are at GET /metrics\n".into(),
        ),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(reply.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}

/// The request's head (up to the blank line), as text; at most [`MAX_REQUEST`] bytes and
/// [`IO`] in all.
fn read_head(conn: &mut TcpStream) -> std::io::Result<String> {
    let deadline = Instant::now() + IO;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() >= MAX_REQUEST {
            return Err(ErrorKind::TimedOut.into());
        }
        conn.set_read_timeout(Some(left))?;
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

impl Drop for Endpoint {
    /// Stops the thread: at once when idle, else after the connection it serves (bounded).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
