//! Signed metadata values (the etcd and HTTP backends): every value a backend writes carries
//! a proof that an agent of the cluster wrote it under that key, and every value it reads
//! must carry one, so that a writer of the store who is not an agent cannot stand in for one
//! (docs/engine.md, "Security").
//!
//! A signed value is `GRS\0`, a kind, the value (u32 length and bytes) and the proof, over
//! the store's key and the value (so a value moved to another key, another agent's or another
//! segment's, fails):
//! * kind 1, a cluster key: HMAC-SHA-256 under a key derived from the cluster key for etcd
//!   alone (any agent of the cluster could have written it);
//! * kind 2, mutual TLS: the signature scheme (u16), the signature by the writer's TLS key,
//!   and its certificate chain (a count, then each with its length); the reader checks the
//!   chain against the cluster's CA and that the certificate names the agent whose key it
//!   is (only that agent could have written it).

use crate::auth::{Credentials, Tls};
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use rustls::pki_types::CertificateDer;
use sha2::Sha256;
use zeroize::Zeroizing;

const MAGIC: &[u8; 4] = b"GRS\0";
const KIND_KEY: u8 = 1;
const KIND_TLS: u8 = 2;

/// How this backend signs what it writes and checks what it reads.
pub(crate) enum Signing {
    /// No authentication: values are written and read as they are; a signed value is
    /// refused (it belongs to a cluster with a key).
    None,
    /// The key derived from the cluster key for metadata values.
    Key(Zeroizing<[u8; 32]>),
    /// This agent's TLS key, certificate and the cluster's CA.
    Tls(Box<Tls>),
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signing::None => "Signing::None",
            Signing::Key(_) => "Signing::Key",
            Signing::Tls(_) => "Signing::Tls",
        })
    }
}

impl Signing {
    /// The signing of these credentials.
    pub fn new(creds: Credentials) -> Signing {
        match creds {
            Credentials::None => Signing::None,
            Credentials::Tls(t) => Signing::Tls(Box::new(t)),
            Credentials::Key(k) => {
                let hk = hkdf::Hkdf::<Sha256>::new(None, k.bytes());
                let mut out = Zeroizing::new([0u8; 32]);
                hk.expand(b"gpu-rdma etcd records v1", out.as_mut())
                    .expect("32 bytes is a valid HKDF length");
                Signing::Key(out)
            }
        }
    }

    fn tag(key: &[u8; 32], store_key: &str, value: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
        m.update(&(store_key.len() as u64).to_le_bytes());
        m.update(store_key.as_bytes());
        m.update(value);
        m
    }

    /// What a TLS signature covers.
    fn message(store_key: &str, value: &[u8]) -> Vec<u8> {
        let mut m = b"gpu-rdma etcd records v1 ".to_vec();
        m.extend_from_slice(&(store_key.len() as u64).to_le_bytes());
        m.extend_from_slice(store_key.as_bytes());
        m.extend_from_slice(value);
        m
    }

    /// `value` as agent `agent` writes it under `store_key`.
    ///
    /// # Errors
    /// With TLS: [`Error::Settings`] when this agent's certificate does not name `agent`, or
    /// its key fails to sign.
    pub fn seal(&self, store_key: &str, agent: &str, value: Vec<u8>) -> Result<Vec<u8>> {
        let mut w = Writer::default();
        match self {
            Signing::None => return Ok(value),
            Signing::Key(k) => {
                let tag = Signing::tag(k, store_key, &value).finalize().into_bytes();
                w.raw(MAGIC).u8(KIND_KEY).bytes(&value).raw(&tag);
            }
            Signing::Tls(t) => {
                crate::auth::names(&t.chain()[0], agent)?;
                let (scheme, sig) = t.sign(&Signing::message(store_key, &value))?;
                w.raw(MAGIC)
                    .u8(KIND_TLS)
                    .bytes(&value)
                    .u16(scheme)
                    .bytes(&sig);
                w.u32(t.chain().len() as u32);
                for c in t.chain() {
                    w.bytes(c);
                }
            }
        }
        Ok(w.0)
    }

