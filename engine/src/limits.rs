//! [`Limits`]: what one client can make an agent hold, and [`ControlStats`]: what the
//! control listener accepted and refused.

use crate::error::Limit;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The bounds of an agent's control listener ([`Settings::limits`](crate::Settings::limits)):
/// every resource a client can make the agent hold has one, each refusal is typed
/// ([`Error::LimitReached`](crate::Error::LimitReached) on the client's side) and counted
/// ([`Agent::control_stats`](crate::Agent::control_stats)).
///
/// The defaults serve a cluster of a hundred agents with two workers each with room to
/// spare; an agent then holds at most about `2 × handshakes + serving_threads` threads for
/// its listener, whatever the number of peers (each a 256 KiB stack: handshake threads told
/// to end count until they exit),
/// `notifications` × 4 KiB of queued notifications, and one request frame per connection.
/// A duration too long to be a deadline (`Duration::MAX`) means no bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Authenticated connections at once, from all peers (default 256). Past it, a new
    /// connection is refused after its handshake.
    pub connections: u32,
    /// Authenticated connections at once from one peer name (default 32: each of a peer's
    /// workers keeps one, and look-ups open short ones).
    pub connections_per_peer: u32,
    /// Connections still in their handshake at once (default 64). Past it the oldest of
    /// them is dropped, so that a flood of connections that never authenticate cannot keep
    /// an honest peer out: its handshake takes a round trip, theirs are dropped in turn.
    pub handshakes: u32,
    /// How long a handshake may take (default 5 s).
    pub handshake_timeout: Duration,
    /// How long an authenticated connection that holds no queue pair may stay silent before
    /// it is closed (default 120 s). One that holds queue pairs stays while its peer is
    /// alive (TCP keep-alive finds a dead one): closing it would tear down their rails.
    pub idle_timeout: Duration,
    /// Queue pairs made over one connection (default 256).
    pub queue_pairs_per_connection: u32,
    /// Queue pairs of one peer name, over all its connections (default 1,024).
    pub queue_pairs_per_peer: u32,
    /// Queue pairs held for all peers together (default 4,096: a NIC's memory and the
    /// kernel's objects are finite, and several names may share one key).
    pub queue_pairs: u32,
    /// Notifications queued from one sender and not yet taken (default 1,024).
    pub notifications_per_sender: u32,
    /// Notifications queued in all (default 8,192: at most 32 MiB of messages).
    pub notifications: u32,
    /// The largest request frame the listener reads (default 64 KiB; a notification of
    /// [`MAX_NOTIFICATION`](crate::MAX_NOTIFICATION) bytes takes 4 KiB).
    pub request_bytes: u32,
    /// Threads that serve the authenticated connections, all peers' together (default 4):
    /// each polls its share and answers one request at a time, so the threads an agent
    /// holds do not grow with its peers. More help only an agent whose peers make many
    /// queue pairs at once (each takes a few verbs calls).
    pub serving_threads: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            connections: 256,
            connections_per_peer: 32,
            handshakes: 64,
            handshake_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            queue_pairs_per_connection: 256,
            queue_pairs_per_peer: 1024,
            queue_pairs: 4096,
            notifications_per_sender: 1024,
            notifications: 8192,
            request_bytes: 64 << 10,
            serving_threads: 4,
        }
    }
}

impl Limits {
    /// The first field that is 0 (every bound must let something through).
    pub(crate) fn zero_field(&self) -> Option<&'static str> {
        let fields = [
            ("connections", self.connections),
            ("connections_per_peer", self.connections_per_peer),
            ("handshakes", self.handshakes),
            (
                "queue_pairs_per_connection",
                self.queue_pairs_per_connection,
            ),
            ("queue_pairs_per_peer", self.queue_pairs_per_peer),
            ("queue_pairs", self.queue_pairs),
            ("notifications_per_sender", self.notifications_per_sender),
            ("notifications", self.notifications),
            ("request_bytes", self.request_bytes),
            ("serving_threads", self.serving_threads),
        ];
        let zero_time = [
            ("handshake_timeout", self.handshake_timeout),
            ("idle_timeout", self.idle_timeout),
        ];
        fields
            .iter()
            .find(|(_, v)| *v == 0)
            .map(|(n, _)| *n)
            .or_else(|| zero_time.iter().find(|(_, d)| d.is_zero()).map(|(n, _)| *n))
    }
}

