//! [`Channel`]: one authenticated control connection: length-prefixed frames over TCP,
//! sealed with the connection's keys when the cluster has a key.
//!
//! A frame is a u32 length (little-endian) and that many bytes. A sealed frame's bytes are
//! the payload encrypted and authenticated with ChaCha20-Poly1305 under the sender's
//! direction key, its nonce the count of frames that direction sent before: a frame changed,
//! dropped, reordered, replayed or injected fails to open, and the connection ends.

use chacha20poly1305::aead::{Aead, KeyInit};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Each direction's cipher and how many frames it has sealed or opened.
pub(crate) struct Seal {
    tx: ChaCha20Poly1305,
    rx: ChaCha20Poly1305,
    sent: u64,
    received: u64,
}

impl Seal {
    /// Seals with `tx` what this side sends and opens with `rx` what it receives.
    pub fn new(tx: &[u8; 32], rx: &[u8; 32]) -> Seal {
        Seal {
            tx: ChaCha20Poly1305::new(Key::from_slice(tx)),
            rx: ChaCha20Poly1305::new(Key::from_slice(rx)),
            sent: 0,
            received: 0,
        }
    }
}

fn nonce(n: u64) -> Nonce {
    let mut b = [0u8; 12];
    b[4..].copy_from_slice(&n.to_le_bytes());
    *Nonce::from_slice(&b)
}

/// How long a read may wait: for a frame to start, and for the rest of it once started.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Waits {
    /// Until the first byte of a frame (`None`: no bound).
    pub idle: Option<Duration>,
    /// From the first byte to the last.
    pub frame: Duration,
    /// A deadline for the whole read, whatever the two above say (a handshake's).
    pub until: Option<Instant>,
}

/// The earlier of two deadlines (`None`: none).
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The socket timeout that ends a read by `until`, or `TimedOut` once it has passed.
fn left(until: Option<Instant>) -> io::Result<Option<Duration>> {
    let Some(u) = until else {
        return Ok(None);
    };
    let left = u.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "a frame did not arrive whole in time",
        ));
    }
    // A zero timeout means "none" to the socket.
    Ok(Some(left.max(Duration::from_millis(1))))
}

/// A TCP socket whose every read ends by a deadline, for TLS: rustls reads the socket as
/// many times as a record needs, so a bound on each read would not bound the whole.
pub(crate) struct Socket {
    stream: TcpStream,
    until: Option<Instant>,
}

impl Socket {
    /// `stream`, each read ending by `until`.
    pub fn new(stream: TcpStream, until: Option<Instant>) -> Socket {
        Socket { stream, until }
    }
}

impl Read for Socket {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(left(self.until)?)?;
        self.stream.read(b)
    }
}

impl Write for Socket {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.stream.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}

/// A byte stream whose reads can be bounded by a deadline.
pub(crate) trait Wire: Read + Write {
    /// Bounds the next reads: each ends by `until` (`None`: no bound), or fails with
    /// `TimedOut` once it has passed.
    fn read_by(&mut self, until: Option<Instant>) -> io::Result<()>;
}

impl Wire for TcpStream {
    fn read_by(&mut self, until: Option<Instant>) -> io::Result<()> {
        // One system call per read here: the timeout of each is what is left.
        self.set_read_timeout(left(until)?)
    }
}

/// A TLS connection over a socket (client or server side).
pub(crate) type Tls<C> = rustls::StreamOwned<C, Socket>;

impl<C, D> Wire for Tls<C>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
    D: rustls::SideData,
{
    fn read_by(&mut self, until: Option<Instant>) -> io::Result<()> {
        left(until)?;
        self.sock.until = until;
        Ok(())
    }
}

/// How a channel's frames travel.
pub(crate) enum Link {
    /// As they are (no authentication).
    Plain(TcpStream),
    /// Sealed with the connection's keys (a cluster key).
    Sealed(TcpStream, Seal),
    /// Inside mutual TLS, client side.
    TlsClient(Box<Tls<rustls::ClientConnection>>),
    /// Inside mutual TLS, server side.
    TlsServer(Box<Tls<rustls::ServerConnection>>),
}

