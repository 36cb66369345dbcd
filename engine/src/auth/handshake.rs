//! The control connection's handshake: each side names itself and, with a cluster key,
//! proves it holds the key by answering the other's fresh random challenge; both then seal
//! every frame with keys derived from the key and both challenges.
//!
//! ```text
//! client -> server  hello    magic "GRC\0", version, mode, client challenge (32), name
//! server -> client  welcome  1, mode, server challenge (32), name, server proof (32, keyed)
//!                   (or)     2, why it refuses (a client without the cluster's key)
//! client -> server  proof    client proof (32)                                 (keyed)
//! server -> client  verdict  1 (accepted) or 2 and why                         (keyed)
//! ```
//! A proof is HMAC-SHA-256 under the key of a label naming the side ("server", "client":
//! one side's proof is never the other's) and the hash of the hello and the welcome up to
//! its proof, so it covers both challenges and both names: a proof recorded from one
//! connection fails on any other (the other side's challenge is new), and a proof the
//! server gives away to whoever connects cannot serve as a client's. The session keys are
//! HKDF-SHA-256 of the key, salted with that hash, one per direction.

use super::Auth;
use crate::channel::{read_frame, write_frame, Channel, Seal, Waits};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::net::TcpStream;

const MAGIC: &[u8; 4] = b"GRC\0";
/// The control protocol's version; both sides must speak the same one.
pub(crate) const CONTROL_VERSION: u16 = 3;
/// The largest handshake message either side reads.
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 1024;
const MODE_NONE: u8 = 0;
const MODE_KEY: u8 = 1;

/// Why a server refused a connection in its handshake (each counted).
#[derive(Debug)]
pub(crate) enum Refusal {
    /// The client offered no key (or another mode).
    Unauthenticated,
    /// The client's proof was wrong: another cluster's key, or a replayed handshake.
    BadProof,
    /// A malformed message, a wrong magic or version, or a connection that failed or timed
    /// out during the handshake.
    Failed,
}

fn mode(auth: &Auth) -> u8 {
    if auth.key().is_some() {
        MODE_KEY
    } else {
        MODE_NONE
    }
}

fn challenge() -> Result<[u8; 32]> {
    let mut c = [0u8; 32];
    getrandom::fill(&mut c)
        .map_err(|e| Error::Settings(format!("the OS's random generator: {e}")))?;
    Ok(c)
}

fn transcript(hello: &[u8], welcome: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update((hello.len() as u32).to_le_bytes());
    h.update(hello);
    h.update((welcome.len() as u32).to_le_bytes());
    h.update(welcome);
    h.finalize().into()
}

fn mac(key: &[u8], label: &[u8], th: &[u8; 32]) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(b"gpu-rdma control v3 ");
    m.update(label);
    m.update(th);
    m
}

fn proof(key: &[u8], label: &[u8], th: &[u8; 32]) -> [u8; 32] {
    mac(key, label, th).finalize().into_bytes().into()
}

fn verify(key: &[u8], label: &[u8], th: &[u8; 32], p: &[u8]) -> bool {
    mac(key, label, th).verify_slice(p).is_ok()
}

/// The two direction keys (client to server, server to client).
fn session_keys(key: &[u8], th: &[u8; 32]) -> ([u8; 32], [u8; 32]) {
    let hk = hkdf::Hkdf::<Sha256>::new(Some(th), key);
    let (mut c2s, mut s2c) = ([0u8; 32], [0u8; 32]);
    hk.expand(b"gpu-rdma control v3 client to server", &mut c2s)
        .expect("32 bytes is a valid HKDF length");
    hk.expand(b"gpu-rdma control v3 server to client", &mut s2c)
        .expect("32 bytes is a valid HKDF length");
    (c2s, s2c)
}

