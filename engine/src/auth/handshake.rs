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

use super::Credentials;
use crate::channel::{read_frame, write_frame, Channel, Link, Seal, Socket, Waits};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use std::net::TcpStream;
use std::time::Instant;

const MAGIC: &[u8; 4] = b"GRC\0";
/// The control protocol's version; both sides must speak the same one.
pub(crate) const CONTROL_VERSION: u16 = 3;
/// The largest handshake message either side reads.
pub(crate) const MAX_HANDSHAKE_FRAME: usize = 1024;
const MODE_NONE: u8 = 0;
const MODE_KEY: u8 = 1;
const MODE_TLS: u8 = 2;

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

fn mode(creds: &Credentials) -> u8 {
    match creds {
        Credentials::None => MODE_NONE,
        Credentials::Key(_) => MODE_KEY,
        Credentials::Tls(_) => MODE_TLS,
    }
}

fn mode_name(mode: u8) -> &'static str {
    match mode {
        MODE_NONE => "no authentication (GPU_RDMA_INSECURE_NO_AUTH)",
        MODE_KEY => "a cluster key",
        MODE_TLS => "mutual TLS",
        _ => "an unknown kind of authentication",
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
    creds: &Credentials,
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
        .u8(mode(creds))
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
    if theirs_mode != mode(creds) {
        return Err(refused(format!(
            "it uses {} and this agent {}: they do not talk",
            mode_name(theirs_mode),
            mode_name(mode(creds))
        )));
    }
    let key = match creds {
        Credentials::None => {
            r.end()?;
            return Ok(Channel::new(Link::Plain(stream), name));
        }
        Credentials::Tls(tls) => {
            r.end()?;
            let server = super::tls::dns_name(&name)?;
            let conn = rustls::ClientConnection::new(tls.client.clone(), server)
                .map_err(|e| refused(e.to_string()))?;
            // The whole TLS handshake by one deadline, however the server trickles bytes.
            let until = Instant::now().checked_add(waits.frame);
            let mut t = rustls::StreamOwned::new(conn, Socket::new(stream, until));
            while t.conn.is_handshaking() {
                t.conn
                    .complete_io(&mut t.sock)
                    .map_err(|e| refused(format!("TLS: {e}")))?;
            }
            // The CA's verifier matches names as DNS does (any case, wildcards): the
            // certificate must hold the agent's name byte for byte, as the server checks ours.
            let named = t
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .is_some_and(|c| super::names(c, &name).is_ok());
            if !named {
                return Err(refused(format!(
                    "its certificate does not name agent {name:?} exactly"
                )));
            }
            // Later reads wait as each call's `Waits` says.
            return Ok(Channel::new(Link::TlsClient(Box::new(t)), name));
        }
        Credentials::Key(key) => key,
    };
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
    Ok(Channel::new(
        Link::Sealed(stream, Seal::new(&c2s, &s2c)),
        name,
    ))
}