/// What an agent's control listener accepted and refused since it started
/// ([`Agent::control_stats`](crate::Agent::control_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ControlStats {
    /// Connections accepted (before their handshake).
    pub accepted: u64,
    /// Connections authenticated.
    pub authenticated: u64,
    /// Handshakes refused because the client offered no key (or the wrong kind of
    /// authentication).
    pub unauthenticated: u64,
    /// Handshakes whose proof was wrong: another cluster's key, or a replayed handshake.
    pub bad_proofs: u64,
    /// Handshakes that were malformed, of another protocol version, or did not finish in
    /// time.
    pub failed_handshakes: u64,
    /// Connections dropped in their handshake to make room ([`Limits::handshakes`]).
    pub handshakes_dropped: u64,
    /// Authenticated connections refused at [`Limits::connections`] or
    /// [`Limits::connections_per_peer`].
    pub connections_refused: u64,
    /// Queue pairs refused at [`Limits::queue_pairs_per_connection`],
    /// [`Limits::queue_pairs_per_peer`] or [`Limits::queue_pairs`].
    pub queue_pairs_refused: u64,
    /// Notifications refused at [`Limits::notifications_per_sender`] or
    /// [`Limits::notifications`].
    pub notifications_refused: u64,
    /// Request frames refused past [`Limits::request_bytes`] (the connection is closed).
    pub requests_too_large: u64,
    /// Connections closed after [`Limits::idle_timeout`] of silence.
    pub idle_closed: u64,
    /// Failed `accept` calls (the listener backs off after each: out of file descriptors).
    pub accept_errors: u64,
    /// Connections open now, authenticated or in their handshake.
    pub open_connections: u64,
    /// Queue pairs the listener holds for peers now.
    pub queue_pairs: u64,
}

/// The listener's counters, bumped as it goes (relaxed: each is a count of its own).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub accepted: AtomicU64,
    pub authenticated: AtomicU64,
    pub unauthenticated: AtomicU64,
    pub bad_proofs: AtomicU64,
    pub failed_handshakes: AtomicU64,
    pub handshakes_dropped: AtomicU64,
    pub connections_refused: AtomicU64,
    pub queue_pairs_refused: AtomicU64,
    pub notifications_refused: AtomicU64,
    pub requests_too_large: AtomicU64,
    pub idle_closed: AtomicU64,
    pub accept_errors: AtomicU64,
}

impl Counters {
    /// Counts one event.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    /// Counts a refusal at `limit`.
    pub fn refused(&self, limit: Limit) {
        Counters::bump(match limit {
            Limit::Connections | Limit::ConnectionsPerPeer => &self.connections_refused,
            Limit::QueuePairsPerConnection | Limit::QueuePairsPerPeer | Limit::QueuePairs => {
                &self.queue_pairs_refused
            }
            Limit::NotificationsPerSender | Limit::Notifications => &self.notifications_refused,
            Limit::RequestBytes => &self.requests_too_large,
        });
    }

    /// A snapshot, with the gauges given.
    pub fn snapshot(&self, open_connections: u64, queue_pairs: u64) -> ControlStats {
        let g = |c: &AtomicU64| c.load(Relaxed);
        ControlStats {
            accepted: g(&self.accepted),
            authenticated: g(&self.authenticated),
            unauthenticated: g(&self.unauthenticated),
            bad_proofs: g(&self.bad_proofs),
            failed_handshakes: g(&self.failed_handshakes),
            handshakes_dropped: g(&self.handshakes_dropped),
            connections_refused: g(&self.connections_refused),
            queue_pairs_refused: g(&self.queue_pairs_refused),
            notifications_refused: g(&self.notifications_refused),
            requests_too_large: g(&self.requests_too_large),
            idle_closed: g(&self.idle_closed),
            accept_errors: g(&self.accept_errors),
            open_connections,
            queue_pairs,
        }
    }
}