/// The client's side: `me` connects to the agent at `addr` over `stream` (whose timeouts
/// bound each step), which must be agent `expect` when given.
///
/// # Errors
/// [`Error::Authentication`] when either side's proof fails or the server refuses;
/// [`Error::Io`], [`Error::Protocol`].
pub(crate) fn connect(
    mut stream: TcpStream,
    addr: impl std::fmt::Display,
    me: &str,
    auth: &Auth,
    expect: Option<&str>,
    waits: Waits,
) -> Result<Channel> {
    let refused = |detail: String| Error::Authentication {
        peer: addr.to_string(),
        detail,
    };
    let io = |op, e| Error::io(op, &addr, e);
    let mine = challenge()?;
    let mut w = Writer::default();
    w.raw(MAGIC)
        .u16(CONTROL_VERSION)
        .u8(mode(auth))
        .raw(&mine)
        .str(me);
    let hello = w.0;
    write_frame(&mut stream, &hello).map_err(|e| io("send the handshake to", e))?;
    let welcome = read_frame(&mut stream, MAX_HANDSHAKE_FRAME, waits)
        .map_err(|e| io("read the handshake of", e))?;
    let mut r = Reader::new(&welcome);
    match r.u8()? {
        1 => {}
        2 => return Err(refused(format!("the agent refused: {}", r.str()?))),
        t => return Err(Error::Protocol(format!("handshake reply tag {t}"))),
    }
    let theirs_mode = r.u8()?;
    r.raw(32)?;
    let name = r.str()?;
    let head_len = welcome.len() - r.remaining();
    if let Some(want) = expect.filter(|w| *w != name) {
        return Err(refused(format!("it is agent {name:?}, not {want:?}")));
    }
    let Some(key) = auth.key() else {
        r.end()?;
        if theirs_mode != MODE_NONE {
            return Err(refused(
                "it requires a cluster key, and this agent has none".into(),
            ));
        }
        return Ok(Channel::new(stream, name, None));
    };
    if theirs_mode != MODE_KEY {
        return Err(refused(
            "it runs without authentication (GPU_RDMA_INSECURE_NO_AUTH): this agent, which \
             has a cluster key, does not talk to it"
                .into(),
        ));
    }
    let server_proof = r.raw(32)?;
    r.end()?;
    let th = transcript(&hello, &welcome[..head_len]);
    if !verify(key.bytes(), b"server", &th, server_proof) {
        return Err(refused(
            "it did not prove the cluster key (another cluster's key?)".into(),
        ));
    }
    write_frame(&mut stream, &proof(key.bytes(), b"client", &th))
        .map_err(|e| io("send the handshake to", e))?;
    let verdict = read_frame(&mut stream, MAX_HANDSHAKE_FRAME, waits)
        .map_err(|e| io("read the handshake of", e))?;
    let mut r = Reader::new(&verdict);
    match r.u8()? {
        1 => r.end()?,
        2 => return Err(refused(format!("the agent refused: {}", r.str()?))),
        t => return Err(Error::Protocol(format!("handshake verdict tag {t}"))),
    }
    let (c2s, s2c) = session_keys(key.bytes(), &th);
    Ok(Channel::new(stream, name, Some(Seal::new(&c2s, &s2c))))
}