/// The server's side: agent `me` answers a connection whose `hello` frame it has read;
/// the channel names the client as it authenticated.
pub(crate) fn accept(
    mut stream: TcpStream,
    hello: &[u8],
    me: &str,
    creds: &Credentials,
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
    if let Err(e) = crate::names::check_agent_name(&name) {
        reject(&mut stream, e.to_string());
        return Err(malformed(e));
    }
    if theirs_mode != mode(creds) {
        let why = match creds {
            Credentials::Key(_) => {
                "this agent requires the cluster key (Settings::auth, GPU_RDMA_CLUSTER_KEY_FILE)"
            }
            Credentials::Tls(_) => {
                "this agent requires mutual TLS with the cluster's CA (GPU_RDMA_TLS_*)"
            }
            Credentials::None => {
                "this agent runs without authentication and serves no agent that has some"
            }
        };
        reject(&mut stream, why.into());
        return Err(Refusal::Unauthenticated);
    }
    let mine = challenge().map_err(|_| Refusal::Failed)?;
    let mut w = Writer::default();
    w.u8(1).u8(mode(creds)).raw(&mine).str(me);
    let key = match creds {
        Credentials::None => {
            write_frame(&mut stream, &w.0).map_err(|_| Refusal::Failed)?;
            return Ok(Channel::new(Link::Plain(stream), name));
        }
        Credentials::Tls(tls) => {
            write_frame(&mut stream, &w.0).map_err(|_| Refusal::Failed)?;
            let conn =
                rustls::ServerConnection::new(tls.server.clone()).map_err(|_| Refusal::Failed)?;
            // The whole TLS handshake by the handshake's deadline, however the client
            // trickles its bytes.
            let until = waits
                .until
                .or_else(|| Instant::now().checked_add(waits.frame));
            let mut t = rustls::StreamOwned::new(conn, Socket::new(stream, until));
            while t.conn.is_handshaking() {
                if let Err(e) = t.conn.complete_io(&mut t.sock) {
                    // A certificate refused is a failed proof; a broken connection is not.
                    let tls_error = e.get_ref().is_some_and(|i| i.is::<rustls::Error>());
                    return Err(if tls_error {
                        Refusal::BadProof
                    } else {
                        Refusal::Failed
                    });
                }
            }
            // The client's certificate must name the agent its hello claims.
            let named = t
                .conn
                .peer_certificates()
                .and_then(|c| c.first())
                .is_some_and(|c| super::names(c, &name).is_ok());
            if !named {
                return Err(Refusal::BadProof);
            }
            return Ok(Channel::new(Link::TlsServer(Box::new(t)), name));
        }
        Credentials::Key(key) => key,
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
    Ok(Channel::new(
        Link::Sealed(stream, Seal::new(&s2c, &c2s)),
        name,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Auth, ClusterKey};
    use std::net::TcpListener;
    use std::time::Duration;

    pub(super) const WAITS: Waits = Waits {
        idle: Some(Duration::from_secs(5)),
        frame: Duration::from_secs(5),
        until: None,
    };

    /// Agent "cli" (its hello naming `claims`) connects to agent "srv" with these
    /// credentials: both sides' outcomes.
    pub(super) fn shake_as(
        client: Credentials,
        claims: &str,
        server: Credentials,
    ) -> (Result<Channel>, std::result::Result<Channel, Refusal>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || take(&l, &server));
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let c = connect(s, addr, claims, &client, Some("srv"), WAITS);
        (c, t.join().unwrap())
    }

    /// A handshake between a client and a server with these settings.
    fn shake(
        client: Auth,
        server: Auth,
    ) -> (Result<Channel>, std::result::Result<Channel, Refusal>) {
        shake_as(creds(&client), "cli", creds(&server))
    }

    /// The next connection's hello, read as the listener does, and the server's handshake.
    fn take(l: &TcpListener, creds: &Credentials) -> std::result::Result<Channel, Refusal> {
        let mut s = l.accept().unwrap().0;
        let hello = read_frame(&mut s, MAX_HANDSHAKE_FRAME, WAITS).unwrap();
        accept(s, &hello, "srv", creds, WAITS)
    }

    fn creds(auth: &Auth) -> Credentials {
        Credentials::load(auth, None).unwrap()
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
            let first = take(&l, &creds(&key())).is_ok();
            (first, take(&l, &creds(&key())))
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

#[cfg(test)]
mod tls_tests {
    use super::tests::{shake_as, WAITS};
    use super::*;
    use crate::auth::test_pki::Ca;
    use crate::auth::Tls;

    /// Agent "cli" (its hello naming `claims`) connects to agent "srv".
    fn shake(
        client: Tls,
        claims: &str,
        server: Tls,
    ) -> (Result<Channel>, std::result::Result<Channel, Refusal>) {
        shake_as(Credentials::Tls(client), claims, Credentials::Tls(server))
    }

    #[test]
    fn certificates_of_the_cluster_ca_authenticate_both_names() {
        let ca = Ca::new("mtls");
        let load = |n: &str| Tls::load(&ca.agent(n), Some(n)).unwrap();
        let (c, s) = shake(load("cli"), "cli", load("srv"));
        let (mut c, mut s) = (c.unwrap(), s.unwrap());
        assert_eq!((c.peer.as_str(), s.peer.as_str()), ("srv", "cli"));
        c.send(b"over tls").unwrap();
        assert_eq!(s.recv(64, WAITS).unwrap(), b"over tls");
        s.send(b"back").unwrap();
        assert_eq!(c.recv(64, WAITS).unwrap(), b"back");
    }

    #[test]
    fn another_ca_a_borrowed_name_and_a_server_of_another_name_are_refused() {
        let (ca, other) = (Ca::new("mtls-a"), Ca::new("mtls-b"));
        let load = |ca: &Ca, n: &str| Tls::load(&ca.agent(n), Some(n)).unwrap();
        // A client whose certificate another CA signed.
        let (c, s) = shake(load(&other, "cli"), "cli", load(&ca, "srv"));
        assert!(c.is_err(), "{c:?}");
        assert!(matches!(s, Err(Refusal::BadProof)), "{s:?}");
        // A client of the cluster claiming another agent's name.
        let (c, s) = shake(load(&ca, "cli"), "a-b", load(&ca, "srv"));
        assert!(matches!(s, Err(Refusal::BadProof)), "{s:?}");
        drop(c);
        // A server whose certificate names the agent in another case: DNS would match it.
        let tls = Tls::load(&ca.agent("SRV"), None).unwrap();
        let (c, _) = shake(load(&ca, "cli"), "cli", tls);
        assert!(matches!(c, Err(Error::Authentication { .. })), "{c:?}");
        // A server whose certificate names another agent than the one it claims.
        let files = ca.agent("impostor");
        let tls = Tls::load(&files, None).unwrap();
        let (c, _) = shake(load(&ca, "cli"), "cli", tls);
        assert!(matches!(c, Err(Error::Authentication { .. })), "{c:?}");
        // An agent whose certificate does not name it does not start, nor one that takes
        // another spelling of its certificate's name.
        assert!(Tls::load(&ca.agent("x"), Some("y")).is_err());
        for other in ["X", "x."] {
            assert!(Tls::load(&ca.agent("x"), Some(other)).is_err(), "{other}");
        }
        // A client claiming another spelling of its certificate's name.
        for claims in ["CLI", "cli."] {
            let (_, s) = shake(load(&ca, "cli"), claims, load(&ca, "srv"));
            assert!(s.is_err(), "{claims}: {s:?}");
        }
    }
}
