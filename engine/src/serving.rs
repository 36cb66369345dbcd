//! The control listener's serving threads: a fixed number of them
//! ([`Limits::serving_threads`]) serve every authenticated connection, so that the threads an
//! agent holds do not grow with its peers. Each thread (a lane) polls its share of the
//! connections and answers one request at a time: a peer's requests are small (a descriptor,
//! an incarnation, a queue pair to make, a notification) and each waits for its reply, so
//! one thread serves many peers. A connection goes to the lane that holds the fewest; its
//! queue pairs live as long as it does, in that lane.
//!
//! A request is read once its first byte has arrived, and read whole within the agent's
//! `io_timeout`: a peer that sends half a frame holds its lane up to that long (it is
//! authenticated, and the connection is closed after). A lane wakes only for a request, a
//! connection handed to it, the nearest idle deadline of a connection without queue pairs,
//! or the listener's end; it allocates only when it has connections to poll.

use crate::batch::{Notification, MAX_NOTIFICATION};
use crate::channel::{Channel, TooLarge, Waits};
use crate::conns::Conns;
use crate::error::{Error, Limit, Result};
use crate::limits::{Counters, Limits};
use crate::metadata::lock;
use crate::shared::Shared;
use crate::wire::{Reply, Request};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use rdma_dmabuf::{Endpoint, QueuePair};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A lane's stack: it decodes small requests and makes queue pairs.
const STACK: usize = 256 << 10;

/// A connection's place in the listener's table, removed when it ends.
pub(crate) struct Entry(pub Conns, pub u64);

impl Drop for Entry {
    fn drop(&mut self) {
        lock(&self.0).conns.remove(&self.1);
    }
}

/// An authenticated connection and the queue pairs made over it.
pub(crate) struct Served {
    ch: Channel,
    qps: Vec<QueuePair>,
    /// When its last request was answered (or it was admitted).
    last: Instant,
    /// Last: out of the table once its queue pairs are destroyed.
    entry: Entry,
}

impl Served {
    /// Connection `entry`, admitted, over `ch`.
    pub fn new(ch: Channel, entry: Entry) -> Served {
        Served {
            ch,
            qps: Vec::new(),
            last: Instant::now(),
            entry,
        }
    }

    /// When it is closed for silence: only while it holds no queue pair (closing one that
    /// does would tear down its peer's rails; TCP keep-alive ends a dead peer's).
    fn idle_deadline(&self, limits: &Limits) -> Option<Instant> {
        if self.qps.is_empty() {
            self.last.checked_add(limits.idle_timeout)
        } else {
            None
        }
    }
}

/// One serving thread's inbox: connections handed to it and not yet polled.
struct Lane {
    inbox: Mutex<Vec<Served>>,
    /// Connections it holds (its inbox's included).
    load: AtomicUsize,
    /// Written to wake it (a byte per wake; the lane drains them).
    wake: UnixStream,
}

/// The lanes, shared by the threads that hand connections to them.
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    stop: AtomicBool,
}

impl Lanes {
    /// Hands `s` to the lane that holds the fewest connections (dropped, so closed, once the
    /// listener is stopping).
    pub fn hand(&self, s: Served) {
        if self.stop.load(Ordering::SeqCst) {
            return;
        }
        let Some(lane) = self
            .lanes
            .iter()
            .min_by_key(|l| l.load.load(Ordering::SeqCst))
        else {
            return;
        };
        lane.load.fetch_add(1, Ordering::SeqCst);
        lock(&lane.inbox).push(s);
        let _ = (&lane.wake).write(&[1]);
    }
}