/// The server's side: agent `me` answers a connection whose `hello` frame it has read;
/// the channel names the client as it authenticated.
pub(crate) fn accept(
    mut stream: TcpStream,
    hello: &[u8],
    me: &str,
    auth: &Auth,
    waits: Waits,
) -> std::result::Result<Channel, Refusal> {
    let malformed = |_: Error| Refusal::Failed;
    let mut r = Reader::new(hello);
    if r.raw(MAGIC.len()).map_err(malformed)? != MAGIC {
        return Err(Refusal::Failed);
    }
    let version = r.u16().map_err(malformed)?;
    let theirs_mode = r.u8().map_err(malformed)?;
    r.raw(32).map_err(malformed)?;
    let name = r.str().map_err(malformed)?;
    r.end().map_err(malformed)?;
    let reject = |stream: &mut TcpStream, why: String| {
        let mut w = Writer::default();
        w.u8(2).str(&why);
        let _ = write_frame(stream, &w.0);
    };
    if version != CONTROL_VERSION {
        let why = format!("control protocol {version} (this agent speaks {CONTROL_VERSION})");
        reject(&mut stream, why);
        return Err(Refusal::Failed);
    }
    if let Err(e) = crate::segment::check_agent_name(&name) {
        reject(&mut stream, e.to_string());
        return Err(malformed(e));
    }
    if theirs_mode != mode(auth) {
        let why = match auth.key() {
            Some(_) => {
                "this agent requires the cluster key (Settings::auth, GPU_RDMA_CLUSTER_KEY_FILE)"
            }
            None => "this agent runs without authentication and serves no agent with a key",
        };
        reject(&mut stream, why.into());
        return Err(Refusal::Unauthenticated);
    }
    let mine = challenge().map_err(|_| Refusal::Failed)?;
    let mut w = Writer::default();
    w.u8(1).u8(mode(auth)).raw(&mine).str(me);
    let Some(key) = auth.key() else {
        write_frame(&mut stream, &w.0).map_err(|_| Refusal::Failed)?;
        return Ok(Channel::new(stream, name, None));
    };
    let th = transcript(hello, &w.0);
    w.raw(&proof(key.bytes(), b"server", &th));
    write_frame(&mut stream, &w.0).map_err(|_| Refusal::Failed)?;
    let client_proof =
        read_frame(&mut stream, MAX_HANDSHAKE_FRAME, waits).map_err(|_| Refusal::Failed)?;
    if !verify(key.bytes(), b"client", &th, &client_proof) {
        reject(&mut stream, "wrong proof of the cluster key".into());
        return Err(Refusal::BadProof);
    }
    write_frame(&mut stream, &[1]).map_err(|_| Refusal::Failed)?;
    let (c2s, s2c) = session_keys(key.bytes(), &th);
    Ok(Channel::new(stream, name, Some(Seal::new(&s2c, &c2s))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ClusterKey;
    use std::net::TcpListener;
    use std::time::Duration;

    const WAITS: Waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
    };

    /// Runs a handshake between a client and a server with these settings.
    fn shake(
        client: Auth,
        server: Auth,
    ) -> (Result<Channel>, std::result::Result<Channel, Refusal>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || take(&l, &server));
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let c = connect(s, addr, "cli", &client, Some("srv"), WAITS);
        (c, t.join().unwrap())
    }

    /// The next connection's hello, read as the listener does, and the server's handshake.
    fn take(l: &TcpListener, auth: &Auth) -> std::result::Result<Channel, Refusal> {
        let mut s = l.accept().unwrap().0;
        let hello = read_frame(&mut s, MAX_HANDSHAKE_FRAME, WAITS).unwrap();
        accept(s, &hello, "srv", auth, WAITS)
    }

    fn key() -> Auth {
        Auth::ClusterKey(ClusterKey::from_bytes(&[7; 32]).unwrap())
    }

    #[test]
    fn the_same_key_authenticates_both_sides_and_seals_the_channel() {
        let (c, s) = shake(key(), key());
        let (mut c, mut s) = (c.unwrap(), s.unwrap());
        assert_eq!((c.peer.as_str(), s.peer.as_str()), ("srv", "cli"));
        assert!(c.sealed() && s.sealed());
        c.send(b"ping").unwrap();
        assert_eq!(s.recv(64, WAITS).unwrap(), b"ping");
        s.send(b"pong").unwrap();
        assert_eq!(c.recv(64, WAITS).unwrap(), b"pong");
    }

    #[test]
    fn another_key_no_key_and_a_keyless_server_are_refused_both_ways() {
        let other = Auth::ClusterKey(ClusterKey::from_bytes(&[8; 32]).unwrap());
        let (c, _) = shake(other, key());
        assert!(
            matches!(c, Err(Error::Authentication { ref detail, .. }) if detail.contains("prove")),
            "{c:?}"
        );
        let (c, s) = shake(Auth::InsecureNoAuthentication, key());
        assert!(
            matches!(c, Err(Error::Authentication { ref detail, .. }) if detail.contains("requires")),
            "{c:?}"
        );
        assert!(matches!(s, Err(Refusal::Unauthenticated)));
        let (c, s) = shake(key(), Auth::InsecureNoAuthentication);
        assert!(c.is_err() && s.is_err());
        let (c, s) = shake(
            Auth::InsecureNoAuthentication,
            Auth::InsecureNoAuthentication,
        );
        assert!(!c.unwrap().sealed() && !s.unwrap().sealed());
    }

    #[test]
    fn a_replayed_client_handshake_is_refused() {
        // Record an honest client's hello and proof, then play them to the server again.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let first = take(&l, &key()).is_ok();
            (first, take(&l, &key()))
        });
        let mine = [3u8; 32];
        let mut w = Writer::default();
        w.raw(MAGIC)
            .u16(CONTROL_VERSION)
            .u8(MODE_KEY)
            .raw(&mine)
            .str("cli");
        let hello = w.0;
        let mut s = TcpStream::connect(addr).unwrap();
        write_frame(&mut s, &hello).unwrap();
        let welcome = read_frame(&mut s, 1024, WAITS).unwrap();
        let th = transcript(&hello, &welcome[..welcome.len() - 32]);
        let recorded = proof(&[7; 32], b"client", &th);
        write_frame(&mut s, &recorded).unwrap();
        assert_eq!(read_frame(&mut s, 1024, WAITS).unwrap(), [1]);
        let mut again = TcpStream::connect(addr).unwrap();
        write_frame(&mut again, &hello).unwrap();
        read_frame(&mut again, 1024, WAITS).unwrap();
        write_frame(&mut again, &recorded).unwrap();
        let (first, second) = server.join().unwrap();
        assert!(first);
        assert!(matches!(second, Err(Refusal::BadProof)), "{second:?}");
    }
}
