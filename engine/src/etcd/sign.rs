//! Signed etcd values: every value the backend writes carries a proof that an agent of the
//! cluster wrote it under that key, and every value it reads must carry one, so that a
//! writer of the prefix who is not an agent cannot stand in for one (docs/engine.md,
//! "Security").
//!
//! A signed value is `GRS\0`, a kind (1: cluster key), the value (u32 length and bytes) and
//! the proof: HMAC-SHA-256, under a key derived from the cluster key for etcd alone, of the
//! etcd key and the value (so a value moved to another key, another agent's or another
//! segment's, fails).

use crate::auth::Auth;
use crate::codec::{Reader, Writer};
use crate::error::{Error, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

const MAGIC: &[u8; 4] = b"GRS\0";
const KIND_KEY: u8 = 1;

/// How this backend signs what it writes and checks what it reads.
pub(super) enum Signing {
    /// No authentication: values are written and read as they are; a signed value is
    /// refused (it belongs to a cluster with a key).
    None,
    /// The cluster key's etcd key.
    Key(Zeroizing<[u8; 32]>),
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signing::None => "Signing::None",
            Signing::Key(_) => "Signing::Key",
        })
    }
}

impl Signing {
    /// The signing of `auth` (resolved).
    pub fn new(auth: &Auth) -> Signing {
        match auth.key() {
            None => Signing::None,
            Some(k) => {
                let hk = hkdf::Hkdf::<Sha256>::new(None, k.bytes());
                let mut out = Zeroizing::new([0u8; 32]);
                hk.expand(b"gpu-rdma etcd records v1", out.as_mut())
                    .expect("32 bytes is a valid HKDF length");
                Signing::Key(out)
            }
        }
    }

    fn tag(key: &[u8; 32], etcd_key: &str, value: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).expect("any key length");
        m.update(&(etcd_key.len() as u64).to_le_bytes());
        m.update(etcd_key.as_bytes());
        m.update(value);
        m
    }

    /// `value` as it is written under `etcd_key`.
    pub fn seal(&self, etcd_key: &str, value: Vec<u8>) -> Vec<u8> {
        match self {
            Signing::None => value,
            Signing::Key(k) => {
                let tag = Signing::tag(k, etcd_key, &value).finalize().into_bytes();
                let mut w = Writer::default();
                w.raw(MAGIC).u8(KIND_KEY).bytes(&value).raw(&tag);
                w.0
            }
        }
    }

    /// The value `stored` under `etcd_key` holds, once its proof is checked.
    ///
    /// # Errors
    /// [`Error::Authentication`] for a value without a proof, or whose proof fails (written
    /// by someone without the cluster's key, or moved from another key), or a signed value
    /// read without a key.
    pub fn open<'a>(&self, etcd_key: &str, stored: &'a [u8]) -> Result<&'a [u8]> {
        let refused = |detail: &str| Error::Authentication {
            peer: format!("etcd key {etcd_key}"),
            detail: detail.into(),
        };
        let signed = stored.starts_with(MAGIC);
        let Signing::Key(k) = self else {
            if signed {
                return Err(refused(
                    "a value signed with a cluster key, and this agent has none",
                ));
            }
            return Ok(stored);
        };
        if !signed {
            return Err(refused(
                "a value without the cluster's signature: written by something that is not \
                 an agent of this cluster (or one without authentication)",
            ));
        }
        let mut r = Reader::new(stored);
        r.raw(MAGIC.len())?;
        if r.u8()? != KIND_KEY {
            return Err(refused(
                "a value signed another way than with a cluster key",
            ));
        }
        let value = r.bytes()?;
        let tag = r.raw(32)?;
        r.end()?;
        Signing::tag(k, etcd_key, value)
            .verify_slice(tag)
            .map_err(|_| refused("a signature that does not verify with the cluster's key (forged, or moved from another key)"))?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::ClusterKey;

    fn keyed(b: u8) -> Signing {
        Signing::new(&Auth::ClusterKey(ClusterKey::from_bytes(&[b; 32]).unwrap()))
    }

    #[test]
    fn a_value_opens_only_under_its_key_with_the_clusters_key() {
        let s = keyed(1);
        let v = s.seal("/p/agents/a/agent", b"record".to_vec());
        assert_eq!(s.open("/p/agents/a/agent", &v).unwrap(), b"record");
        for (who, key) in [(&s, "/p/agents/b/agent"), (&keyed(2), "/p/agents/a/agent")] {
            let e = who.open(key, &v).unwrap_err();
            assert!(matches!(e, Error::Authentication { .. }), "{e:?}");
        }
        assert!(s.open("/p/agents/a/agent", b"GRA\0unsigned").is_err());
        assert!(Signing::None.open("/k", &v).is_err());
        assert_eq!(Signing::None.open("/k", b"plain").unwrap(), b"plain");
        let mut flipped = v.clone();
        flipped[12] ^= 1;
        assert!(s.open("/p/agents/a/agent", &flipped).is_err());
    }
}