/// The running lanes; dropping them stops them, closing every connection they hold.
pub(crate) struct Pool {
    lanes: Arc<Lanes>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    /// Starts [`Limits::serving_threads`] lanes for `shared`'s listener.
    pub fn start(shared: &Arc<Shared>) -> Result<Pool> {
        let n = shared.settings.limits.serving_threads as usize;
        let mut lanes = Vec::with_capacity(n);
        let mut wakes = Vec::with_capacity(n);
        for _ in 0..n {
            let (wake, woken) = UnixStream::pair()
                .map_err(|e| Error::io("make the wake-up pair of", "a serving thread", e))?;
            for end in [&wake, &woken] {
                end.set_nonblocking(true)
                    .map_err(|e| Error::io("make non-blocking", "a serving thread's wake-up", e))?;
            }
            lanes.push(Lane {
                inbox: Mutex::new(Vec::new()),
                load: AtomicUsize::new(0),
                wake,
            });
            wakes.push(woken);
        }
        let lanes = Arc::new(Lanes {
            lanes,
            stop: AtomicBool::new(false),
        });
        let mut pool = Pool {
            lanes: lanes.clone(),
            threads: Vec::with_capacity(n),
        };
        for (i, woken) in wakes.into_iter().enumerate() {
            let (shared, lanes) = (shared.clone(), lanes.clone());
            let t = std::thread::Builder::new()
                .name(format!("{}-serve{i}", shared.name))
                .stack_size(STACK)
                .spawn(move || run(&shared, &lanes, i, &woken))
                .map_err(|e| Error::io("start", "a serving thread", e))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// The lanes, for the threads that hand connections to them.
    pub fn lanes(&self) -> Arc<Lanes> {
        self.lanes.clone()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.lanes.stop.store(true, Ordering::SeqCst);
        for lane in &self.lanes.lanes {
            let _ = (&lane.wake).write(&[1]);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Lane `i`'s loop: takes what was handed to it, polls its connections and its wake-up,
/// serves each connection that has a request, closes those that ended or stayed silent.
fn run(shared: &Shared, lanes: &Lanes, i: usize, woken: &UnixStream) {
    let lane = &lanes.lanes[i];
    let limits = shared.settings.limits;
    let mut held: Vec<Served> = Vec::new();
    let mut ready: Vec<bool> = Vec::new();
    while !lanes.stop.load(Ordering::SeqCst) {
        held.append(&mut lock(&lane.inbox));
        let now = Instant::now();
        let mut k = 0;
        while k < held.len() {
            if held[k].idle_deadline(&limits).is_some_and(|d| d <= now) {
                // Counted before it is closed: its peer may look as soon as it sees the end.
                Counters::bump(&shared.counters.idle_closed);
                held.swap_remove(k);
            } else {
                k += 1;
            }
        }
        // No timeout but the nearest idle deadline: a lane whose connections all hold
        // queue pairs sleeps until a request or a wake-up.
        let timeout = held
            .iter()
            .filter_map(|s| s.idle_deadline(&limits))
            .min()
            .map_or(PollTimeout::NONE, |d| {
                let ms = d.saturating_duration_since(now).as_millis().max(1);
                PollTimeout::try_from(ms.min(60_000) as u32).unwrap_or(PollTimeout::MAX)
            });
        // Requests already inside a channel (TLS) are served without waiting for the
        // socket.
        ready.clear();
        ready.extend(held.iter_mut().map(|s| s.ch.buffered()));
        let timeout = if ready.contains(&true) {
            PollTimeout::ZERO
        } else {
            timeout
        };
        if held.is_empty() {
            let mut one = [PollFd::new(woken.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut one, timeout);
        } else {
            let mut fds = Vec::with_capacity(held.len() + 1);
            fds.push(PollFd::new(woken.as_fd(), PollFlags::POLLIN));
            fds.extend(
                held.iter()
                    .map(|s| PollFd::new(s.ch.fd(), PollFlags::POLLIN)),
            );
            let _ = poll(&mut fds, timeout);
            for (r, f) in ready.iter_mut().zip(&fds[1..]) {
                *r |= f.any().unwrap_or(true);
            }
        }
        drain(woken);
        // From the last, so that `swap_remove` moves only connections already seen.
        for k in (0..ready.len()).rev() {
            if !ready[k] {
                continue;
            }
            let keep =
                catch_unwind(AssertUnwindSafe(|| serve_one(shared, &mut held[k]))).unwrap_or(false);
            if !keep {
                held.swap_remove(k);
            }
        }
        lane.load
            .store(held.len() + lock(&lane.inbox).len(), Ordering::SeqCst);
    }
}

/// Reads every byte of wake-ups written so far.
fn drain(woken: &UnixStream) {
    let mut b = [0u8; 64];
    while matches!((&*woken).read(&mut b), Ok(n) if n > 0) {}
}

/// Reads and answers one request of `s`, which has bytes (or its end) to read; whether to
/// keep serving it.
fn serve_one(shared: &Shared, s: &mut Served) -> bool {
    let limits = shared.settings.limits;
    let waits = Waits {
        idle: Some(shared.settings.io_timeout),
        frame: shared.settings.io_timeout,
        until: None,
    };
    let frame = match s.ch.recv(limits.request_bytes as usize, waits) {
        Ok(f) => f,
        Err(e) if TooLarge::is(&e) => {
            shared.counters.refused(Limit::RequestBytes);
            let detail = format!("{e}: the connection is closed");
            let reply = Reply::Limited {
                limit: Limit::RequestBytes,
                detail,
            };
            let _ = s.ch.send(&reply.encode());
            return false;
        }
        // Timed out mid-frame, ended, or a frame that does not open: closed.
        Err(_) => return false,
    };
    let reply = match Request::decode(&frame) {
        Ok(req) => answer(shared, s, req),
        Err(e) => Reply::Refused(e.to_string()),
    };
    s.last = Instant::now();
    s.ch.send(&reply.encode()).is_ok()
}

fn answer(shared: &Shared, s: &mut Served, req: Request) -> Reply {
    let (conns, id) = (&s.entry.0, s.entry.1);
    match req {
        Request::Describe => Reply::Descriptor(shared.descriptor().to_bytes()),
        Request::Check => Reply::Incarnation(shared.incarnation),
        Request::Connect { device, endpoint } => {
            let here = s.qps.len();
            if let Some((limit, detail)) = reserve_qp(shared, conns, id, &s.ch.peer, here) {
                shared.counters.refused(limit);
                return Reply::Limited { limit, detail };
            }
            let reply = match accept_qp(shared, device, &endpoint) {
                Ok((qp, mine)) => {
                    s.qps.push(qp);
                    Reply::Connected(mine)
                }
                Err(e) => Reply::Refused(e.to_string()),
            };
            // The reservation becomes the count (one more, or none if refused).
            set_qps(conns, id, s.qps.len());
            reply
        }
        Request::Notify { message } if message.len() <= MAX_NOTIFICATION => {
            let n = Notification {
                from: s.ch.peer.clone(),
                message,
            };
            match shared.inbox.deliver(n) {
                Ok(()) => Reply::Noted,
                Err(limit) => {
                    shared.counters.refused(limit);
                    let l = &shared.settings.limits;
                    let detail = match limit {
                        Limit::NotificationsPerSender => format!(
                            "{} notifications of {:?} queued and not taken",
                            l.notifications_per_sender, s.ch.peer
                        ),
                        _ => format!("{} notifications queued and not taken", l.notifications),
                    };
                    Reply::Limited { limit, detail }
                }
            }
        }
        Request::Notify { message } => {
            Reply::Refused(Error::NotificationTooLong(message.len()).to_string())
        }
        Request::Release { qpns } => {
            let before = s.qps.len();
            s.qps.retain(|q| !qpns.contains(&q.endpoint().qpn));
            set_qps(conns, id, s.qps.len());
            Reply::Released((before - s.qps.len()) as u32)
        }
    }
}

/// Reserves one more queue pair for connection `id` (holding `here`) if it fits the
/// connection's, its peer's and the agent's bounds, all under one lock (so concurrent
/// requests on a peer's connections cannot pass a bound together); else which bound.
fn reserve_qp(
    shared: &Shared,
    conns: &Conns,
    id: u64,
    peer: &str,
    here: usize,
) -> Option<(Limit, String)> {
    let l = &shared.settings.limits;
    if here >= l.queue_pairs_per_connection as usize {
        return Some((
            Limit::QueuePairsPerConnection,
            format!(
                "{here} queue pairs on this connection (at most {})",
                l.queue_pairs_per_connection
            ),
        ));
    }
    let mut t = lock(conns);
    let of_peer = t.peer_qps(peer);
    if of_peer >= l.queue_pairs_per_peer {
        return Some((
            Limit::QueuePairsPerPeer,
            format!(
                "{of_peer} queue pairs of {peer:?} (at most {})",
                l.queue_pairs_per_peer
            ),
        ));
    }
    let all: u32 = t.conns.values().map(|c| c.qps).sum();
    if all >= l.queue_pairs {
        return Some((
            Limit::QueuePairs,
            format!(
                "{all} queue pairs held for peers (at most {})",
                l.queue_pairs
            ),
        ));
    }
    if let Some(c) = t.conns.get_mut(&id) {
        c.qps += 1;
    }
    None
}

fn set_qps(conns: &Conns, id: u64, n: usize) {
    if let Some(c) = lock(conns).conns.get_mut(&id) {
        c.qps = n as u32;
    }
}

/// This agent's queue pair on `device`, connected to the peer's `endpoint`.
fn accept_qp(shared: &Shared, device: u16, endpoint: &Endpoint) -> Result<(QueuePair, Endpoint)> {
    let d = usize::from(device);
    if d >= shared.devices.len() {
        return Err(Error::Protocol(format!("no device {device}")));
    }
    let fail = |e: rdma_dmabuf::Error| Error::rdma("accept a queue pair", &e);
    let prepared = shared.qp_builder(d).build().map_err(fail)?;
    let mine = prepared.endpoint();
    Ok((prepared.connect(endpoint).map_err(fail)?, mine))
}
