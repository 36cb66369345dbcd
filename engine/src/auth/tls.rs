//! Mutual TLS ([`Auth::MutualTls`](super::Auth::MutualTls)): the cluster's CA, this agent's
//! certificate chain and key, loaded once into rustls's client and server configurations
//! (TLS 1.3 only, ring's primitives), and the same key signing etcd values.
//!
//! An agent's certificate names it: its subject alternative names must hold the agent's
//! name as a DNS name (so agent names are DNS names in this mode). A client checks that the
//! server's certificate names the agent it meant to reach; a server checks that the client's
//! names the agent its hello claims, so a notification's sender is the certificate's name.

use crate::error::{Error, Result};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::SigningKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig, SignatureScheme};
use std::path::PathBuf;
use std::sync::Arc;

/// The PEM files of an agent of a cluster with a certificate authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate(s): the only roots trusted.
    pub ca: PathBuf,
    /// This agent's certificate chain (its own first), naming the agent as a DNS name.
    pub cert: PathBuf,
    /// Its private key (PKCS#8, PKCS#1 or SEC1), readable by its owner alone.
    pub key: PathBuf,
}

/// What mutual TLS needs, loaded.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // signing serves etcd values alone
pub(crate) struct Tls {
    pub client: Arc<ClientConfig>,
    pub server: Arc<ServerConfig>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<dyn SigningKey>,
    verifier: Arc<dyn ClientCertVerifier>,
    provider: Arc<CryptoProvider>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

/// The signature schemes this agent signs etcd values with, in its order of preference.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))] // signing serves etcd values alone
const SCHEMES: [SignatureScheme; 5] = [
    SignatureScheme::ED25519,
    SignatureScheme::ECDSA_NISTP256_SHA256,
    SignatureScheme::ECDSA_NISTP384_SHA384,
    SignatureScheme::RSA_PSS_SHA256,
    SignatureScheme::RSA_PKCS1_SHA256,
];

fn settings(what: String) -> Error {
    Error::Settings(what)
}

/// `name` as a DNS name, as certificates name agents: lower case, no trailing dot (DNS
/// compares names without case and ignores a final dot; agent names are compared byte for
/// byte, so only one spelling of each is an agent's).
pub(crate) fn dns_name(name: &str) -> Result<ServerName<'static>> {
    let canonical = name == name.to_ascii_lowercase() && !name.ends_with('.');
    match ServerName::try_from(name.to_owned()) {
        Ok(n @ ServerName::DnsName(_)) if canonical => Ok(n),
        _ => Err(settings(format!(
            "agent name {name:?}: with mutual TLS an agent's name is the DNS name its \
             certificate holds (lower-case letters, digits, '-' and '.', no final '.')"
        ))),
    }
}

/// Refuses unless `cert` is valid for agent `name` and holds it, byte for byte, among its
/// DNS names (no other case, no wildcard).
pub(crate) fn names(cert: &CertificateDer<'_>, name: &str) -> Result<()> {
    let ee = webpki::EndEntityCert::try_from(cert)
        .map_err(|e| settings(format!("a certificate that does not parse: {e}")))?;
    let exact = ee.valid_dns_names().any(|n| n == name);
    ee.verify_is_valid_for_subject_name(&dns_name(name)?)
        .ok()
        .filter(|()| exact)
        .ok_or_else(|| settings(format!("the certificate does not name agent {name:?}")))
}

