//! The control listener: authenticates each connection, then answers the peer's requests
//! for the agent's descriptor and incarnation, makes the agent's side of its queue pairs,
//! and takes its notifications, within the agent's [`Limits`].
//!
//! One thread accepts and reads each new connection's hello (polling them, so that
//! connections that send nothing, or half a frame, cost no thread); then a thread of its own
//! runs the rest of the connection's handshake (a TLS or sealed handshake blocks), and hands
//! the authenticated connection to the serving threads ([`crate::serving`]): a fixed number
//! of them, [`Limits::serving_threads`], serve every peer and hold the queue pairs made over
//! each connection until it ends (the peer closed it or died). All are bounded: at most
//! [`Limits::handshakes`] connections wait for their hello and as many threads are in their
//! handshake (past either, the oldest is dropped; while dropped ones exit, up to twice as
//! many), and [`Limits::connections`] are authenticated, served by
//! [`Limits::serving_threads`] threads whatever their number.

use crate::auth::MAX_HANDSHAKE_FRAME;
use crate::channel::{Channel, Waits};
use crate::conns::{gauges, Conn, Conns};
use crate::error::{Error, Limit, Result};
use crate::limits::{Counters, Limits};
use crate::metadata::lock;
use crate::serving::{Entry, Lanes, Pool, Served};
use crate::shared::Shared;
use crate::wire::Reply;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::io::{ErrorKind as Io, Read};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A handshake thread's stack: it runs a handshake (TLS's included).
const STACK: usize = 256 << 10;

/// The running listener; dropping it stops it and ends every connection.
pub(crate) struct Server {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    conns: Conns,
    accept: Option<JoinHandle<()>>,
    /// The serving threads; stopped after the accepting one.
    pool: Option<Pool>,
}