/// A control connection after its handshake.
pub(crate) struct Channel {
    link: Link,
    /// The other side's name, as the handshake authenticated it (or as it claimed it,
    /// without authentication).
    pub peer: String,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let link = match self.link {
            Link::Plain(_) => "plain",
            Link::Sealed(..) => "sealed",
            Link::TlsClient(_) | Link::TlsServer(_) => "tls",
        };
        f.debug_struct("Channel")
            .field("peer", &self.peer)
            .field("link", &link)
            .finish()
    }
}

impl Channel {
    pub fn new(link: Link, peer: String) -> Channel {
        Channel { link, peer }
    }

    /// Whether frames are authenticated (sealed or inside TLS).
    #[cfg(test)]
    pub fn sealed(&self) -> bool {
        !matches!(self.link, Link::Plain(_))
    }

    /// Sends one frame.
    pub fn send(&mut self, payload: &[u8]) -> io::Result<()> {
        match &mut self.link {
            Link::Plain(s) => write_frame(s, payload),
            Link::Sealed(st, s) => {
                let sealed =
                    s.tx.encrypt(&nonce(s.sent), payload)
                        .map_err(|_| io::Error::other("sealing a frame failed"))?;
                s.sent += 1;
                write_frame(st, &sealed)
            }
            Link::TlsClient(t) => write_frame(t.as_mut(), payload).and_then(|()| t.flush()),
            Link::TlsServer(t) => write_frame(t.as_mut(), payload).and_then(|()| t.flush()),
        }
    }

    /// The socket's fd, for a poll: readable when a frame's bytes (or the end) arrive.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        match &self.link {
            Link::Plain(st) | Link::Sealed(st, _) => st.as_fd(),
            Link::TlsClient(t) => t.sock.stream.as_fd(),
            Link::TlsServer(t) => t.sock.stream.as_fd(),
        }
    }

    /// Whether bytes of a frame already arrived and wait inside the channel (TLS decrypts
    /// whole records, which may hold more than the frame just read), where a poll of
    /// [`Channel::fd`] does not see them.
    pub fn buffered(&mut self) -> bool {
        let state = match &mut self.link {
            Link::Plain(_) | Link::Sealed(..) => return false,
            Link::TlsClient(t) => t.conn.process_new_packets(),
            Link::TlsServer(t) => t.conn.process_new_packets(),
        };
        state.is_ok_and(|s| s.plaintext_bytes_to_read() > 0)
    }

    /// Receives one frame of at most `limit` bytes (payload), waiting as `waits` says.
    ///
    /// # Errors
    /// `InvalidData` for a frame over the limit or one that does not open; `TimedOut` /
    /// `WouldBlock` when a wait ends; `UnexpectedEof` at the end of the stream.
    pub fn recv(&mut self, limit: usize, waits: Waits) -> io::Result<Vec<u8>> {
        let (st, s) = match &mut self.link {
            Link::Plain(st) => return read_frame(st, limit, waits),
            Link::TlsClient(t) => return read_frame(t.as_mut(), limit, waits),
            Link::TlsServer(t) => return read_frame(t.as_mut(), limit, waits),
            Link::Sealed(st, s) => (st, s),
        };
        // A sealed frame is its payload and a 16-byte tag.
        let b = read_frame(st, limit + 16, waits)?;
        let open = s.rx.decrypt(&nonce(s.received), b.as_slice()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "a frame that does not open with this connection's key (changed, replayed or injected)",
            )
        })?;
        s.received += 1;
        Ok(open)
    }
}

/// A frame longer than the reader takes (the error inside [`read_frame`]'s `InvalidData`).
#[derive(Debug)]
pub(crate) struct TooLarge {
    pub len: usize,
    pub limit: usize,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a frame of {} bytes (at most {})", self.len, self.limit)
    }
}

impl std::error::Error for TooLarge {}

