//! The optional HTTP endpoint of the metrics ([`Settings::metrics_address`](crate::Settings::metrics_address)):
//! `GET /metrics` answers the OpenMetrics text, anything else 404 or 405.
//!
//! One thread serves it, and everything it holds is bounded: it polls the listener and the
//! connections whose request has not all come yet (at most [`MAX_PENDING`], the oldest
//! dropped past that), each given [`IO`] to send at most [`MAX_REQUEST`] bytes of request
//! head; a whole request is answered at once, within [`IO`] to take the answer, and the
//! connection closed. So clients that send nothing neither hold a thread nor keep an honest
//! scrape waiting, one that reads nothing delays the next answer by [`IO`] at most, and
//! dropping the endpoint stops it within one poll or one answer. The thread keeps nothing
//! that keeps the agent's memory registered (the scrape closure holds it weakly).

use crate::error::{Error, Result};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::collections::VecDeque;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often, in milliseconds, the idle endpoint looks at the stop flag.
const POLL_MS: u16 = 50;
/// What one connection may take to send its request, and again to read its answer.
const IO: Duration = Duration::from_secs(2);
/// The longest request head read.
const MAX_REQUEST: usize = 8 << 10;
/// Connections whose request has not all come yet, at most (past it the oldest goes).
const MAX_PENDING: usize = 32;

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

/// A connection whose request head has not all come yet.
struct Pending {
    conn: TcpStream,
    head: Vec<u8>,
    since: Instant,
}

fn serve(
    listener: &TcpListener,
    stop: &AtomicBool,
    content_type: &str,
    scrape: &dyn Fn() -> Option<String>,
) {
    let mut pending: VecDeque<Pending> = VecDeque::new();
    while !stop.load(Ordering::Acquire) {
        let mut fds = Vec::with_capacity(pending.len() + 1);
        fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
        fds.extend(
            pending
                .iter()
                .map(|p| PollFd::new(p.conn.as_fd(), PollFlags::POLLIN)),
        );
        // Interrupted or failed: the loop looks again after the same pause.
        if poll(&mut fds, PollTimeout::from(POLL_MS)).is_err() {
            std::thread::sleep(Duration::from_millis(POLL_MS.into()));
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        // Heads that came whole are answered; connections that failed, sent too much, or
        // took longer than IO are dropped.
        let mut k = 0;
        pending.retain_mut(|p| {
            k += 1;
            if !ready[k] {
                return p.since.elapsed() < IO;
            }
            match take(p) {
                Some(true) => {
                    let _ = answer(&p.conn, &p.head, content_type, scrape);
                    false
                }
                Some(false) => p.since.elapsed() < IO,
                None => false,
            }
        });
        if ready[0] {
            accept(listener, &mut pending);
        }
    }
}

/// Accepts every connection waiting, as pending; past [`MAX_PENDING`], the oldest is
/// dropped to make room.
fn accept(listener: &TcpListener, pending: &mut VecDeque<Pending>) {
    // A connection that fails is the client's problem; out of file descriptors, say,
    // the loop tries again after its pause.
    while let Ok((conn, _)) = listener.accept() {
        if conn.set_nonblocking(true).is_err() {
            continue;
        }
        if pending.len() >= MAX_PENDING {
            pending.pop_front();
        }
        pending.push_back(Pending {
            conn,
            head: Vec::new(),
            since: Instant::now(),
        });
    }
}

/// Reads what `p`'s client sent: `Some(true)` when its head is whole, `Some(false)` when
/// more may come, `None` when the connection is to be dropped (closed, failed, too long).
fn take(p: &mut Pending) -> Option<bool> {
    let mut buf = [0u8; 1024];
    loop {
        match (&p.conn).read(&mut buf) {
            Ok(0) => return None,
            Ok(n) => p.head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if p.head.len() > MAX_REQUEST {
            return None;
        }
    }
    Some(p.head.windows(4).any(|w| w == b"\r\n\r\n"))
}

/// Answers the request whose head is `head` on `conn`, within [`IO`].
fn answer(
    mut conn: &TcpStream,
    head: &[u8],
    content_type: &str,
    scrape: &dyn Fn() -> Option<String>,
) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_write_timeout(Some(IO))?;
    let head = String::from_utf8_lossy(head);
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

impl Drop for Endpoint {
    /// Stops the thread: at once when idle, else after the connection it serves (bounded).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
