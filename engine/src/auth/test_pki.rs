//! A cluster CA and agents' certificates for the unit tests of mutual TLS, as PEM files.

use super::TlsFiles;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// A CA that signs agents' certificates into a folder of its own.
pub(crate) struct Ca {
    cert: Certificate,
    key: KeyPair,
    dir: PathBuf,
}

impl Ca {
    pub fn new(tag: &str) -> Ca {
        let dir = std::env::temp_dir().join(format!("gre-pki-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name
            .push(DnType::CommonName, format!("{tag} CA"));
        p.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = p.self_signed(&key).unwrap();
        std::fs::write(dir.join("ca.pem"), cert.pem()).unwrap();
        Ca { cert, key, dir }
    }

    /// The files of an agent whose certificate names `name`.
    pub fn agent(&self, name: &str) -> TlsFiles {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(vec![name.to_string()]).unwrap();
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &self.cert, &self.key).unwrap();
        let (c, k) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        TlsFiles {
            ca: self.dir.join("ca.pem"),
            cert: c,
            key: k,
        }
    }
}