impl Server {
    pub fn start(shared: Arc<Shared>, listener: TcpListener) -> Result<Server> {
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("read the address of", "the listener", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Conns = Arc::default();
        let pool = Pool::start(&shared)?;
        let (s, c, lanes) = (stop.clone(), conns.clone(), pool.lanes());
        let accept = std::thread::Builder::new()
            .name(format!("{}-listen", shared.name))
            .spawn(move || accept_loop(&shared, &listener, &s, &c, &lanes))
            .map_err(|e| Error::io("start the listener thread for", addr, e))?;
        Ok(Server {
            addr,
            stop,
            conns,
            accept: Some(accept),
            pool: Some(pool),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connections open now and the queue pairs held for them.
    pub fn gauges(&self) -> (u64, u64) {
        gauges(&self.conns)
    }

    /// [`Server::gauges`] for a thread that may outlive this borrow (the metrics endpoint).
    pub fn gauges_reader(&self) -> impl Fn() -> (u64, u64) + Send + 'static {
        let conns = self.conns.clone();
        move || gauges(&conns)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip([127, 0, 0, 1].into());
        }
        // A connection wakes the blocking accept, which then sees `stop`.
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for c in lock(&self.conns).conns.values() {
            let _ = c.stream.shutdown(Shutdown::Both);
        }
        // Joins the serving threads, which close what they hold.
        drop(self.pool.take());
    }
}

/// A connection accepted and not yet handed to a thread: its hello is read here, by the
/// accepting thread, so that connections that never send one cost no thread.
struct Pending {
    stream: TcpStream,
    /// What arrived of the hello frame so far.
    buf: Vec<u8>,
    since: Instant,
}

impl Pending {
    /// Reads what is there; `Some(true)` once the hello frame is whole, `None` when the
    /// connection ended or announced a frame larger than a hello.
    fn fill(&mut self) -> Option<bool> {
        let mut chunk = [0u8; 256];
        loop {
            match (&self.stream).read(&mut chunk) {
                Ok(0) => return None,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
                Err(e) if e.kind() == Io::WouldBlock => break,
                Err(e) if e.kind() == Io::Interrupted => {}
                Err(_) => return None,
            }
            if self.buf.len() > 4 + MAX_HANDSHAKE_FRAME {
                return None;
            }
        }
        let Some(n) = self.buf.get(..4) else {
            return Some(false);
        };
        let n = u32::from_le_bytes(n.try_into().expect("4 bytes")) as usize;
        if n > MAX_HANDSHAKE_FRAME || self.buf.len() > 4 + n {
            return None;
        }
        Some(self.buf.len() == 4 + n)
    }
}

fn accept_loop(
    shared: &Arc<Shared>,
    listener: &TcpListener,
    stop: &AtomicBool,
    conns: &Conns,
    lanes: &Arc<Lanes>,
) {
    let limits = shared.settings.limits;
    let counters = &shared.counters;
    let mut pending: Vec<Pending> = Vec::new();
    let mut ready: Vec<bool> = Vec::with_capacity(1); // the listener, then each hello
    let mut backoff: Option<Duration> = None;
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    while !stop.load(Ordering::SeqCst) {
        shared_pending(conns, pending.len());
        // Wait for a connection, a pending hello's bytes, or the oldest hello's deadline.
        let oldest = pending.iter().map(|p| p.since).min();
        let wait = oldest.map_or(Duration::from_secs(1), |t| {
            t.checked_add(limits.handshake_timeout)
                .map_or(Duration::from_secs(1), |d| {
                    d.saturating_duration_since(Instant::now())
                })
        });
        let wait = backoff.unwrap_or(wait).min(Duration::from_secs(1));
        let ms = u16::try_from(wait.as_millis()).unwrap_or(u16::MAX).max(1);
        let listen_flags = if backoff.is_some() {
            PollFlags::empty()
        } else {
            PollFlags::POLLIN
        };
        ready.clear();
        if pending.is_empty() {
            // Idle, once a second: no allocation (tests/tests/engine_alloc.rs counts them).
            let mut one = [PollFd::new(listener.as_fd(), listen_flags)];
            let _ = poll(&mut one, PollTimeout::from(ms));
            ready.push(one[0].any().unwrap_or(true));
        } else {
            let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(pending.len() + 1);
            fds.push(PollFd::new(listener.as_fd(), listen_flags));
            fds.extend(
                pending
                    .iter()
                    .map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)),
            );
            let _ = poll(&mut fds, PollTimeout::from(ms));
            ready.extend(fds.iter().map(|f| f.any().unwrap_or(true)));
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        backoff = None;
        // Hellos that arrived, connections that ended or lied, and deadlines passed (from
        // the last, so that `swap_remove` moves only entries already seen).
        for i in (0..pending.len()).rev() {
            let state = if ready[i + 1] {
                pending[i].fill()
            } else {
                Some(false)
            };
            let late = pending[i].since.elapsed() >= limits.handshake_timeout;
            match state {
                Some(true) => start_serving(shared, conns, lanes, pending.swap_remove(i)),
                Some(false) if !late => {}
                _ => {
                    pending.swap_remove(i);
                    Counters::bump(&counters.failed_handshakes);
                }
            }
        }
        if !ready[0] {
            continue;
        }
        loop {
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == Io::WouldBlock => break,
                Err(e) if e.kind() == Io::Interrupted => continue,
                Err(_) => {
                    // Out of file descriptors (EMFILE, ENFILE) or memory: the connection
                    // stays queued, so accepting again at once would spin. Back off.
                    Counters::bump(&counters.accept_errors);
                    backoff = Some(Duration::from_millis(100));
                    break;
                }
            };
            Counters::bump(&counters.accepted);
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            if pending.len() >= limits.handshakes as usize {
                // Make room by the oldest: a flood of connections that never authenticate
                // drops its own, while an honest hello comes within a round trip.
                let old = (0..pending.len()).min_by_key(|&i| pending[i].since);
                if let Some(old) = old {
                    pending.swap_remove(old);
                }
                Counters::bump(&counters.handshakes_dropped);
            }
            pending.push(Pending {
                stream,
                buf: Vec::new(),
                since: Instant::now(),
            });
        }
    }
}

/// Records how many connections wait for their hello (for [`Server::gauges`]).
fn shared_pending(conns: &Conns, n: usize) {
    lock(conns).pending = n;
}