impl TooLarge {
    /// Whether `e` is a frame over the limit.
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|i| i.is::<TooLarge>())
    }
}

/// Writes one frame.
pub(crate) fn write_frame(s: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let n = u32::try_from(payload.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a frame over 4 GiB"))?;
    let mut b = Vec::with_capacity(4 + payload.len());
    b.extend_from_slice(&n.to_le_bytes());
    b.extend_from_slice(payload);
    s.write_all(&b)
}

/// Reads one frame of at most `limit` bytes: its first byte within `waits.idle`, the rest
/// within `waits.frame` of it (a peer that sends a frame a byte at a time holds the
/// connection no longer), all by `waits.until`. The buffer grows with what arrives, so a
/// length that lies allocates nothing.
pub(crate) fn read_frame(
    s: &mut (impl Wire + ?Sized),
    limit: usize,
    waits: Waits,
) -> io::Result<Vec<u8>> {
    let mut n = [0u8; 4];
    // A wait too long to be a deadline (Duration::MAX) is none.
    let start = waits.idle.and_then(|d| Instant::now().checked_add(d));
    s.read_by(earlier(start, waits.until))?;
    let first = loop {
        match s.read(&mut n[..1]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => break k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    };
    let deadline = earlier(Instant::now().checked_add(waits.frame), waits.until);
    read_until(s, &mut n[first..], deadline)?;
    let len = u32::from_le_bytes(n) as usize;
    if len > limit {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            TooLarge { len, limit },
        ));
    }
    let mut b = Vec::with_capacity(len.min(64 << 10));
    let mut chunk = [0u8; 16 << 10];
    while b.len() < len {
        let want = (len - b.len()).min(chunk.len());
        read_until(s, &mut chunk[..want], deadline)?;
        b.extend_from_slice(&chunk[..want]);
    }
    Ok(b)
}

/// Fills `buf` by `deadline` (`None`: no bound).
fn read_until(
    s: &mut (impl Wire + ?Sized),
    mut buf: &mut [u8],
    deadline: Option<Instant>,
) -> io::Result<()> {
    while !buf.is_empty() {
        s.read_by(deadline)?;
        match s.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(k) => buf = &mut buf[k..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (a, l.accept().unwrap().0)
    }

    const WAITS: Waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };

    #[test]
    fn sealed_frames_round_trip_and_a_replayed_or_changed_one_is_refused() {
        let (a, b) = pair();
        let mut tap = a.try_clone().unwrap();
        let mut a = Channel::new(Link::Sealed(a, Seal::new(&[1; 32], &[2; 32])), "b".into());
        let mut b = Channel::new(Link::Sealed(b, Seal::new(&[2; 32], &[1; 32])), "a".into());
        a.send(b"one").unwrap();
        a.send(b"two").unwrap();
        assert_eq!(b.recv(64, WAITS).unwrap(), b"one");
        assert_eq!(b.recv(64, WAITS).unwrap(), b"two");
        // The first frame again, as an eavesdropper would replay it: its nonce is spent.
        let first = ChaCha20Poly1305::new(Key::from_slice(&[1; 32]))
            .encrypt(&nonce(0), b"one".as_slice())
            .unwrap();
        write_frame(&mut tap, &first).unwrap();
        let e = b.recv(64, WAITS).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn a_long_frame_is_refused_before_it_is_read_and_a_slow_one_times_out() {
        let (mut a, mut b) = pair();
        a.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
        let e = read_frame(&mut b, 1024, WAITS).unwrap_err();
        assert!(TooLarge::is(&e), "{e}");
        let (mut a, mut b) = pair();
        a.write_all(&[8, 0, 0, 0, 1]).unwrap();
        let waits = Waits {
            idle: Some(Duration::from_secs(5)),
            frame: Duration::from_millis(200),
            until: None,
        };
        let at = Instant::now();
        let e = read_frame(&mut b, 1024, waits).unwrap_err();
        assert!(matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
        ));
        assert!(at.elapsed() < Duration::from_secs(2));
    }
}