impl Tls {
    /// Loads `files` for agent `me` (when known), whose certificate must name it.
    ///
    /// # Errors
    /// [`Error::Settings`] naming the file: unreadable, not PEM, a key others can read, a
    /// certificate that does not name `me`, or one the CA did not sign.
    pub fn load(files: &TlsFiles, me: Option<&str>) -> Result<Tls> {
        use std::os::unix::fs::PermissionsExt;
        let fail = |p: &PathBuf, e: String| settings(format!("TLS file {}: {e}", p.display()));
        let certs = |p: &PathBuf| -> Result<Vec<CertificateDer<'static>>> {
            let v = CertificateDer::pem_file_iter(p)
                .and_then(|i| i.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| fail(p, e.to_string()))?;
            if v.is_empty() {
                return Err(fail(p, "no certificate in it".into()));
            }
            Ok(v)
        };
        let mut roots = RootCertStore::empty();
        for c in certs(&files.ca)? {
            roots.add(c).map_err(|e| fail(&files.ca, e.to_string()))?;
        }
        let roots = Arc::new(roots);
        let chain = certs(&files.cert)?;
        let mode = std::fs::metadata(&files.key)
            .map_err(|e| fail(&files.key, e.to_string()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(fail(
                &files.key,
                format!(
                    "mode {:o} lets others read the key; chmod 600 it",
                    mode & 0o777
                ),
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| fail(&files.key, e.to_string()))?;
        // ring, not aws-lc-rs (which needs cmake and a longer build): rustls 0.23.48 marks
        // it deprecated for lacking post-quantum key exchange, which a control channel that
        // carries rkeys (only valid while the agent lives) does not need.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let signing = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| fail(&files.key, e.to_string()))?;
        if let Some(me) = me {
            names(&chain[0], me).map_err(|e| fail(&files.cert, e.to_string()))?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| fail(&files.ca, e.to_string()))?;
        // Our own certificate must pass the check peers make of it.
        verifier
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .map_err(|e| fail(&files.cert, format!("not valid under the CA: {e}")))?;
        let tls13 = [&rustls::version::TLS13];
        let tls_err = |e: rustls::Error| settings(format!("TLS configuration: {e}"));
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&tls13)
            .map_err(tls_err)?
            .with_client_cert_verifier(verifier.clone())
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(tls_err)?;
        server.send_tls13_tickets = 0;
        let server_verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| fail(&files.ca, e.to_string()))?;
        let client = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&tls13)
            .map_err(tls_err)?
            .with_webpki_verifier(server_verifier)
            .with_client_auth_cert(chain.clone(), key)
            .map_err(tls_err)?;
        Ok(Tls {
            client: Arc::new(client),
            server: Arc::new(server),
            chain,
            key: signing,
            verifier,
            provider,
        })
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // signing serves etcd values alone
    /// This agent's certificate chain.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // signing serves etcd values alone
    /// Signs `msg` with this agent's key: the scheme and the signature.
    pub fn sign(&self, msg: &[u8]) -> Result<(u16, Vec<u8>)> {
        let signer = self.key.choose_scheme(&SCHEMES).ok_or_else(|| {
            settings("the TLS key signs with none of Ed25519, ECDSA P-256/P-384, RSA".into())
        })?;
        let sig = signer
            .sign(msg)
            .map_err(|e| settings(format!("signing with the TLS key: {e}")))?;
        Ok((u16::from(signer.scheme()), sig))
    }

    #[cfg_attr(not(feature = "etcd"), allow(dead_code))] // signing serves etcd values alone
    /// Checks that `chain` is valid under the cluster's CA, names agent `name`, and that
    /// its first certificate's key made `sig` over `msg` with `scheme`.
    pub fn verify(
        &self,
        chain: &[CertificateDer<'_>],
        name: &str,
        msg: &[u8],
        scheme: u16,
        sig: &[u8],
    ) -> std::result::Result<(), String> {
        let (ee, rest) = chain.split_first().ok_or("no certificate")?;
        self.verifier
            .verify_client_cert(ee, rest, UnixTime::now())
            .map_err(|e| format!("a certificate the cluster's CA did not sign: {e}"))?;
        names(ee, name).map_err(|_| format!("its certificate does not name agent {name:?}"))?;
        let scheme = SignatureScheme::from(scheme);
        let algs = self
            .provider
            .signature_verification_algorithms
            .mapping
            .iter()
            .find(|(s, _)| *s == scheme)
            .map(|(_, a)| *a)
            .ok_or_else(|| format!("a signature scheme not accepted ({scheme:?})"))?;
        let cert = webpki::EndEntityCert::try_from(ee).map_err(|e| e.to_string())?;
        algs.iter()
            .any(|alg| cert.verify_signature(*alg, msg, sig).is_ok())
            .then_some(())
            .ok_or_else(|| "a signature that does not verify".into())
    }
}