/// Hands a connection whose hello arrived to a thread of its own, which runs the rest of
/// its handshake and then serves it. At most [`Limits::handshakes`] such threads are still
/// in their handshake: past it, the oldest is ended; and while ended ones have not exited,
/// at most twice as many threads are (past that, the new connection is dropped).
fn start_serving(shared: &Arc<Shared>, conns: &Conns, lanes: &Arc<Lanes>, p: Pending) {
    let limits = shared.settings.limits;
    if p.stream.set_nonblocking(false).is_err() {
        return;
    }
    let Ok(copy) = p.stream.try_clone() else {
        return;
    };
    let id = {
        let mut t = lock(conns);
        let limit = limits.handshakes as usize;
        // Threads still in a handshake, those already told to end included (until they
        // have): never more than twice the limit, however fast hellos come.
        let threads = t.conns.values().filter(|c| c.peer.is_none()).count();
        if threads >= 2 * limit {
            Counters::bump(&shared.counters.handshakes_dropped);
            return;
        }
        let live: Vec<u64> = t
            .conns
            .iter()
            .filter(|(_, c)| c.peer.is_none() && !c.ended)
            .map(|(&id, _)| id)
            .collect();
        // Make room by the oldest: an honest handshake is over in a round trip.
        for id in live.iter().take((live.len() + 1).saturating_sub(limit)) {
            if let Some(old) = t.conns.get_mut(id) {
                let _ = old.stream.shutdown(Shutdown::Both);
                old.ended = true;
            }
            Counters::bump(&shared.counters.handshakes_dropped);
        }
        t.next += 1;
        let id = t.next;
        let conn = Conn {
            stream: copy,
            peer: None,
            qps: 0,
            ended: false,
        };
        t.conns.insert(id, conn);
        id
    };
    let hello = p.buf[4..].to_vec();
    let since = p.since;
    let (shared, conns, lanes) = (shared.clone(), conns.clone(), lanes.clone());
    let spawned = std::thread::Builder::new()
        .name(format!("{}-peer", shared.name))
        .stack_size(STACK)
        .spawn({
            let conns = conns.clone();
            move || {
                // Out of the table however the connection ends, a panic's unwinding
                // included: a stale entry would count against the limits for good.
                let entry = Entry(conns.clone(), id);
                if let Some(ch) = authenticate(&shared, p.stream, hello, since, id, &conns) {
                    lanes.hand(Served::new(ch, entry));
                }
            }
        });
    if spawned.is_err() {
        lock(&conns).conns.remove(&id);
    }
}

/// Authenticates one connection and admits it within the limits: its channel, to be
/// served by a lane; `None` if it failed or was refused (the refusal answered).
fn authenticate(
    shared: &Shared,
    stream: TcpStream,
    hello: Vec<u8>,
    since: Instant,
    id: u64,
    conns: &Conns,
) -> Option<Channel> {
    let limits = shared.settings.limits;
    let counters = &shared.counters;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(shared.settings.io_timeout));
    keep_alive(&stream);
    // The whole handshake within its time from the connection's accept.
    let handshake = Waits {
        idle: Some(limits.handshake_timeout),
        frame: limits.handshake_timeout,
        until: since.checked_add(limits.handshake_timeout),
    };
    let creds = &shared.dialer.creds;
    let mut ch = match crate::auth::accept(stream, &hello, &shared.name, creds, handshake) {
        Ok(ch) => ch,
        Err(r) => {
            use crate::auth::Refusal as R;
            Counters::bump(match r {
                R::Unauthenticated => &counters.unauthenticated,
                R::BadProof => &counters.bad_proofs,
                R::Failed => &counters.failed_handshakes,
            });
            return None;
        }
    };
    Counters::bump(&counters.authenticated);
    if let Some((limit, detail)) = admit(conns, id, &ch.peer, &limits) {
        counters.refused(limit);
        // Answer its first request with the refusal, so that it reads why.
        let waits = Waits {
            idle: Some(shared.settings.io_timeout),
            frame: shared.settings.io_timeout,
            until: None,
        };
        if ch.recv(limits.request_bytes as usize, waits).is_ok() {
            let _ = ch.send(&Reply::Limited { limit, detail }.encode());
        }
        return None;
    }
    Some(ch)
}

/// Admits an authenticated connection within the limits, or says which one refuses it.
fn admit(conns: &Conns, id: u64, peer: &str, limits: &Limits) -> Option<(Limit, String)> {
    let mut t = lock(conns);
    let authenticated = t.conns.values().filter(|c| c.peer.is_some()).count();
    let of_peer = t
        .conns
        .values()
        .filter(|c| c.peer.as_deref() == Some(peer))
        .count();
    if authenticated >= limits.connections as usize {
        return Some((
            Limit::Connections,
            format!(
                "{authenticated} connections open (at most {})",
                limits.connections
            ),
        ));
    }
    if of_peer >= limits.connections_per_peer as usize {
        return Some((
            Limit::ConnectionsPerPeer,
            format!(
                "{of_peer} connections of {peer:?} open (at most {})",
                limits.connections_per_peer
            ),
        ));
    }
    if let Some(c) = t.conns.get_mut(&id) {
        c.peer = Some(peer.into());
    }
    None
}

/// Turns on TCP keep-alive with short probes, so that a connection whose peer died
/// (holding queue pairs, it has no idle timeout) ends within about two minutes.
fn keep_alive(s: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let _ = setsockopt(s, sockopt::KeepAlive, &true);
    let _ = setsockopt(s, sockopt::TcpKeepIdle, &60);
    let _ = setsockopt(s, sockopt::TcpKeepInterval, &10);
    let _ = setsockopt(s, sockopt::TcpKeepCount, &6);
}