    /// The value `stored` under `store_key` holds, once its proof is checked.
    ///
    /// # Errors
    /// [`Error::Authentication`] for a value without a proof, or whose proof fails (written
    /// by someone without the cluster's key, or moved from another key), or a signed value
    /// read without a key.
    pub fn open<'a>(&self, store_key: &str, agent: &str, stored: &'a [u8]) -> Result<&'a [u8]> {
        let refused = |detail: &str| Error::Authentication {
            peer: format!("metadata key {store_key}"),
            detail: detail.into(),
        };
        let signed = stored.starts_with(MAGIC);
        if let Signing::None = self {
            if signed {
                return Err(refused(
                    "a signed value, and this agent has no authentication to check it with",
                ));
            }
            return Ok(stored);
        }
        if !signed {
            return Err(refused(
                "a value without the cluster's signature: written by something that is not \
                 an agent of this cluster (or one without authentication)",
            ));
        }
        let mut r = Reader::new(stored);
        r.raw(MAGIC.len())?;
        let kind = r.u8()?;
        let value = r.bytes()?;
        match (self, kind) {
            (Signing::Key(k), KIND_KEY) => {
                let tag = r.raw(32)?;
                r.end()?;
                Signing::tag(k, store_key, value)
                    .verify_slice(tag)
                    .map_err(|_| {
                        refused(
                            "a signature that does not verify with the cluster's key (forged, or \
                         moved from another key)",
                        )
                    })?;
            }
            (Signing::Tls(t), KIND_TLS) => {
                let scheme = r.u16()?;
                let sig = r.bytes()?;
                let n = r.u32()?;
                let mut chain = Vec::new();
                for _ in 0..n.min(16) {
                    chain.push(CertificateDer::from(r.bytes()?));
                }
                r.end()?;
                let msg = Signing::message(store_key, value);
                t.verify(&chain, agent, &msg, scheme, sig)
                    .map_err(|why| refused(&format!("not written by agent {agent:?}: {why}")))?;
            }
            _ => {
                return Err(refused(
                    "a value signed another way than this agent authenticates",
                ))
            }
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ClusterKey, Tls};

    fn keyed(b: u8) -> Signing {
        Signing::new(Credentials::Key(ClusterKey::from_bytes(&[b; 32]).unwrap()))
    }

    fn seal(s: &Signing, key: &str, v: &[u8]) -> Vec<u8> {
        s.seal(key, "a", v.to_vec()).unwrap()
    }

    #[test]
    fn a_value_opens_only_under_its_key_with_the_clusters_key() {
        let s = keyed(1);
        let v = seal(&s, "/p/agents/a/agent", b"record");
        assert_eq!(s.open("/p/agents/a/agent", "a", &v).unwrap(), b"record");
        for (who, key) in [(&s, "/p/agents/b/agent"), (&keyed(2), "/p/agents/a/agent")] {
            let e = who.open(key, "a", &v).unwrap_err();
            assert!(matches!(e, Error::Authentication { .. }), "{e:?}");
        }
        assert!(s.open("/p/agents/a/agent", "a", b"GRA\0unsigned").is_err());
        assert!(Signing::None.open("/k", "a", &v).is_err());
        assert_eq!(Signing::None.open("/k", "a", b"plain").unwrap(), b"plain");
        let mut flipped = v.clone();
        flipped[12] ^= 1;
        assert!(s.open("/p/agents/a/agent", "a", &flipped).is_err());
    }

    #[test]
    fn a_tls_signed_value_opens_only_as_its_agents() {
        use crate::auth::test_pki::Ca;
        let (ca, other) = (Ca::new("etcd-a"), Ca::new("etcd-b"));
        let signing = |ca: &Ca, n: &str| {
            Signing::new(Credentials::Tls(Tls::load(&ca.agent(n), Some(n)).unwrap()))
        };
        let (a, b, foreign) = (signing(&ca, "a"), signing(&ca, "b"), signing(&other, "a"));
        let key = "/p/agents/a/segments/kv";
        let v = a.seal(key, "a", b"descriptor".to_vec()).unwrap();
        assert_eq!(b.open(key, "a", &v).unwrap(), b"descriptor");
        // b cannot write as a, a value is a's only under a's keys, another CA's is refused.
        assert!(b.seal(key, "a", b"x".to_vec()).is_err());
        let bs = b.seal("/p/agents/b/agent", "b", b"x".to_vec()).unwrap();
        assert!(a.open("/p/agents/b/agent", "b", &bs).is_ok());
        assert!(a.open(key, "a", &bs).is_err());
        assert!(b.open("/p/agents/a/x", "a", &v).is_err());
        let f = foreign.seal(key, "a", b"descriptor".to_vec()).unwrap();
        assert!(matches!(
            b.open(key, "a", &f),
            Err(Error::Authentication { .. })
        ));
        assert!(keyed(1).open(key, "a", &v).is_err());
    }
}
